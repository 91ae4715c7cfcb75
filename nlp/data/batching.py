"""Length-bucketed batches by token budget, from `(source, target)` strings to Keras inputs.

`make_batches` yields `({"source": (B, S) int32, "target_in": (B, T) int32}, target_out (B, T)
int32)` with source = tokens + eos, target_in = bos + tokens, target_out = tokens + eos, padded
with the tokenizer's pad ids (0 in this project's vocabularies; a Marian tokenizer's bos is its
pad id, the decoder start). For a `tf.distribute` strategy, `B` is a multiple of the replicas.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Sequence

import tensorflow as tf

from nlp.text.tokenizer import Tokenizer
from tfx_transformer import checks

__all__ = ["BatchStats", "bucket_boundaries", "count_batches", "make_batches"]


class BatchStats:
    """Counts of examples kept and dropped (over `max_length`) by `make_batches`.

    The counters grow while the batched dataset is iterated and keep growing over epochs; call
    `reset()` to start again.
    """

    def __init__(self):
        self.kept = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="kept")
        self.dropped = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="dropped")

    def reset(self) -> None:
        self.kept.assign(0)
        self.dropped.assign(0)

    def result(self) -> dict[str, int]:
        """`{"kept": int, "dropped": int}` so far."""
        return {"kept": int(self.kept.numpy()), "dropped": int(self.dropped.numpy())}


def bucket_boundaries(max_length: int, min_length: int = 8, step: float = 1.25) -> list[int]:
    """Exclusive upper bounds of the length buckets; the last one is `max_length + 1`."""
    boundaries, bound = [], min_length
    while bound <= max_length:
        boundaries.append(bound)
        bound = max(bound + 1, int(bound * step))
    return boundaries + [max_length + 1]


def make_batches(
    dataset: tf.data.Dataset,
    tokenizer: Tokenizer,
    batch_tokens: int = 4096,
    max_length: int = 128,
    shuffle: bool = True,
    seed: int | None = 0,
    *,
    shuffle_buffer: int = 20_000,
    pad_to_bucket_boundary: bool = False,
    num_replicas: int = 1,
) -> tuple[tf.data.Dataset, BatchStats]:
    """Tokenizes, filters by length and batches `(source, target)` strings by token budget.

    Each batch holds examples of similar length (`bucket_by_sequence_length`) and
    `B * max(S, T) <= batch_tokens` unless a single example is longer than `batch_tokens`.
    Examples whose source (with eos) or target (with bos) exceeds `max_length` tokens are
    dropped and counted in the returned `BatchStats`.

    Args:
        dataset: `(source, target)` scalar tf.string pairs.
        tokenizer: The shared tokenizer.
        batch_tokens: Token budget per batch (padded positions count).
        max_length: Longest allowed `source` / `target_in` / `target_out`, in tokens.
        shuffle: Shuffle the pairs (again every epoch) before batching.
        seed: Shuffle seed; `None` for a non-deterministic order.
        shuffle_buffer: Size of the shuffle buffer.
        pad_to_bucket_boundary: Pad to the bucket's width instead of the batch's longest
            example, so there are few distinct shapes (fewer XLA recompilations).
        num_replicas: The replicas of the `tf.distribute` strategy the batches are for. Every
            batch gets all-pad rows up to a multiple of this many rows, so that it splits
            into equal per-replica batches (Keras needs that of the first batch, and a
            distributed step then weighs every replica alike); the masked loss and accuracy
            ignore those rows. Apart from them the batches, and their number, are those of
            a single device (`batch_tokens` is the budget of the global batch, which may
            exceed it by those `num_replicas - 1` rows at most).

    Returns:
        `(batches, stats)`: batches are `({"source": (B, S) int32, "target_in": (B, T) int32},
        target_out (B, T) int32)`, padded with the pad ids; `stats` counts kept and dropped
        examples.

    Raises:
        ValueError: If `batch_tokens`, `max_length`, `shuffle_buffer` or `num_replicas` is
            invalid.
    """
    checks.positive_int("batch_tokens", batch_tokens)
    checks.integer("max_length", max_length, minimum=2)
    checks.positive_int("shuffle_buffer", shuffle_buffer)
    checks.positive_int("num_replicas", num_replicas)
    stats = BatchStats()
    bos, eos, source_eos = tokenizer.bos_id, tokenizer.eos_id, tokenizer.source_eos_id
    pad = tf.constant(tokenizer.pad_id, tf.int32)
    source_pad = tf.constant(tokenizer.source_pad_id, tf.int32)

    def tokenize(sources, targets):
        # sources, targets: (N,) strings -> ragged (N, None) int32 ids.
        source_ids = tokenizer.tokenize(sources)
        target_ids = tokenizer.tokenize_target(targets)
        n = tf.shape(sources)[0]
        eos_column = tf.fill([n, 1], tf.constant(eos, tf.int32))
        bos_column = tf.fill([n, 1], tf.constant(bos, tf.int32))
        return (
            tf.concat([source_ids, tf.fill([n, 1], tf.constant(source_eos, tf.int32))], axis=1),
            tf.concat([bos_column, target_ids], axis=1),
            tf.concat([target_ids, eos_column], axis=1),
        )

    def fits(source, target_in, target_out):
        keep = tf.logical_and(tf.size(source) <= max_length, tf.size(target_in) <= max_length)
        count = tf.cast(keep, tf.int64)
        with tf.control_dependencies(
            [stats.kept.assign_add(count), stats.dropped.assign_add(1 - count)]
        ):
            return tf.identity(keep)

    boundaries = bucket_boundaries(max_length)
    # Bucket i holds lengths in [boundaries[i-1], boundaries[i]); the last bucket (longer than
    # max_length) stays empty after the filter.
    widths = [bound - 1 for bound in boundaries]
    batch_sizes = [max(1, batch_tokens // width) for width in widths] + [1]

    ds = dataset
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # Tokenize 1024 strings per op call, then split back into examples. Unbatched ragged rows
    # keep a RaggedTensorSpec (ragged_rank 0) that padded_batch rejects; the map makes them
    # plain (n,) tensors.
    ds = ds.batch(1024).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    ds = ds.map(lambda *ids: tuple(tf.identity(x) for x in ids))
    ds = ds.filter(fits)
    ds = ds.bucket_by_sequence_length(
        element_length_func=lambda s, t_in, t_out: tf.maximum(tf.size(s), tf.size(t_in)),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        padding_values=(source_pad, pad, pad),
        pad_to_bucket_boundary=pad_to_bucket_boundary,
    )
    if num_replicas > 1:
        ds = ds.map(lambda *ids: _pad_rows(ids, num_replicas, (source_pad, pad, pad)))
    ds = ds.map(lambda s, t_in, t_out: ({"source": s, "target_in": t_in}, t_out))
    return ds.prefetch(tf.data.AUTOTUNE), stats


def _pad_rows(batches, multiple: int, pads):
    """Appends all-pad rows to each ``(B, L)`` tensor (its own of ``pads``), up to a multiple
    of ``multiple``."""
    rows = tf.shape(batches[0])[0]
    extra = (-rows) % multiple
    return tuple(tf.pad(x, [[0, extra], [0, 0]], constant_values=pad)
                 for x, pad in zip(batches, pads))


def count_batches(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, batch_tokens: int,
                  max_length: int) -> tuple[int, int, int]:
    """``(kept, dropped, batches)`` of `make_batches` over ``pairs``, counted in Python.

    A pair is kept when its source + eos and bos + target fit in ``max_length`` tokens; the
    kept pairs fill length buckets, and each bucket of n pairs gives ceil(n / its batch size)
    batches whatever the order, so the count holds for every shuffled epoch.
    """
    boundaries = bucket_boundaries(max_length)
    sizes = [max(1, batch_tokens // (bound - 1)) for bound in boundaries]
    per_bucket: collections.Counter = collections.Counter()
    for source, target in pairs:
        length = 1 + max(len(tokenizer.encode(source)), len(tokenizer.encode_target(target)))
        if length <= max_length:
            per_bucket[bisect.bisect_right(boundaries, length)] += 1
    kept = sum(per_bucket.values())
    batches = sum(math.ceil(n / sizes[bucket]) for bucket, n in per_bucket.items())
    return kept, len(pairs) - kept, batches
