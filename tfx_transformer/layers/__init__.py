"""The shared Transformer layers: ``keras.ops`` only, so they run under any Keras backend.

Nothing here imports TensorFlow (a test fails on any such import); training plumbing lives in
`tfx_transformer.training`.
"""

# ruff: noqa: F401  (the names are re-exported: `__all__` is `tfx_transformer.LAYER_NAMES`)

from tfx_transformer import LAYER_NAMES
from tfx_transformer.layers.attention import MultiHeadAttention
from tfx_transformer.layers.decoder import TransformerDecoder, TransformerDecoderLayer
from tfx_transformer.layers.deformable_attention import MultiScaleDeformableAttention
from tfx_transformer.layers.dot_product import scaled_dot_product_attention
from tfx_transformer.layers.encoder import TransformerEncoder, TransformerEncoderLayer
from tfx_transformer.layers.feedforward import FeedForward
from tfx_transformer.layers.masks import (
    causal_mask,
    key_padding_mask,
    merge_masks,
    padding_mask,
    to_attention_mask,
)
from tfx_transformer.layers.output import AttentionOutput
from tfx_transformer.layers.position import (
    LearnedPositionEmbedding,
    SinePositionEmbedding2D,
    SinusoidalPositionEncoding,
    add_position,
    sine_features,
)

__all__ = list(LAYER_NAMES)
