"""Keras 3 Transformer layers shared by the translation and detection applications.

- `tfx_transformer.layers`: the layers (``keras.ops`` only, any Keras backend).
- `tfx_transformer.training`: what both trainers share (TensorFlow allowed): strategy,
  precision, time and step bounds, checkpoints, the work directory, the `Trainer`.

The names below are the layers' and the learning-rate schedules'.
"""

from tfx_transformer.layers import (
    AttentionOutput,
    FeedForward,
    LearnedPositionEmbedding,
    MultiHeadAttention,
    SinePositionEmbedding2D,
    SinusoidalPositionEncoding,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    add_position,
    causal_mask,
    key_padding_mask,
    merge_masks,
    padding_mask,
    scaled_dot_product_attention,
    sine_features,
    to_attention_mask,
)
from tfx_transformer.training.schedules import BudgetSchedule, NoamSchedule

__version__ = "0.1.0"

__all__ = [
    "AttentionOutput",
    "BudgetSchedule",
    "FeedForward",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "NoamSchedule",
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
]
