"""Failing a run on purpose: the testing hook of what a killed or NaN run leaves behind.

``TFX_TRANSFORMER_FAULT`` (unset in normal use) names one fault:

- ``step:N``: SIGKILL just before optimizer step N (1-based);
- ``epoch:N``: SIGKILL before the first step of epoch N;
- ``nan:N``: the weights become NaN just before step N, so its loss is NaN;
- ``update:N``: NaN just after step N, as after an update that overflowed (its loss is finite);
- ``export`` or ``evaluate``: SIGKILL when that phase of the run starts.

`FaultHook.from_env()` is the one object the run holds: its `callback` (the Keras callback of
a step fault, or None) goes last in `tfx_transformer.training.callbacks.standard_callbacks`,
and the trainer calls its `at` as each phase starts. Without the variable both do nothing.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import keras

from tfx_transformer.training.callbacks import steps_taken

__all__ = ["FAULT_ENV", "FaultHook"]

FAULT_ENV = "TFX_TRANSFORMER_FAULT"
_PHASES = ("export", "evaluate")
_STEPS = ("step", "epoch", "nan", "update")


@dataclasses.dataclass(frozen=True)
class FaultHook:
    """The fault ``TFX_TRANSFORMER_FAULT`` names (``kind`` None: none)."""

    kind: str | None = None
    step: int | None = None

    @classmethod
    def from_env(cls) -> FaultHook:
        """The hook of this process's environment; an unknown value is a ValueError."""
        value = os.environ.get(FAULT_ENV, "")
        if not value:
            return cls()
        kind, _, step = value.partition(":")
        if kind in _PHASES and not step:
            return cls(kind)
        if kind in _STEPS and step.isdigit() and int(step) > 0:
            return cls(kind, int(step))
        raise ValueError(f"{FAULT_ENV} must be step:N, epoch:N, nan:N, update:N, export or "
                         f"evaluate (a testing hook). Received: {value!r}")

    def callback(self) -> keras.callbacks.Callback | None:
        """The callback of a step, epoch, nan or update fault; None otherwise."""
        return _StepFault(self.kind, self.step) if self.kind in _STEPS else None

    def at(self, phase: str) -> None:
        """SIGKILLs this process if the hook names ``phase`` (``"export"``, ``"evaluate"``)."""
        if self.kind == phase and self.kind in _PHASES:
            os.kill(os.getpid(), signal.SIGKILL)


class _StepFault(keras.callbacks.Callback):
    """``kind`` step, epoch, nan or update at ``step`` (the module docstring)."""

    def __init__(self, kind: str, step: int):
        super().__init__()
        self.kind, self.step, self._epoch = kind, step, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.kind == "epoch":
            if batch == 0 and self._epoch + 1 == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind in ("step", "nan") and steps_taken(self.model) + 1 == self.step:
            if self.kind == "step":
                os.kill(os.getpid(), signal.SIGKILL)
            self._poison()

    def on_train_batch_end(self, batch, logs=None):
        if self.kind == "update" and steps_taken(self.model) == self.step:
            self._poison()

    def _poison(self) -> None:
        for variable in self.model.trainable_variables:
            variable.assign(keras.ops.full(variable.shape, float("nan"), variable.dtype))
