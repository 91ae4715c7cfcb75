"""The learning-rate schedule of "Attention Is All You Need"."""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["NoamSchedule"]


@keras.saving.register_keras_serializable(package="tfx_transformer")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``lr(s) = scale · d_model^-0.5 · min(s^-0.5, s · warmup_steps^-1.5)`` with ``s = step + 1``.

    Keras optimizers call the schedule with ``optimizer.iterations``, which is 0 for the
    first update; the schedule counts that update as step 1, so ``lr(0)`` is the paper's
    first value ``scale · d_model^-0.5 · warmup_steps^-1.5`` (never 0), the peak is at
    ``step = warmup_steps - 1`` and it decays as ``s^-0.5`` after.

    Args:
        d_model: model width.
        warmup_steps: linear warm-up length.
        scale: multiplies the whole schedule.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, scale: float = 1.0):
        if not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(f"`d_model` must be a positive integer. Received: {d_model!r}")
        if not isinstance(warmup_steps, int) or warmup_steps <= 0:
            raise ValueError(
                f"`warmup_steps` must be a positive integer. Received: {warmup_steps!r}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = float(scale)

    def __call__(self, step):
        s = ops.cast(step, "float32") + 1.0
        warm = s * (self.warmup_steps**-1.5)
        decay = ops.rsqrt(s)
        return self.scale * (self.d_model**-0.5) * ops.minimum(decay, warm)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
