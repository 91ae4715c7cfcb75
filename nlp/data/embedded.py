"""Offline English→German corpus generated from `num2words` and `babel`.

The `embedded` data source lets the quick start and the tests train a translator without a
network. The sentences come from the phrase templates of `nlp.data.phrases` (numbers spelled
out, dates formatted, German agreement in the templates).

Generation is deterministic by seed. The split of a pair is a function of its source sentence
only (a hash, independent of the seed), so the `train` and `valid` splits are disjoint for every
pair of seeds and sizes.

Example:

>>> generate_pairs(2, seed=0)  # doctest: +SKIP
[('The meeting is on March 3, 2021.', 'Das Treffen ist am 3. März 2021.'), ...]
"""

from __future__ import annotations

import hashlib
import random

from nlp.data.phrases import TEMPLATES, Pair
from tfx_transformer import checks

__all__ = [
    "DEFAULT_SIZES",
    "SPLITS",
    "VALID_FRACTION",
    "generate_pairs",
    "split_of",
]

SPLITS = ("train", "valid")
# A tiny model trained for ~10 minutes on a CPU sees each training pair a few times.
DEFAULT_SIZES = {"train": 20_000, "valid": 500}
# Share of the source-sentence hash space that belongs to the held-out split.
VALID_FRACTION = 0.05
_HASH_BUCKETS = 10_000


def split_of(source: str) -> str:
    """Returns the split ("train" or "valid") that a source sentence belongs to.

    Args:
        source: An English source sentence.

    Returns:
        "valid" for about `VALID_FRACTION` of all sentences (by a stable hash), else "train".
    """
    digest = hashlib.blake2b(source.encode("utf-8"), digest_size=8).digest()
    bucket = int.from_bytes(digest, "big") % _HASH_BUCKETS
    return "valid" if bucket < VALID_FRACTION * _HASH_BUCKETS else "train"


def generate_pairs(n: int | None = None, seed: int = 0, split: str = "train") -> list[Pair]:
    """Generates distinct English→German sentence pairs of one split.

    The result for a given `(seed, split)` is a prefix of the result for any larger `n`.

    Args:
        n: Number of pairs. Defaults to `DEFAULT_SIZES[split]` (20,000 train, 500 valid).
        seed: Seed of the generator; equal seeds give equal pairs.
        split: "train" or "valid". The two splits never share a source sentence.

    Returns:
        A list of `n` distinct `(english, german)` pairs.

    Raises:
        ValueError: If `split` or `n` is invalid, or the templates cannot produce `n`
            distinct pairs.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
    if n is None:
        n = DEFAULT_SIZES[split]
    checks.non_negative_int("n", n)
    rng = random.Random(seed)
    pairs: list[Pair] = []
    seen: set[str] = set()
    max_attempts = 100 * n / VALID_FRACTION + 1000
    attempts = 0
    while len(pairs) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"Could not generate {n} distinct {split!r} pairs; only {len(pairs)} found. "
                f"Received: n={n}"
            )
        source, target = rng.choice(TEMPLATES)(rng)
        if source in seen or split_of(source) != split:
            continue
        seen.add(source)
        pairs.append((source, target))
    return pairs
