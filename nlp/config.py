"""The translation model's configuration: one frozen dataclass and its named presets."""

from __future__ import annotations

import dataclasses

from nlp.search.decoding import DecodingSettings
from tfx_transformer import checks

__all__ = ["DECODING_FIELDS", "NMTConfig", "PRESETS", "SCHEDULES", "preset"]

SCHEDULES = ("budget", "noam")

# `preset` overrides that go into `NMTConfig.decoding` rather than the config itself.
DECODING_FIELDS = tuple(f.name for f in dataclasses.fields(DecodingSettings))


@dataclasses.dataclass(frozen=True)
class NMTConfig:
    """Hyperparameters of ``Seq2SeqTransformer`` and its training and decoding.

    Defaults are the "base" model of "Attention Is All You Need". Every field is checked on
    construction; a bad value raises ``ValueError`` naming the field and the value.
    """

    name: str = "base"  # the preset this config comes from (`preset` sets it)
    vocab_size: int = 8000  # shared SentencePiece vocabulary (pad 0, unk 1, bos 2, eos 3)
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512  # even (sinusoidal positions) and divisible by num_heads
    num_heads: int = 8
    ffn_dim: int = 2048
    dropout: float = 0.1  # on embeddings+positions, every sub-layer output, attention weights
    activation_dropout: float = 0.0  # inside the FFN: none, as in the paper and fairseq
    max_length: int = 256  # longest tokenized sentence kept for training (longer are dropped)
    max_positions: int = 2048  # longest sequence the position encoding accepts when decoding
    norm_first: bool = False  # post-norm, as in the paper
    tie_embeddings: bool = True  # one matrix for source, target and output embeddings
    label_smoothing: float = 0.1
    # "noam": the paper's schedule, `warmup_steps` then step^-0.5 (the two compared in
    # experiments/README.md); "budget": linear warm-up over
    # `warmup_share` of the run (its --max-steps, epochs or --time-budget), then linear decay
    # to 0 at its end, peaking at the Noam schedule's peak (`peak_learning_rate`).
    schedule: str = "noam"
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # multiplies the Noam schedule (and so the budget schedule's peak)
    # Of the run, for the budget schedule (shares compared in experiments/README.md).
    warmup_share: float = 0.3
    # Per-epoch validation: BLEU/chrF (greedy) of the first `valid_sentences` held-out pairs
    # (0: none, or 100 with `patience`; its cost in steps: experiments/README.md); stop after
    # `patience` epochs without a better val_bleu (None: never) and export the best epoch;
    # export the mean of the last `average_last` epochs (up to the best; None: a quarter of
    # them, at most 10, `tfx_transformer.training.checkpoints.average_count`).
    valid_sentences: int = 0
    patience: int | None = None
    average_last: int | None = None
    batch_tokens: int = 4096  # source+target token budget per batch (padding included)
    # Gradient clipping by the global norm over all gradients (of the global batch), as
    # DETR's `clip_norm`; None: none, as in the paper (an update that overflows ends the run).
    clip_norm: float | None = None
    # beam 4, GNMT length penalty 0.6, at most source length + 50 tokens
    decoding: DecodingSettings = dataclasses.field(default_factory=DecodingSettings)

    def __post_init__(self):
        owner = type(self).__name__
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`{owner}.name` must be a non-empty string. Received: "
                             f"name={self.name!r}")
        checks.integer(f"{owner}.vocab_size", self.vocab_size, minimum=5)  # 4 special ids + 1
        for field in ("num_encoder_layers", "num_decoder_layers", "d_model", "num_heads",
                      "ffn_dim", "max_positions", "warmup_steps", "batch_tokens"):
            checks.positive_int(f"{owner}.{field}", getattr(self, field))
        checks.integer(f"{owner}.max_length", self.max_length, minimum=2)  # eos/bos + a token
        for field in ("dropout", "activation_dropout", "label_smoothing", "warmup_share"):
            checks.fraction(f"{owner}.{field}", getattr(self, field))
        checks.positive_number(f"{owner}.lr_scale", self.lr_scale)
        checks.positive_number(f"{owner}.clip_norm", self.clip_norm, optional=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`{owner}.schedule` must be one of {SCHEDULES}. Received: "
                             f"schedule={self.schedule!r}")
        checks.non_negative_int(f"{owner}.valid_sentences", self.valid_sentences)
        checks.positive_int(f"{owner}.average_last", self.average_last, optional=True)
        checks.positive_int(f"{owner}.patience", self.patience, optional=True)
        checks.boolean(f"{owner}.norm_first", self.norm_first)
        checks.boolean(f"{owner}.tie_embeddings", self.tie_embeddings)
        if not isinstance(self.decoding, DecodingSettings):
            raise TypeError(f"`{owner}.decoding` must be a DecodingSettings. "
                            f"Received: decoding={self.decoding!r}")
        if self.d_model % self.num_heads or self.d_model % 2:
            raise ValueError(
                f"`{owner}.d_model` must be even and divisible by `num_heads`. "
                f"Received: d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.max_length > self.max_positions:
            raise ValueError(
                f"`{owner}.max_length` must be <= `max_positions`. "
                f"Received: max_length={self.max_length}, max_positions={self.max_positions}"
            )

    @property
    def peak_learning_rate(self) -> float:
        """The Noam schedule's peak, ``lr_scale · d_model^-0.5 · warmup_steps^-0.5``: also the
        budget schedule's."""
        return self.lr_scale * self.d_model**-0.5 * self.warmup_steps**-0.5

    def model_kwargs(self) -> dict:
        """The ``Seq2SeqTransformer`` constructor arguments."""
        names = ("vocab_size", "num_encoder_layers", "num_decoder_layers", "d_model",
                 "num_heads", "ffn_dim", "dropout", "activation_dropout", "max_positions",
                 "norm_first", "tie_embeddings")
        return {name: getattr(self, name) for name in names}


# tiny: batch 2,048 tokens (the batch sizes compared by experiments/nmt_real.py are in
# experiments/README.md).
PRESETS = {
    "tiny": dict(num_encoder_layers=2, num_decoder_layers=2, d_model=128, num_heads=4,
                 ffn_dim=512, vocab_size=2000, max_length=64, warmup_steps=1000,
                 lr_scale=2.0, batch_tokens=2048),
    "base": dict(),
    "big": dict(d_model=1024, num_heads=16, ffn_dim=4096, dropout=0.3),
}


def preset(name: str, **overrides) -> NMTConfig:
    """The named preset (``tiny``, ``base``, ``big``) with ``overrides`` applied.

    The config's ``name`` is the preset's. ``overrides`` are ``NMTConfig`` fields, or
    ``beam_size``, ``length_penalty`` and ``extra_length``, which replace those of
    ``decoding`` (of the preset, or of a ``decoding`` override).
    """
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Choose one of {sorted(PRESETS)}.")
    fields = {f.name for f in dataclasses.fields(NMTConfig)}
    unknown = sorted(set(overrides) - fields - set(DECODING_FIELDS))
    if unknown:
        raise ValueError(f"Unknown NMTConfig fields: {unknown}")
    values = {"name": name, **PRESETS[name], **overrides}
    decoding_overrides = {k: values.pop(k) for k in DECODING_FIELDS if k in values}
    if decoding_overrides:
        decoding = values.get("decoding", DecodingSettings())
        values["decoding"] = dataclasses.replace(decoding, **decoding_overrides)
    return NMTConfig(**values)
