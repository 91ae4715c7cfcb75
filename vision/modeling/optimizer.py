"""DETR's optimizer: AdamW with a real per-variable learning rate for the backbone.

Under Adam, scaling a gradient does not change the update (the update is normalized by the
gradient's own running magnitude), so a smaller backbone learning rate has to be a smaller
step size. `DetrAdamW` is one Keras optimizer (one set of slots, one iteration counter, one
global-norm clipping over *all* gradients, saved and restored with the model) whose step for
the variables given to `set_backbone_variables` uses ``learning_rate *
backbone_lr_multiplier``, for both the Adam step and the decoupled weight decay, exactly as
PyTorch's AdamW with two parameter groups in facebookresearch/detr.

The step is PyTorch's: ``w -= lr * m_hat / (sqrt(v_hat) + eps)`` with the bias-corrected
moments. Keras's Adam adds ``eps`` to the uncorrected ``sqrt(v)`` instead, which is PyTorch's
step with ``eps / sqrt(1 - beta_2 ** t)`` (32x larger at the first step, 7x at the 20th):
under DETR's clipping to a global norm of 0.1 many gradients are that small, and their steps
came out up to 4x smaller than DETR's (experiments/README.md, the step parity). The same
step is Keras's with ``eps * sqrt(1 - beta_2 ** t)`` in place of ``eps``, which is how it runs
under TensorFlow: one fused ``ResourceApplyAdam`` kernel per variable
(`tfx_transformer.replicas.apply_adam`).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from tfx_transformer.replicas import (
    GlobalClipAdam,
    adam_scalars,
    apply_adam,
    fused_adam_applies,
    once_per_step,
)

__all__ = ["DetrAdamW", "build_optimizer"]


@keras.saving.register_keras_serializable(package="vision")
class DetrAdamW(GlobalClipAdam):
    """AdamW whose backbone variables use ``backbone_lr_multiplier`` times the learning rate.

    Weight decay is decoupled (``w -= lr_w * weight_decay * w`` before the Adam step, with
    ``lr_w`` the variable's own learning rate) and applies to every variable, as in DETR.

    Args:
        learning_rate: float or ``LearningRateSchedule``: the Transformer's learning rate.
        weight_decay: decoupled weight decay coefficient (0 disables it).
        backbone_lr_multiplier: the backbone's learning rate as a fraction of
            ``learning_rate`` (DETR: 1e-5 / 1e-4 = 0.1).
        beta_1, beta_2, epsilon: Adam's (``epsilon`` defaults to PyTorch's 1e-8).
        global_clipnorm: clip all gradients together to this global norm (DETR: 0.1).
        **kwargs: other ``keras.optimizers.Optimizer`` arguments.

    Call `set_backbone_variables` before the first step (``DETR.compile`` does it).
    """

    def __init__(
        self,
        learning_rate: Any = 1e-4,
        weight_decay: float = 1e-4,
        backbone_lr_multiplier: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        global_clipnorm: float | None = 0.1,
        name: str = "detr_adamw",
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
            global_clipnorm=global_clipnorm, name=name, **kwargs,
        )
        if not weight_decay >= 0:
            raise ValueError(f"`weight_decay` must be >= 0. Received: {weight_decay!r}")
        if not backbone_lr_multiplier >= 0:
            raise ValueError(
                f"`backbone_lr_multiplier` must be >= 0. Received: {backbone_lr_multiplier!r}"
            )
        # Not `self.weight_decay`: the base class would decay every variable with the base
        # learning rate; the decay happens in `update_step` with each variable's own rate.
        self.decoupled_weight_decay = float(weight_decay)
        self.backbone_lr_multiplier = float(backbone_lr_multiplier)
        self._backbone_ids: set[int] | None = None

    @property
    def has_backbone_variables(self) -> bool:
        """Whether `set_backbone_variables` has been called."""
        return self._backbone_ids is not None

    def set_backbone_variables(self, variables: list) -> None:
        """Marks the variables that get the backbone learning rate (before the first step)."""
        if self.built:
            raise ValueError(
                "`set_backbone_variables` must be called before the optimizer is built "
                "(before the first training step)."
            )
        self._backbone_ids = {id(v) for v in variables}

    def build(self, variables):
        super().build(variables)
        ids = self._backbone_ids or set()
        # One multiplier per variable, in the order of `variables`; `update_step` finds a
        # variable's index with `_get_variable_index`, as Keras's own optimizers do.
        self._lr_multipliers = [
            self.backbone_lr_multiplier if id(v) in ids else 1.0 for v in variables
        ]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        multiplier = self._lr_multipliers[index]
        m, v = self._momentums[index], self._velocities[index]
        if fused_adam_applies(self, gradient, variable):
            # PyTorch's step is TensorFlow's fused one with ε·√(1 - β₂ᵗ) for ε (module doc);
            # the scalars are made once per step for all variables of one rate.
            scalars = adam_scalars(self, dtype, learning_rate, multiplier,
                                   corrected_epsilon=True)
            if self.decoupled_weight_decay:
                decay = once_per_step(self, ("decay", dtype, id(learning_rate), multiplier),
                                      lambda: scalars.learning_rate * self.decoupled_weight_decay)
                self.assign_sub(variable, variable * decay)
            apply_adam(variable, m, v, gradient, scalars)
            return
        lr = ops.cast(learning_rate, dtype) * multiplier
        if self.decoupled_weight_decay:
            self.assign_sub(variable, variable * (lr * self.decoupled_weight_decay))
        step = ops.cast(self.iterations + 1, dtype)
        gradient = ops.cast(gradient, dtype)
        self.assign_add(m, (gradient - m) * (1 - self.beta_1))
        self.assign_add(v, (ops.square(gradient) - v) * (1 - self.beta_2))
        if self.amsgrad:
            v_max = self._velocity_hats[index]
            self.assign(v_max, ops.maximum(v_max, v))
            v = v_max
        m_hat = m / (1 - ops.power(ops.cast(self.beta_1, dtype), step))
        v_hat = v / (1 - ops.power(ops.cast(self.beta_2, dtype), step))
        self.assign_sub(variable, lr * m_hat / (ops.sqrt(v_hat) + self.epsilon))

    def get_config(self):
        config = super().get_config()
        config.update(
            weight_decay=self.decoupled_weight_decay,
            backbone_lr_multiplier=self.backbone_lr_multiplier,
        )
        return config


def build_optimizer(config, model, learning_rate: Any = None) -> DetrAdamW:
    """DETR's optimizer for `model`, from a `vision.config.DetrConfig`.

    The backbone's step uses ``learning_rate * config.backbone_lr_multiplier`` at every
    step, so it follows the optimizer's ``learning_rate`` (e.g. DETR's step drop).

    Args:
        config: learning rate, backbone multiplier, weight decay, epsilon and clipping norm
            are read from it (checked by `DetrConfig` itself).
        model: a `vision.modeling.detr.DETR`; its ``backbone_variables`` get the backbone rate.
        learning_rate: the rate or schedule (e.g. DETR's step drop); None:
            ``config.learning_rate``.

    Returns:
        A `DetrAdamW` with the backbone variables set.
    """
    optimizer = DetrAdamW(
        learning_rate=config.learning_rate if learning_rate is None else learning_rate,
        weight_decay=config.weight_decay,
        backbone_lr_multiplier=config.backbone_lr_multiplier,
        epsilon=config.adam_epsilon,
        global_clipnorm=config.clip_norm,
    )
    optimizer.set_backbone_variables(model.backbone_variables)
    return optimizer
