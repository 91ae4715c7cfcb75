"""Learning-rate schedules: the one of "Attention Is All You Need", and one that knows the budget.

`NoamSchedule` warms up for a fixed number of steps and decays as ``step^-0.5`` for ever.
`BudgetSchedule` warms up for a share of the run and decays linearly to zero at its end, the
end being the run's step limit or its time budget, whichever comes first: a run of 8 minutes
gets the whole schedule in 8 minutes, whatever its speed.
"""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer import checks

__all__ = ["BudgetSchedule", "NoamSchedule"]


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
        self.d_model = checks.positive_int("d_model", d_model)
        self.warmup_steps = checks.positive_int("warmup_steps", warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        s = ops.cast(step, "float32") + 1.0
        warm = s * (self.warmup_steps**-1.5)
        decay = ops.rsqrt(s)
        return self.scale * (self.d_model**-0.5) * ops.minimum(decay, warm)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="tfx_transformer")
class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up over a share of the run, then linear decay to zero at its end.

    With ``p`` the share of the run done before the step::

        lr(p) = peak · p / warmup_share                          p <  warmup_share
        lr(p) = peak · (1 - p) / (1 - warmup_share)               warmup_share <= p <= 1

    (0 past the end). ``p = max((step + 1) / total_steps, progress)``: ``step`` is the
    optimizer's iteration (0 for the first update, counted as 1, so the first rate is not 0),
    ``total_steps`` the run's step bound, and ``progress`` a variable the training loop sets
    to the share of a time budget spent (`tfx_transformer.training.bounds.BudgetProgress`; 0 when
    the run has no time budget). Both parts come from state that a resumed run restores (the
    optimizer's iterations; the recorded training time), so a resumed run carries on where it
    stopped, with no second warm-up.

    Args:
        peak: the highest rate, reached at ``p = warmup_share``.
        total_steps: steps the run is bounded by (None: by time only).
        warmup_share: share of the run spent warming up, in [0, 1).
    """

    def __init__(self, peak: float, total_steps: int | None = None, warmup_share: float = 0.1):
        self.peak = checks.positive_number("peak", peak)
        self.total_steps = checks.positive_int("total_steps", total_steps, optional=True)
        self.warmup_share = checks.fraction("warmup_share", warmup_share)
        self.progress = keras.Variable(0.0, dtype="float32", trainable=False,
                                       name="budget_progress")

    def share_done(self, step):
        """``p`` of the step ``step`` (see the class docstring), a float32 scalar."""
        p = ops.cast(self.progress, "float32")
        if self.total_steps is not None:
            p = ops.maximum(p, (ops.cast(step, "float32") + 1.0) / float(self.total_steps))
        return p

    def __call__(self, step):
        p = self.share_done(step)
        if self.warmup_share > 0:
            warm = p / self.warmup_share
        else:
            warm = ops.ones_like(p)
        decay = (1.0 - p) / (1.0 - self.warmup_share)
        return self.peak * ops.clip(ops.minimum(warm, decay), 0.0, 1.0)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps,
                "warmup_share": self.warmup_share}
