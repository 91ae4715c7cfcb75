"""The `tf.distribute` strategy of a run, the multi-worker role of this process, and the
cross-replica sums a loss needs.

TensorFlow is allowed in the training plumbing (this module, `precision`, `workdir`,
`callbacks`, `cli`, `run`, `trainer`), nowhere else in ``tfx_transformer``. This module
imports it only where it is used, so that `num_replicas` and `replica_sum` (called from
``keras.ops`` losses) work under any Keras backend: outside a TensorFlow replica context, and
under another backend, there is one replica and the sum is the identity.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import keras

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["STRATEGIES", "GlobalClipAdam", "OptimizerBuiltFirst", "apply_adam",
           "broadcast_from_chief", "clip_by_global_norm_of_sum", "from_replica_0",
           "fused_adam_applies", "get_strategy", "is_chief", "multi_worker_strategy",
           "num_replicas", "replica_sum", "task_index", "tf_config"]

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
            from tfx_transformer.training.workers import start_peer_watch

            start_peer_watch(config)  # a chief gone while the strategy connects ends this too
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


def _replica_context():
    """The current TensorFlow replica context with more than one replica, else None."""
    if keras.config.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()  # None in a cross-replica context
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    return context


def num_replicas() -> int:
    """Replicas in sync of the current `tf.distribute` replica context (inside a
    distributed train or test step), else 1: outside such a step, with the default strategy,
    and under another Keras backend."""
    context = _replica_context()
    return 1 if context is None else int(context.num_replicas_in_sync)


def replica_sum(x):
    """``x`` summed over the replicas in sync (an all-reduce), inside a `tf.distribute`
    replica context with more than one replica; ``x`` itself everywhere else (`num_replicas`).

    A loss normalized by a count (tokens, boxes) divides each replica's sum by the count
    summed this way, so that the replicas' gradients, which Keras sums, are those of the
    whole global batch. Every replica must call it, in the same order.

    Args:
        x: a tensor, or a structure of tensors (each is summed).
    """
    context = _replica_context()
    if context is None:
        return x
    import tensorflow as tf

    return context.all_reduce(tf.distribute.ReduceOp.SUM, x)


def clip_by_global_norm_of_sum(grads: list, clip_norm: float) -> list:
    """Scales this replica's ``grads`` so that their sum over the replicas has a global norm
    of at most ``clip_norm``: clipping of the global batch's gradients.

    Keras's optimizers clip (``global_clipnorm``) each replica's gradients before they are
    summed, which is not the single-device (nor DETR's) clipping; an optimizer that calls
    this in its ``_clip_gradients`` clips the sum instead, at the cost of one more
    all-reduce of the gradients. With one replica it is ``clip_by_global_norm`` (Keras's
    formula: ``g · clip_norm / max(‖g‖, clip_norm)``, NaN for a non-finite norm).

    Args:
        grads: dense gradient tensors, or None (kept as None).
        clip_norm: the largest global norm, > 0.
    """
    from keras import ops

    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    summed = replica_sum(present)
    norm = ops.sqrt(sum(ops.sum(ops.square(ops.cast(g, "float32"))) for g in summed))
    scale = clip_norm * ops.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = scale + (norm - norm)  # NaN for an infinite or NaN norm, as Keras's clipping
    return [None if g is None else g * ops.cast(scale, g.dtype) for g in grads]


class OptimizerBuiltFirst:
    """`keras.Model` mixin: the optimizer is built before the train step is traced.

    Without a strategy set, Keras's TensorFlow trainer leaves the optimizer to be built inside
    the first trace of the train step; `tf.function` then traces the whole step a second time
    (it must not create variables), which doubles the start-up of every ``fit``. Building it
    first, from the variables that are trainable when ``fit`` starts, traces once.
    """

    def make_train_function(self, force=False):
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super().make_train_function(force)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class GlobalClipAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose ``global_clipnorm`` clips the global batch's gradients.

    With several replicas the norm is that of the gradients summed over them
    (`clip_by_global_norm_of_sum`), so a run clips alike on one device and on many; Keras's
    own Adam clips each replica's share. Same arguments as `keras.optimizers.Adam`.
    """

    def _clip_gradients(self, grads):
        if self.global_clipnorm and num_replicas() > 1:
            return clip_by_global_norm_of_sum(grads, self.global_clipnorm)
        return super()._clip_gradients(grads)

    def update_step(self, gradient, variable, learning_rate):
        """Keras's Adam step; under TensorFlow as its one fused kernel (`apply_adam`)."""
        if not fused_adam_applies(self, gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)
        apply_adam(variable, self._momentums[index], self._velocities[index], gradient,
                   learning_rate, self.beta_1, self.beta_2, self.epsilon, self.iterations + 1)


def fused_adam_applies(optimizer, gradient, variable) -> bool:
    """Whether `apply_adam` can make ``optimizer``'s step: TensorFlow, a dense gradient
    (embedding gradients may come as ``IndexedSlices``), no AMSGrad."""
    if keras.backend.backend() != "tensorflow" or optimizer.amsgrad:
        return False
    import tensorflow as tf

    return not isinstance(gradient, tf.IndexedSlices)


def apply_adam(variable, m, v, gradient, learning_rate, beta_1, beta_2, epsilon, step) -> None:
    """One Adam step of ``variable`` with TensorFlow's fused ``ResourceApplyAdam`` kernel.

    ``m += (g - m)(1 - β₁)``, ``v += (g² - v)(1 - β₂)``, ``w -= lr · √(1 - β₂ᵗ) / (1 - β₁ᵗ) ·
    m / (√v + ε)``: Keras's Adam step, in one multi-threaded pass over the four tensors where
    Keras's own step makes a dozen element-wise passes (a measurable share of a step on a
    CPU: benchmarks/README.md). ``epsilon`` and ``learning_rate`` may be tensors.

    Args:
        variable, m, v: the weight and its two moments (Keras or ``tf.Variable``).
        gradient: the dense gradient.
        learning_rate, beta_1, beta_2, epsilon: the step's hyper-parameters.
        step: the 1-based step number ``t``.
    """
    import tensorflow as tf

    handle = lambda x: (x.value if isinstance(x, keras.Variable) else x).handle  # noqa: E731
    dtype = variable.dtype
    b1, b2, step = (tf.cast(x, dtype) for x in (beta_1, beta_2, step))
    tf.raw_ops.ResourceApplyAdam(
        var=handle(variable), m=handle(m), v=handle(v), beta1_power=tf.pow(b1, step),
        beta2_power=tf.pow(b2, step), lr=tf.cast(learning_rate, dtype), beta1=b1, beta2=b2,
        epsilon=tf.cast(epsilon, dtype), grad=tf.cast(gradient, dtype),
    )


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
