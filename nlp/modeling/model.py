"""The encoder-decoder Transformer of "Attention Is All You Need", from the shared layers."""

from __future__ import annotations

import math

import keras
from keras import ops

import tfx_transformer as tt
from nlp.config import NMTConfig
from nlp.text.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tfx_transformer.replicas import OptimizerBuiltFirst

__all__ = ["Seq2SeqTransformer", "build_model"]


@keras.saving.register_keras_serializable(package="nlp")
class Seq2SeqTransformer(OptimizerBuiltFirst, keras.Model):
    """Token embedding · √d + sinusoidal positions + dropout → encoder → causal decoder → logits.

    With ``tie_embeddings`` one matrix embeds source and target tokens and, transposed,
    projects decoder states to logits. ``pad_id`` marks padding in ``source``.

    The defaults are this project's models; the other settings describe converted models such
    as OPUS-MT's Marian ones (`nlp.pretrained.marian`): their FFN activation, LayerNorm epsilon and
    position layout, separate source and target vocabularies with the output tied to the
    target embedding, a logits bias, and their special ids.

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
        tie_embeddings: one embedding matrix for source, target and output projection
            (needs ``target_vocab_size == vocab_size``).
        target_vocab_size: target vocabulary size (None: ``vocab_size``); a different one
            needs ``tie_embeddings=False``.
        attention_dropout: dropout on attention weights (None: ``dropout``).
        activation: FFN activation.
        layer_norm_epsilon: every LayerNorm's epsilon.
        position_layout: ``"interleaved"`` (the paper's sines and cosines), ``"concat"``
            (sines then cosines) or ``"tensor2tensor"`` (concat with M2M100's frequencies),
            `tfx_transformer.SinusoidalPositionEncoding`.
        position_offset: the position of the first token of source and target (M2M100 /
            NLLB: 2, fairseq's ``padding_idx + 1``).
        scale_embedding: multiply token embeddings by √d.
        tie_output: without ``tie_embeddings``: project with the target embedding
            (transposed) instead of an own ``Dense`` layer.
        output_bias: add a fixed (non-trainable) bias ``(V_target,)`` to the tied
            projection's logits (Marian's ``final_logits_bias``).
        pad_id: the padding id of targets (and of sources, unless ``source_pad_id``).
        source_pad_id: the padding id of sources, with separate vocabularies (None:
            ``pad_id``).
        decoder_start_id: the first decoder input of every translation (bos; Marian: pad).
        eos_id: the end of a sentence.
        banned_ids: ids never generated.
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
        target_vocab_size: int | None = None,
        attention_dropout: float | None = None,
        activation: str = "relu",
        layer_norm_epsilon: float = 1e-5,
        position_layout: str = "interleaved",
        scale_embedding: bool = True,
        tie_output: bool = False,
        output_bias: bool = False,
        pad_id: int = PAD_ID,
        decoder_start_id: int = BOS_ID,
        eos_id: int = EOS_ID,
        banned_ids: tuple[int, ...] | list[int] = (PAD_ID, BOS_ID, UNK_ID),
        source_pad_id: int | None = None,
        position_offset: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(vocab_size, int) or vocab_size < 5:
            raise ValueError(f"`vocab_size` must be an integer >= 5. Received: {vocab_size!r}")
        if target_vocab_size is None:
            target_vocab_size = vocab_size
        if not isinstance(target_vocab_size, int) or target_vocab_size < 3:
            raise ValueError("`target_vocab_size` must be an integer >= 3. Received: "
                             f"{target_vocab_size!r}")
        if tie_embeddings and target_vocab_size != vocab_size:
            raise ValueError(
                "`tie_embeddings` needs one vocabulary. Received: "
                f"vocab_size={vocab_size}, target_vocab_size={target_vocab_size}")
        for name, value in (("pad_id", pad_id), ("decoder_start_id", decoder_start_id),
                            ("eos_id", eos_id), *(("banned_ids", i) for i in banned_ids)):
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not 0 <= value < target_vocab_size:
                raise ValueError(f"`{name}` must be ids of the target vocabulary (< "
                                 f"{target_vocab_size}). Received: {name}={value!r}")
        if source_pad_id is not None and not (
                isinstance(source_pad_id, int) and 0 <= source_pad_id < vocab_size):
            raise ValueError(f"`source_pad_id` must be an id of the source vocabulary (< "
                             f"{vocab_size}). Received: source_pad_id={source_pad_id!r}")
        if eos_id in banned_ids:
            raise ValueError(f"`banned_ids` must not hold `eos_id`. Received: {banned_ids!r}")
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
        self.target_vocab_size = target_vocab_size
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.position_layout = position_layout
        self.scale_embedding = scale_embedding
        self.tie_output = tie_output
        self.output_bias = output_bias
        self.pad_id = pad_id
        self.decoder_start_id = decoder_start_id
        self.eos_id = eos_id
        self.banned_ids = tuple(int(i) for i in banned_ids)
        self.source_pad_id = pad_id if source_pad_id is None else source_pad_id
        self.position_offset = position_offset

        policy = self.dtype_policy
        init = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.embedding = keras.layers.Embedding(
            vocab_size, d_model, embeddings_initializer=init, dtype=policy, name="embedding"
        )
        self.target_embedding = None if tie_embeddings else keras.layers.Embedding(
            target_vocab_size, d_model, embeddings_initializer=init, dtype=policy,
            name="target_embedding",
        )
        self.positions = tt.SinusoidalPositionEncoding(max_positions, layout=position_layout,
                                                       offset=position_offset, dtype=policy)
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy)
        stack = dict(num_heads=num_heads, hidden_dim=ffn_dim, dropout=dropout,
                     attention_dropout=attention_dropout, activation_dropout=activation_dropout,
                     activation=activation, norm_first=norm_first,
                     layer_norm_epsilon=layer_norm_epsilon, dtype=policy)
        self.encoder = tt.TransformerEncoder(num_encoder_layers, name="encoder", **stack)
        self.decoder = tt.TransformerDecoder(num_decoder_layers, name="decoder", **stack)
        self.output_projection = None if tie_embeddings or tie_output else keras.layers.Dense(
            target_vocab_size, dtype=policy, name="output_projection"
        )
        self.logits_bias = None
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
        elif self.output_bias:
            self.logits_bias = self.add_weight(shape=(self.target_vocab_size,),
                                               initializer="zeros", trainable=False,
                                               name="logits_bias")
        self.built = True

    # Building blocks, also used step by step by nlp.search.decoding and nlp.plots.

    def _embed(self, layer, ids, start_index=0, training=None):
        x = layer(ids)
        if self.scale_embedding:
            x = x * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        x = x + self.positions(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def embed_target(self, ids, start_index=0, training=None):
        """Target ids ``(B, T)`` at positions ``start_index...`` → decoder inputs ``(B, T, d)``."""
        layer = self.target_embedding or self.embedding
        return self._embed(layer, ids, start_index=start_index, training=training)

    def encode(self, source, training=None):
        """Encodes ``source`` ``(B, S)``: ``memory`` ``(B, S, d)`` and its mask ``(B, S)``."""
        mask = tt.padding_mask(source, self.source_pad_id)
        x = self._embed(self.embedding, source, training=training)
        return self.encoder(x, padding_mask=mask, training=training), mask

    def project(self, h):
        """Decoder states ``(..., d)`` → float32 logits ``(..., V)``."""
        if self.output_projection is not None:
            return ops.cast(self.output_projection(h), "float32")
        layer = self.target_embedding if self.tie_output else self.embedding
        table = ops.cast(layer.embeddings, h.dtype)  # (V, d)
        # h·tableᵀ as one product that reads the table as stored: an explicit transpose copies
        # the whole (V, d) table at every decoding step. On 2-D operands: TensorFlow's einsum
        # gradient of a broadcast ("...d,vd") materializes (V, d, ...) (out of memory at base
        # size).
        shape = ops.shape(h)
        flat = ops.reshape(h, (-1, shape[-1]))  # (N, d)
        logits = ops.einsum("vd,nd->nv", table, flat)  # (N, V)
        logits = ops.reshape(logits, (*shape[:-1], ops.shape(table)[0]))
        logits = ops.cast(logits, "float32")
        if self.logits_bias is not None:
            logits = logits + ops.cast(self.logits_bias, "float32")
        return logits

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
            cache: self-attention cache ``(L, 2, B, H, T_max, D)``.
            cross_cache: cross-attention keys/values ``(L, 2, B, H, S, D)``.
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
            target_vocab_size=self.target_vocab_size,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
            position_layout=self.position_layout,
            scale_embedding=self.scale_embedding,
            tie_output=self.tie_output,
            output_bias=self.output_bias,
            pad_id=self.pad_id,
            decoder_start_id=self.decoder_start_id,
            eos_id=self.eos_id,
            banned_ids=list(self.banned_ids),
            source_pad_id=None if self.source_pad_id == self.pad_id else self.source_pad_id,
            position_offset=self.position_offset,
        )
        return config


def build_model(config: NMTConfig, vocab_size: int | None = None) -> Seq2SeqTransformer:
    """Builds ``Seq2SeqTransformer`` from ``config`` (``vocab_size`` overrides the config's)."""
    kwargs = config.model_kwargs()
    if vocab_size is not None:
        kwargs["vocab_size"] = vocab_size
    return Seq2SeqTransformer(**kwargs)
