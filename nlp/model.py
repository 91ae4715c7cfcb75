"""The encoder-decoder Transformer of "Attention Is All You Need", from the shared layers."""

from __future__ import annotations

import math

import keras
from keras import ops

import tfx_transformer as tt
from nlp.config import NMTConfig
from nlp.special_ids import PAD_ID
from tfx_transformer.training.distribute import OptimizerBuiltFirst

__all__ = ["Seq2SeqTransformer", "build_model"]


@keras.saving.register_keras_serializable(package="nlp")
class Seq2SeqTransformer(OptimizerBuiltFirst, keras.Model):
    """Token embedding · √d + sinusoidal positions + dropout → encoder → causal decoder → logits.

    With ``tie_embeddings`` one matrix embeds source and target tokens and, transposed,
    projects decoder states to logits. Pad id 0 marks padding in ``source``.

    Args:
        vocab_size: shared vocabulary size ``V``.
        num_encoder_layers, num_decoder_layers: stack depths.
        d_model: model width.
        num_heads: attention heads.
        ffn_dim: feed-forward inner width.
        dropout: dropout on embeddings, sub-layer outputs and attention weights.
        activation_dropout: dropout after the FFN activation.
        max_positions: longest sequence the position encoding accepts.
        norm_first: pre-norm instead of the paper's post-norm.
        tie_embeddings: share the embedding matrix with the output projection.
        **kwargs: base model arguments.

    Call arguments:
        inputs: dict with ``source`` ``(B, S)`` and ``target_in`` ``(B, T)`` int ids (``target_in``
            starts with bos).
        training: enables dropout.

    Returns:
        Logits ``(B, T, V)`` (float32 also under mixed precision).
    """

    def __init__(
        self,
        vocab_size: int,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_model: int = 512,
        num_heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        activation_dropout: float = 0.0,
        max_positions: int = 2048,
        norm_first: bool = False,
        tie_embeddings: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(vocab_size, int) or vocab_size < 5:
            raise ValueError(f"`vocab_size` must be an integer >= 5. Received: {vocab_size!r}")
        self.vocab_size = vocab_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.max_positions = max_positions
        self.norm_first = norm_first
        self.tie_embeddings = tie_embeddings

        policy = self.dtype_policy
        init = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.embedding = keras.layers.Embedding(
            vocab_size, d_model, embeddings_initializer=init, dtype=policy, name="embedding"
        )
        self.target_embedding = None if tie_embeddings else keras.layers.Embedding(
            vocab_size, d_model, embeddings_initializer=init, dtype=policy,
            name="target_embedding",
        )
        self.positions = tt.SinusoidalPositionEncoding(max_positions, dtype=policy)
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy)
        stack = dict(num_heads=num_heads, hidden_dim=ffn_dim, dropout=dropout,
                     activation_dropout=activation_dropout, norm_first=norm_first,
                     dtype=policy)
        self.encoder = tt.TransformerEncoder(num_encoder_layers, name="encoder", **stack)
        self.decoder = tt.TransformerDecoder(num_decoder_layers, name="decoder", **stack)
        self.output_projection = None if tie_embeddings else keras.layers.Dense(
            vocab_size, dtype=policy, name="output_projection"
        )
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        d = self.d_model
        self.embedding.build((None, None))
        if self.target_embedding is not None:
            self.target_embedding.build((None, None))
        self.encoder.build((None, None, d))
        self.decoder.build((None, None, d), (None, None, d))
        if self.output_projection is not None:
            self.output_projection.build((None, None, d))
        self.built = True

    # Building blocks, also used step by step by nlp.decoding and nlp.plots.

    def _embed(self, layer, ids, start_index=0, training=None):
        x = layer(ids) * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        x = x + self.positions(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def embed_target(self, ids, start_index=0, training=None):
        """Target ids ``(B, T)`` at positions ``start_index...`` → decoder inputs ``(B, T, d)``."""
        layer = self.target_embedding or self.embedding
        return self._embed(layer, ids, start_index=start_index, training=training)

    def encode(self, source, training=None):
        """Encodes ``source`` ``(B, S)``: ``memory`` ``(B, S, d)`` and its mask ``(B, S)``."""
        mask = tt.padding_mask(source, PAD_ID)
        x = self._embed(self.embedding, source, training=training)
        return self.encoder(x, padding_mask=mask, training=training), mask

    def project(self, h):
        """Decoder states ``(..., d)`` → float32 logits ``(..., V)``."""
        if self.output_projection is not None:
            return ops.cast(self.output_projection(h), "float32")
        table = ops.cast(self.embedding.embeddings, h.dtype)
        return ops.cast(ops.matmul(h, ops.transpose(table)), "float32")

    def decode(self, target_in, memory, memory_mask, training=None):
        """Full-sequence (teacher-forced) decoding: logits ``(B, T, V)``."""
        y = self.embed_target(target_in, training=training)
        out = self.decoder(y, memory, memory_mask=memory_mask, use_causal_mask=True,
                           training=training)
        return self.project(out.output)

    def decode_step(self, tokens, index, cache, cross_cache, memory_mask):
        """One cached decoding step.

        Args:
            tokens: ``(B, 1)`` ids at position ``index``.
            index: scalar int position.
            cache: self-attention cache ``(B, L, 2, T_max, H, D)``.
            cross_cache: cross-attention keys/values ``(B, L, 2, S, H, D)``.
            memory_mask: ``(B, S)`` source validity.

        Returns:
            Logits ``(B, V)`` (float32) and the updated cache.
        """
        y = self.embed_target(tokens, start_index=index)
        out = self.decoder(y, None, memory_mask=memory_mask, use_causal_mask=True, cache=cache,
                           cache_index=index, cross_attention_cache=cross_cache)
        return self.project(out.output)[:, 0], out.cache

    def cross_attention(self, source, target_in):
        """Cross-attention weights ``(L, B, H, T, S)`` of every decoder layer (no dropout).

        Args:
            source: ``(B, S)`` int ids.
            target_in: ``(B, T)`` int ids starting with bos.
        """
        memory, mask = self.encode(source)
        out = self.decoder(self.embed_target(target_in), memory, memory_mask=mask,
                           use_causal_mask=True, return_cross_attention=True)
        return out.attention

    def call(self, inputs, training=None):
        memory, mask = self.encode(inputs["source"], training=training)
        return self.decode(inputs["target_in"], memory, mask, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            num_encoder_layers=self.num_encoder_layers,
            num_decoder_layers=self.num_decoder_layers,
            d_model=self.d_model,
            num_heads=self.num_heads,
            ffn_dim=self.ffn_dim,
            dropout=self.dropout,
            activation_dropout=self.activation_dropout,
            max_positions=self.max_positions,
            norm_first=self.norm_first,
            tie_embeddings=self.tie_embeddings,
        )
        return config


def build_model(config: NMTConfig, vocab_size: int | None = None) -> Seq2SeqTransformer:
    """Builds ``Seq2SeqTransformer`` from ``config`` (``vocab_size`` overrides the config's)."""
    kwargs = config.model_kwargs()
    if vocab_size is not None:
        kwargs["vocab_size"] = vocab_size
    return Seq2SeqTransformer(**kwargs)
