"""What models, losses and optimizers know of replicas: the sums a loss needs across them,
clipping of the global batch's gradients, and the optimizers a saved model holds.

Below the training plumbing (`tfx_transformer.training`), so that a model, a loss or a
``.keras`` file's optimizer needs none of it. TensorFlow is imported only where it is used:
outside a TensorFlow replica context, and under another Keras backend, there is one replica,
the sum is the identity and Adam's step is Keras's own.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, NamedTuple

import keras

__all__ = ["AdamScalars", "GlobalClipAdam", "OptimizerBuiltFirst", "adam_scalars", "apply_adam",
           "clip_by_global_norm_of_sum", "fused_adam_applies", "num_replicas", "once_per_step",
           "replica_sum"]


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
                   adam_scalars(self, variable.dtype, learning_rate))


def fused_adam_applies(optimizer, gradient, variable) -> bool:
    """Whether `apply_adam` can make ``optimizer``'s step: TensorFlow, a dense gradient
    (embedding gradients may come as ``IndexedSlices``), no AMSGrad."""
    if keras.backend.backend() != "tensorflow" or optimizer.amsgrad:
        return False
    import tensorflow as tf

    return not isinstance(gradient, tf.IndexedSlices)


# (graph, {key: value}) of an optimizer's step being traced: see `once_per_step`.
_STEP_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def once_per_step(optimizer, key, make: Callable[[], Any]) -> Any:
    """``make()``, made once per traced step of ``optimizer`` and ``key``.

    An optimizer's step updates each variable in turn; what every update computes alike (the
    learning rate in the variables' dtype, the powers of the betas) would otherwise be in
    the traced step once per variable: on RT-DETR's 287 variables the Adam step was 8,600
    of the training step's 22,000 graph nodes, each one traced, optimized and run. The value
    is kept for the graph being traced (a branch of a conditional is a graph of its own);
    executing eagerly, it is made every time.
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        return make()
    graph = tf.compat.v1.get_default_graph()
    values = _STEP_VALUES.get(optimizer)
    if values is None or values[0] is not graph:
        values = _STEP_VALUES[optimizer] = (graph, {})
    if key not in values[1]:
        values[1][key] = make()
    return values[1][key]


class AdamScalars(NamedTuple):
    """The scalars of one Adam step in a variable's dtype (`adam_scalars`)."""

    learning_rate: Any
    beta_1: Any
    beta_2: Any
    beta_1_power: Any  # β₁ᵗ
    beta_2_power: Any  # β₂ᵗ
    epsilon: Any


def adam_scalars(optimizer, dtype, learning_rate, multiplier: float = 1.0,
                 corrected_epsilon: bool = False) -> AdamScalars:
    """``optimizer``'s step scalars in ``dtype``, made once per traced step (`once_per_step`).

    Args:
        optimizer: a Keras Adam (its ``beta_1``, ``beta_2``, ``epsilon``, ``iterations``).
        dtype: the variables' dtype.
        learning_rate: the step's learning rate (what Keras passes to ``update_step``).
        multiplier: a factor on the learning rate (a variable group's own rate).
        corrected_epsilon: ``ε·√(1 - β₂ᵗ)`` for ε: PyTorch's step (ε added to the corrected
            ``√v̂``) as TensorFlow's fused one.
    """
    def make():
        import tensorflow as tf

        rate = tf.cast(learning_rate, dtype)
        if multiplier != 1.0:
            rate = rate * multiplier
        beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
        step = tf.cast(optimizer.iterations + 1, dtype)
        beta_2_power = tf.pow(beta_2, step)
        epsilon = tf.cast(optimizer.epsilon, dtype)
        if corrected_epsilon:
            epsilon = epsilon * tf.sqrt(1 - beta_2_power)
        return AdamScalars(rate, beta_1, beta_2, tf.pow(beta_1, step), beta_2_power, epsilon)

    return once_per_step(optimizer, ("adam", dtype, id(learning_rate), multiplier,
                                     corrected_epsilon), make)


def apply_adam(variable, m, v, gradient, scalars: AdamScalars) -> None:
    """One Adam step of ``variable`` with TensorFlow's fused ``ResourceApplyAdam`` kernel.

    ``m += (g - m)(1 - β₁)``, ``v += (g² - v)(1 - β₂)``, ``w -= lr · √(1 - β₂ᵗ) / (1 - β₁ᵗ) ·
    m / (√v + ε)``: Keras's Adam step, in one multi-threaded pass over the four tensors where
    Keras's own step makes a dozen element-wise passes (a measurable share of a step on a
    CPU: experiments/README.md).

    Args:
        variable, m, v: the weight and its two moments (Keras or ``tf.Variable``).
        gradient: the dense gradient.
        scalars: the step's scalars in the variable's dtype (`adam_scalars`).
    """
    import tensorflow as tf

    handle = lambda x: (x.value if isinstance(x, keras.Variable) else x).handle  # noqa: E731
    if gradient.dtype != variable.dtype:
        gradient = tf.cast(gradient, variable.dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=handle(variable), m=handle(m), v=handle(v), beta1_power=scalars.beta_1_power,
        beta2_power=scalars.beta_2_power, lr=scalars.learning_rate, beta1=scalars.beta_1,
        beta2=scalars.beta_2, epsilon=scalars.epsilon, grad=gradient,
    )
