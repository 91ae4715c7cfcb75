"""Keras 3 Transformer layers shared by the translation and detection applications.

- `tfx_transformer.layers`: the layers (``keras.ops`` only, any Keras backend).
- `tfx_transformer.schedules`: learning-rate schedules (Keras ``LearningRateSchedule``s).
- `tfx_transformer.training`: what both trainers share (TensorFlow allowed): the work
  directory, strategy and precision, checkpoints, the `Task` protocol, the `Trainer`.
- `tfx_transformer.cli`: the commands' shared flags and error handling; `tfx_transformer.quiet`
  their quiet start.

Importing it registers every class the project saves with Keras (`tfx_transformer.registry`),
so ``keras.saving.load_model`` reads the project's ``.keras`` files. The names below are the
layers' and the learning-rate schedules'. They are imported on first
use (``tt.MultiHeadAttention``, ``from tfx_transformer import ...``), so that importing this
package loads no TensorFlow: the commands (`tfx_transformer.quiet`) silence
TensorFlow's start-up lines before it is imported.
"""

import importlib

from tfx_transformer.registry import register_lazily

_SCHEDULES = ("BudgetSchedule", "NoamSchedule")
_SUBMODULES = ("layers", "training")

__version__ = "0.1.0"

# The names of `tfx_transformer.layers` (its `__all__`), listed once.
LAYER_NAMES = (
    "AttentionOutput",
    "FeedForward",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "MultiScaleDeformableAttention",
    "SinePositionEmbedding2D",
    "SinusoidalPositionEncoding",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "add_position",
    "causal_mask",
    "key_padding_mask",
    "merge_masks",
    "padding_mask",
    "scaled_dot_product_attention",
    "sine_features",
    "to_attention_mask",
)

__all__ = [*LAYER_NAMES, *_SCHEDULES]

# What `keras.saving.load_model` may meet in a saved file, by the module that registers it.
register_lazily({f"tfx_transformer>{name}": f"tfx_transformer.{module}" for module, names in {
    "layers.attention": ("MultiHeadAttention",),
    "layers.deformable_attention": ("MultiScaleDeformableAttention",),
    "layers.feedforward": ("FeedForward",),
    "layers.position": ("LearnedPositionEmbedding", "SinePositionEmbedding2D",
                        "SinusoidalPositionEncoding"),
    "layers.encoder": ("TransformerEncoder", "TransformerEncoderLayer"),
    "layers.decoder": ("TransformerDecoder", "TransformerDecoderLayer"),
    "schedules": ("BudgetSchedule", "NoamSchedule", "StepDropSchedule"),
    "replicas": ("GlobalClipAdam",),
}.items() for name in names})


def __getattr__(name: str):
    """Imports a layer, a schedule or a subpackage on first use (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"tfx_transformer.{name}")
    if name in __all__:
        module = "schedules" if name in _SCHEDULES else "layers"
        value = getattr(importlib.import_module(f"tfx_transformer.{module}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfx_transformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
