"""Keras 3 Transformer layers shared by the translation and detection applications."""

from tfx_transformer.attention import AttentionOutput, MultiHeadAttention
from tfx_transformer.decoder import TransformerDecoder, TransformerDecoderLayer
from tfx_transformer.dot_product import scaled_dot_product_attention
from tfx_transformer.encoder import TransformerEncoder, TransformerEncoderLayer
from tfx_transformer.feedforward import FeedForward
from tfx_transformer.masks import (
    causal_mask,
    key_padding_mask,
    merge_masks,
    padding_mask,
    to_attention_mask,
)
from tfx_transformer.position import (
    LearnedPositionEmbedding,
    SinePositionEmbedding2D,
    SinusoidalPositionEncoding,
    add_position,
    sine_features,
)
from tfx_transformer.schedules import BudgetSchedule, NoamSchedule

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
