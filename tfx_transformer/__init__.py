"""Keras 3 Transformer layers shared by the translation and detection applications.

- `tfx_transformer.layers`: the layers (``keras.ops`` only, any Keras backend).
- `tfx_transformer.training`: what both trainers share (TensorFlow allowed): strategy,
  precision, time and step bounds, checkpoints, the work directory, the `Trainer`.

Its names are those of `tfx_transformer.layers` and the learning-rate schedules.
"""

from tfx_transformer import layers
from tfx_transformer.layers import *  # noqa: F403  (the names of layers.__all__)
from tfx_transformer.training.schedules import BudgetSchedule, NoamSchedule

__version__ = "0.1.0"

__all__ = [*layers.__all__, "BudgetSchedule", "NoamSchedule"]
