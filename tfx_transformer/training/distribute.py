"""The `tf.distribute` strategy of a run, the multi-worker role of this process, what the
chief hands the other workers, and the run's dtype policy.

This module imports TensorFlow and Keras only where they are used. What a model or a loss
needs of replicas is below it, in `tfx_transformer.replicas`.

The dtype policy (``--mixed-precision``): ``auto`` picks ``bfloat16`` where the hardware
computes it fast, else ``none`` (float32): a GPU of compute capability 8.0 or newer (Ampere,
Hopper: bf16 tensor cores), or a CPU with AMX tiles for bf16 (``amx_bf16`` in
``/proc/cpuinfo``). A CPU with AVX512-BF16 alone only converts and dots pairs of bf16 values;
on it a bf16 train step of our models measured slower than float32
(``experiments/precision.py``), so ``auto`` keeps float32 there.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["MIXED_PRECISION", "STRATEGIES", "broadcast_from_chief", "fast_bfloat16",
           "from_replica_0", "get_strategy", "is_chief", "multi_worker_strategy",
           "resolve_mixed_precision", "set_mixed_precision", "task_index", "tf_config"]

STRATEGIES = ("auto", "mirrored", "multi_worker")

_created: dict[str, Any] = {}  # the MultiWorkerMirroredStrategy of this process, once created


def tf_config() -> dict:
    """The parsed ``TF_CONFIG`` environment variable ({} when unset or not a JSON object).

    Raises:
        ValueError: ``TF_CONFIG`` is not valid JSON.
    """
    raw = os.environ.get("TF_CONFIG") or "{}"
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}). Received: {raw!r}") from None
    return config if isinstance(config, dict) else {}


def _multi_worker_class():
    """`MultiWorkerMirroredStrategy` whose ``reduce`` takes what Keras's ``fit`` gives it.

    Keras 3 calls ``reduce`` in two ways that `MultiWorkerMirroredStrategy` rejects (while
    `MirroredStrategy` accepts them): it builds a distributed model from the first batch
    reduced with one ``reduce("MEAN", batch, axis=None)`` over the whole ``(inputs, targets)``
    structure ("Attempt to convert a value ({'source': PerReplica: ...})"), and it averages
    each step's scalar logs with ``reduce("MEAN", value, axis=0)`` ("Invalid reduction
    dimension 0 for input with 0 dimensions"). This subclass reduces each value of a
    structure on its own (the same collectives in the same order on every worker), and a
    scalar over the replicas only (``axis=None``), which is what the caller means.
    """
    import tensorflow as tf

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            if tf.nest.is_nested(value):
                return tf.nest.map_structure(lambda v: self.reduce(reduce_op, v, axis), value)
            if axis is not None and all(
                    getattr(v, "shape", None) is not None and v.shape.rank == 0
                    for v in self.experimental_local_results(value)):
                axis = None  # a scalar has no batch axis to reduce over
            return super().reduce(reduce_op, value, axis)

    return MultiWorkerMirroredStrategy


def get_strategy(name: str) -> tf.distribute.Strategy:
    """Returns the `tf.distribute` strategy for ``--strategy NAME``.

    ``auto``: `MirroredStrategy` when more than one GPU is visible, else the default strategy.
    ``mirrored``: `MirroredStrategy` over all GPUs, or over all logical CPU devices when there
    is no GPU (that is how tests run it on two logical CPUs). ``multi_worker``:
    `MultiWorkerMirroredStrategy` from ``TF_CONFIG`` (one whose ``reduce`` also takes the
    nested batches Keras reduces); create it first thing in the program. It is created once
    per process: a second call returns the same strategy (`multi_worker_strategy`).

    Raises:
        ValueError: unknown ``name``, or ``multi_worker`` without a valid ``TF_CONFIG``.
    """
    import tensorflow as tf

    if name == "auto":
        if len(tf.config.list_physical_devices("GPU")) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    if name == "multi_worker":
        config = tf_config()
        if not config.get("cluster") or not config.get("task"):
            raise ValueError(
                "`--strategy multi_worker` needs TF_CONFIG with 'cluster' and 'task'. "
                f"Received: TF_CONFIG={os.environ.get('TF_CONFIG')!r}"
            )
        if "multi_worker" not in _created:
            _created["multi_worker"] = _multi_worker_class()()
        return _created["multi_worker"]
    raise ValueError(f"`--strategy` must be one of {STRATEGIES}. Received: strategy={name!r}")


def multi_worker_strategy() -> tf.distribute.Strategy | None:
    """The `MultiWorkerMirroredStrategy` `get_strategy` created in this process, or None."""
    return _created.get("multi_worker")


def task_index() -> int:
    """This process's ``TF_CONFIG`` task index (0 without ``TF_CONFIG``)."""
    return int((tf_config().get("task") or {}).get("index", 0))


def is_chief() -> bool:
    """True unless ``TF_CONFIG`` names this process a non-chief worker (who must not write)."""
    config = tf_config()
    task = config.get("task") or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in (None, "chief"):
        return True
    return kind == "worker" and index == 0 and "chief" not in (config.get("cluster") or {})


def broadcast_from_chief(payload: bytes | None,
                         strategy: tf.distribute.Strategy | None = None) -> bytes:
    """The chief's ``payload`` on every worker of a multi-worker run (a collective).

    Every worker calls it at the same point; the chief (the worker holding replica 0) passes
    its bytes, the others ``None`` (what they pass is ignored) and wait until the chief's
    call. Without more than one worker, ``payload`` is returned as it is.

    Args:
        payload: the chief's bytes (b"" is sent as is; a caller may use it to say that the
            chief failed, so that the others do not wait for ever).
        strategy: the strategy of the run; default `multi_worker_strategy`.

    Raises:
        ValueError: ``payload`` is None and there is no other worker to receive it from.
    """
    strategy = strategy if strategy is not None else multi_worker_strategy()
    if strategy is None or strategy.num_replicas_in_sync <= len(
            strategy.extended.worker_devices):  # the replicas are all in this process
        if payload is None:
            raise ValueError("`payload` is None, and there is no chief to receive it from")
        return bytes(payload)
    import numpy as np

    length = int(from_replica_0(np.array([len(payload or b"")], np.int64), strategy)[0])
    if payload is not None and len(payload) == length:  # one int32 per byte: collectives
        data = np.frombuffer(bytes(payload), np.uint8).astype(np.int32)  # have no uint8
    else:
        data = np.zeros([length], np.int32)
    return from_replica_0(data, strategy).astype(np.uint8).tobytes()


def from_replica_0(local, strategy: tf.distribute.Strategy):
    """Replica 0's (the chief's) numpy array ``local`` on every worker (a collective: a sum in
    which every other replica gives zeros, so the chief's values arrive exactly). Every
    worker passes an array of the same shape and dtype (int32, int64 or a float type)."""
    import numpy as np
    import tensorflow as tf

    zeros = np.zeros_like(local)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(local if context.replica_id_in_sync_group == 0 else zeros))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None).numpy()


# ``--mixed-precision`` value -> Keras dtype policy name (``auto``: resolved first).
MIXED_PRECISION = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16",
                   "auto": None}


def _cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def fast_bfloat16(cpu_flags: set[str] | None = None, gpus: list[dict] | None = None) -> str | None:
    """Why bf16 is fast here (``"GPU compute capability 9.0"``, ``"CPU amx_bf16"``), or None.

    Args:
        cpu_flags: the CPU's flags (default: read from ``/proc/cpuinfo``).
        gpus: device details of the visible GPUs, each with ``compute_capability`` as a
            ``(major, minor)`` pair (default: asked of TensorFlow, when it is loaded).
    """
    if gpus is None:
        gpus = []
        if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
            import tensorflow as tf

            gpus = [tf.config.experimental.get_device_details(d)
                    for d in tf.config.list_physical_devices("GPU")]
    for details in gpus:
        capability = tuple(details.get("compute_capability") or (0, 0))
        if capability >= (8, 0):
            return f"GPU compute capability {capability[0]}.{capability[1]}"
    if gpus:
        return None  # the GPU computes; an older one has no bf16 tensor cores
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    return "CPU amx_bf16" if "amx_bf16" in flags else None


def resolve_mixed_precision(name: str, **detect) -> str:
    """``name`` with ``auto`` replaced: ``bfloat16`` where `fast_bfloat16`, else ``none``.

    Raises:
        ValueError: unknown ``name``.
    """
    if name not in MIXED_PRECISION:
        raise ValueError(
            f"`--mixed-precision` must be one of {tuple(MIXED_PRECISION)}. Received: {name!r}"
        )
    if name != "auto":
        return name
    return "bfloat16" if fast_bfloat16(**detect) else "none"


def set_mixed_precision(name: str) -> str:
    """Sets the global Keras dtype policy for ``--mixed-precision none|bfloat16|float16|auto``.

    Returns:
        The policy name set: ``float32``, ``mixed_bfloat16`` or ``mixed_float16``.

    Raises:
        ValueError: unknown ``name``.
    """
    import keras

    policy = MIXED_PRECISION[resolve_mixed_precision(name)]
    keras.config.set_dtype_policy(policy)
    return policy
