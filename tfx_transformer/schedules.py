"""Learning-rate schedules: the one of "Attention Is All You Need", and one that knows the budget.

`NoamSchedule` warms up for a fixed number of steps and decays as ``step^-0.5`` for ever.
`BudgetSchedule` warms up for a share of the run and decays linearly to zero at its end, the
end being the run's step limit or its time budget, whichever comes first: a run of 8 minutes
gets the whole schedule in 8 minutes, whatever its speed. `StepDropSchedule` is DETR's drop
to a tenth, by epoch or by the share of the run done. Both are `RunSchedule`s: the trainer
tells them where the run is (`tfx_transformer.training.callbacks.ScheduleProgress`).
"""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer import checks

__all__ = ["BudgetSchedule", "NoamSchedule", "RunSchedule", "StepDropSchedule"]


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


class RunSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule that knows where the run is: the share of it done, and the epoch.

    ``share_done(step) = max((step + 1) / total_steps, progress)``: ``step`` is the
    optimizer's iteration (0 for the first update, counted as 1), ``total_steps`` the run's
    step bound (None: not bounded by steps), and ``progress`` a variable the trainer sets
    before every step to the share of the run's time budget spent, counting the training time
    of every process of the run (`tfx_transformer.training.callbacks.ScheduleProgress`; 0 without
    a time budget). ``epoch`` is a variable it sets at every epoch's start (0-based, counting
    the epochs of earlier processes). Both come from state that a resumed run restores, so it
    carries on where it stopped.

    Args:
        total_steps: steps the run is bounded by (None: by time or epochs only).
    """

    def __init__(self, total_steps: int | None = None):
        self.total_steps = checks.positive_int("total_steps", total_steps, optional=True)
        self.progress = keras.Variable(0.0, dtype="float32", trainable=False,
                                       name="run_progress")
        self.epoch = keras.Variable(0, dtype="int32", trainable=False, name="run_epoch")

    def share_done(self, step):
        """The share of the run done at the step ``step``, a float32 scalar."""
        p = ops.cast(self.progress, "float32")
        if self.total_steps is not None:
            p = ops.maximum(p, (ops.cast(step, "float32") + 1.0) / float(self.total_steps))
        return p


@keras.saving.register_keras_serializable(package="tfx_transformer")
class BudgetSchedule(RunSchedule):
    """Linear warm-up over a share of the run, then linear decay to zero at its end.

    With ``p`` = `RunSchedule.share_done` of the step::

        lr(p) = peak · p / warmup_share                          p <  warmup_share
        lr(p) = peak · (1 - p) / (1 - warmup_share)               warmup_share <= p <= 1

    (0 past the end), so a resumed run carries on where it stopped, with no second warm-up.

    Args:
        peak: the highest rate, reached at ``p = warmup_share``.
        total_steps: steps the run is bounded by (None: by time only).
        warmup_share: share of the run spent warming up, in [0, 1).
    """

    def __init__(self, peak: float, total_steps: int | None = None, warmup_share: float = 0.1):
        self.peak = checks.positive_number("peak", peak)
        self.warmup_share = checks.fraction("warmup_share", warmup_share)
        super().__init__(total_steps)

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


@keras.saving.register_keras_serializable(package="tfx_transformer")
class StepDropSchedule(RunSchedule):
    """DETR's step decay: ``learning_rate`` until the drop, then ``factor`` times it.

    The drop comes at epoch ``drop_epoch`` (0-based; DETR's ``lr_drop``) or, for a run bounded
    by steps or time, once ``drop_fraction`` of the run is done (`RunSchedule.share_done`),
    whichever is first: such runs stop long before ``drop_epoch``.

    Args:
        learning_rate: the rate before the drop, > 0.
        drop_epoch: the epoch from which the rate is dropped.
        drop_fraction: share of the run after which it is dropped, in (0, 1]; None: by
            epoch only.
        total_steps: steps the run is bounded by (None: by time or epochs only).
        factor: the rate after the drop, as a share of ``learning_rate``.
    """

    def __init__(self, learning_rate: float, drop_epoch: int, drop_fraction: float | None = None,
                 total_steps: int | None = None, factor: float = 0.1):
        self.learning_rate = checks.positive_number("learning_rate", learning_rate)
        self.drop_epoch = checks.non_negative_int("drop_epoch", drop_epoch)
        self.drop_fraction = checks.fraction("drop_fraction", drop_fraction, interval="(]",
                                             optional=True)
        self.factor = checks.positive_number("factor", factor)
        super().__init__(total_steps)

    def __call__(self, step):
        dropped = ops.greater_equal(self.epoch, self.drop_epoch)
        if self.drop_fraction is not None:
            dropped = ops.logical_or(dropped, self.share_done(step) >= self.drop_fraction)
        return ops.where(dropped, self.learning_rate * self.factor, self.learning_rate)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "drop_epoch": self.drop_epoch,
                "drop_fraction": self.drop_fraction, "total_steps": self.total_steps,
                "factor": self.factor}
