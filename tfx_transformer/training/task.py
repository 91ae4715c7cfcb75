"""The protocol an application implements for `tfx_transformer.training.trainer.Trainer`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import keras

if TYPE_CHECKING:
    from tfx_transformer.training.trainer import Trainer

__all__ = ["Task", "TaskData"]


@dataclasses.dataclass(frozen=True)
class TaskData:
    """What `Task.load_data` returns.

    Attributes:
        train: the training batches (a `tf.data.Dataset`).
        valid: validation batches for `fit`, or None.
        steps_per_epoch: training batches per epoch when known (None: unknown).
    """

    train: Any
    valid: Any = None
    steps_per_epoch: int | None = None


class Task(Protocol):
    """An application, as `Trainer.fit` drives it (see the module docstring).

    `final_weights` is optional: without it the last weights are exported; ``averaging``
    too: without it, the last epoch's checkpoint alone is kept.
    """

    data: str
    default_epochs: int
    state_files: tuple[str, ...]

    def load_data(self, trainer: Trainer) -> TaskData: ...

    def build_model(self, trainer: Trainer, data: TaskData) -> keras.Model: ...

    def callbacks(self, trainer: Trainer, model: keras.Model
                  ) -> Iterable[keras.callbacks.Callback]: ...

    def export(self, model: keras.Model, path: Path) -> None: ...

    def evaluate(self, model: keras.Model) -> Mapping[str, Any]: ...
