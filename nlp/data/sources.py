"""Translation data sources: the `--data` specs and their splits as sentence pairs.

Data specs:

- `embedded`: the offline English→German corpus of `nlp.data.embedded`.
- `tsv:PATH`: a UTF-8 file of `source<TAB>target` lines. A deterministic `valid_fraction` of the
  distinct source sentences is held out (chosen by a hash of the sentence, so the same file
  always gives the same split and a repeated source never straddles both splits).
- `tfds:NAME`: a TensorFlow Datasets translation dataset, e.g. `tfds:ted_hrlr_translate/pt_to_en`
  or `tfds:wmt14_translate/de-en`; (source, target) follow the builder's supervised keys.

Splits are "train", "valid" and "all" (train followed by valid). `nlp.data.batching` turns the
pairs into batches for Keras `fit`.
"""

from __future__ import annotations

import hashlib
import math
import os

import tensorflow as tf

from nlp.data import embedded
from tfx_transformer import checks, data_spec
from tfx_transformer.data_spec import DataSpec

__all__ = [
    "SCHEMES",
    "SPLITS",
    "evaluation_split",
    "load_dataset",
    "load_pairs",
    "parse_data_spec",
    "read_tsv",
    "split_pairs",
]

SCHEMES = {"embedded": (), "tsv": ("PATH",), "tfds": ("NAME",)}  # scheme -> its parts
SPLITS = ("train", "valid", "all")

Pair = tuple[str, str]


def parse_data_spec(spec: str) -> DataSpec:
    """Splits a `--data` spec: "embedded", "tsv:PATH" or "tfds:NAME".

    Returns:
        `(scheme, parts)`: `("embedded", ())`, `("tsv", (path,))` or `("tfds", (name,))`.

    Raises:
        ValueError: For an unknown scheme or a missing argument (naming `--data` and `spec`).
    """
    return data_spec.parse_data_spec(spec, SCHEMES)


def evaluation_split(spec: str) -> str:
    """The split evaluation scores: every pair of a `tsv:` file, else the held-out split."""
    return "all" if parse_data_spec(spec)[0] == "tsv" else "valid"


def read_tsv(path: str | os.PathLike) -> list[Pair]:
    """Reads `source<TAB>target` lines of a UTF-8 file.

    Blank lines are skipped; columns after the second (e.g. attributions in Tatoeba exports) are
    ignored; both sides are stripped of surrounding whitespace.

    Args:
        path: The file.

    Returns:
        The `(source, target)` pairs in file order.

    Raises:
        ValueError: If the path is missing or a directory, the file holds no pair (empty or
            blank lines only), or a line is not UTF-8, has no tab or an empty side; the message
            names the file (and the line number).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"TSV file {path} is a directory, not a file of source<TAB>target "
                         "lines.")
    if not os.path.isfile(path):
        raise ValueError(f"TSV file not found. Received: path={path!r}")
    with open(path, "rb") as f:
        data = f.read()
    pairs = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{number}: line is not valid UTF-8 ({error.reason})."
            ) from None
        if number == 1:
            line = line.lstrip("\ufeff")  # byte order mark
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        if len(fields) < 2:
            raise ValueError(
                f"{path}:{number}: expected 'source<TAB>target', found no tab: {line[:80]!r}"
            )
        source, target = fields[0].strip(), fields[1].strip()
        if not source or not target:
            side = "source" if not source else "target"
            raise ValueError(f"{path}:{number}: empty {side} in {line[:80]!r}")
        pairs.append((source, target))
    if not pairs:
        what = "is empty (0 bytes)" if not data else "has only blank lines"
        raise ValueError(f"TSV file {path} {what}: no source<TAB>target line.")
    return pairs


def _source_hash(source: str) -> int:
    return int.from_bytes(hashlib.blake2b(source.encode("utf-8"), digest_size=8).digest(), "big")


def split_pairs(pairs: list[Pair], valid_fraction: float = 0.05) -> tuple[list[Pair], list[Pair]]:
    """Holds out a deterministic share of the distinct source sentences.

    The `ceil(valid_fraction * distinct sources)` sources with the smallest hash (at least one
    when `valid_fraction > 0`, never all of them) go to the held-out split with all their pairs.

    Args:
        pairs: `(source, target)` pairs.
        valid_fraction: Share of distinct sources to hold out, in `[0, 1)`.

    Returns:
        `(train, valid)`, each in the order of `pairs`.
    """
    checks.fraction("valid_fraction", valid_fraction)
    sources = sorted({source for source, _ in pairs}, key=lambda s: (_source_hash(s), s))
    count = min(math.ceil(valid_fraction * len(sources)), len(sources) - 1)
    held_out = set(sources[: max(count, 0)])
    train = [pair for pair in pairs if pair[0] not in held_out]
    valid = [pair for pair in pairs if pair[0] in held_out]
    return train, valid


def _check_split_and_limit(split: str, limit: int | None) -> None:
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
    checks.non_negative_int("limit", limit, optional=True)


def _pairs_to_dataset(pairs: list[Pair]) -> tf.data.Dataset:
    sources = tf.constant([s for s, _ in pairs], dtype=tf.string, shape=[len(pairs)])
    targets = tf.constant([t for _, t in pairs], dtype=tf.string, shape=[len(pairs)])
    return tf.data.Dataset.from_tensor_slices((sources, targets))


def _tfds_dataset(name: str, split: str, data_dir: str | None) -> tf.data.Dataset:
    import tensorflow_datasets as tfds  # Heavy import, only for `tfds:` data.

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        # Its own message lists every dataset TFDS knows: thousands of lines.
        raise ValueError(
            f"TensorFlow Datasets has no dataset {name!r}. Received: --data 'tfds:{name}'"
        ) from None
    keys = builder.info.supervised_keys
    if not keys:
        languages = getattr(builder.info.features, "languages", None)
        if not languages or len(languages) != 2:
            raise ValueError(f"`tfds:{name}` has neither supervised keys nor two languages.")
        keys = tuple(languages)
    source_key, target_key = keys
    available = set(builder.info.splits.keys())
    # Held-out split: "validation", or "test" for builders without one.
    held_out = "test" if "validation" not in available and "test" in available else "validation"
    names = {"train": ["train"], "valid": [held_out], "all": ["train", held_out]}[split]
    result = None
    for tfds_split in names:
        ds = tfds.load(name, split=tfds_split, data_dir=data_dir)
        ds = ds.map(lambda example: (example[source_key], example[target_key]))
        result = ds if result is None else result.concatenate(ds)
    return result


def load_dataset(
    spec: str,
    split: str = "train",
    *,
    valid_fraction: float = 0.05,
    seed: int = 0,
    limit: int | None = None,
    data_dir: str | None = None,
) -> tf.data.Dataset:
    """A dataset of `(source, target)` scalar tf.string pairs of one split.

    Args:
        spec: "embedded", "tsv:PATH" or "tfds:NAME".
        split: "train", "valid" or "all".
        valid_fraction: Held-out share of a `tsv:` file.
        seed: Generator seed of `embedded` (its split never depends on it).
        limit: Keep at most this many pairs (the first ones; `embedded` generates no more).
        data_dir: TensorFlow Datasets directory for `tfds:`.

    Returns:
        A `tf.data.Dataset` of `(source, target)` strings.

    Raises:
        ValueError: For a bad spec, split, file or argument.
    """
    scheme, parts = parse_data_spec(spec)
    _check_split_and_limit(split, limit)
    if scheme == "tfds":
        ds = _tfds_dataset(parts[0], split, data_dir)
        return ds if limit is None else ds.take(limit)
    return _pairs_to_dataset(
        load_pairs(spec, split, valid_fraction=valid_fraction, seed=seed, limit=limit)
    )


def load_pairs(
    spec: str,
    split: str = "train",
    *,
    valid_fraction: float = 0.05,
    seed: int = 0,
    limit: int | None = None,
    data_dir: str | None = None,
) -> list[Pair]:
    """Like `load_dataset`, but returns a Python list of `(source, target)` strings."""
    scheme, parts = parse_data_spec(spec)
    _check_split_and_limit(split, limit)
    if scheme == "tfds":
        ds = load_dataset(spec, split, limit=limit, data_dir=data_dir)
        return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in ds.as_numpy_iterator()]
    if scheme == "embedded":
        splits = ["train", "valid"] if split == "all" else [split]
        pairs = [p for name in splits for p in embedded.generate_pairs(limit, seed, name)]
    else:
        train, valid = split_pairs(read_tsv(parts[0]), valid_fraction)
        pairs = {"train": train, "valid": valid, "all": train + valid}[split]
    return pairs if limit is None else pairs[:limit]
