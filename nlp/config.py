"""The translation model's configuration: one frozen dataclass and its named presets."""

from __future__ import annotations

import dataclasses

__all__ = ["NMTConfig", "PRESETS", "preset"]


@dataclasses.dataclass(frozen=True)
class NMTConfig:
    """Hyperparameters of ``Seq2SeqTransformer`` and its training and decoding.

    Defaults are the "base" model of "Attention Is All You Need".
    """

    vocab_size: int = 8000  # shared SentencePiece vocabulary (pad 0, unk 1, bos 2, eos 3)
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512
    num_heads: int = 8
    ffn_dim: int = 2048
    dropout: float = 0.1  # on embeddings+positions, every sub-layer output, attention weights
    activation_dropout: float = 0.0  # inside the FFN: none, as in the paper and fairseq
    max_length: int = 256  # longest tokenized sentence kept for training (longer are dropped)
    max_positions: int = 2048  # longest sequence the position encoding accepts when decoding
    norm_first: bool = False  # post-norm, as in the paper
    tie_embeddings: bool = True  # one matrix for source, target and output embeddings
    label_smoothing: float = 0.1
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # multiplies the Noam schedule
    batch_tokens: int = 4096  # source+target token budget per batch (padding included)
    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT alpha: score = log p / ((5 + len) / 6) ** alpha
    extra_decode_length: int = 50  # decode at most source length + this many tokens

    def model_kwargs(self) -> dict:
        """The ``Seq2SeqTransformer`` constructor arguments."""
        names = ("vocab_size", "num_encoder_layers", "num_decoder_layers", "d_model",
                 "num_heads", "ffn_dim", "dropout", "activation_dropout", "max_positions",
                 "norm_first", "tie_embeddings")
        return {name: getattr(self, name) for name in names}


PRESETS = {
    "tiny": dict(num_encoder_layers=2, num_decoder_layers=2, d_model=128, num_heads=4,
                 ffn_dim=512, vocab_size=2000, max_length=64, warmup_steps=1000,
                 lr_scale=2.0, batch_tokens=4096),
    "base": dict(),
    "big": dict(d_model=1024, num_heads=16, ffn_dim=4096, dropout=0.3),
}


def preset(name: str, **overrides) -> NMTConfig:
    """The named preset (``tiny``, ``base``, ``big``) with ``overrides`` applied."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Choose one of {sorted(PRESETS)}.")
    fields = {f.name for f in dataclasses.fields(NMTConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"Unknown NMTConfig fields: {unknown}")
    return NMTConfig(**{**PRESETS[name], **overrides})
