"""The detector's one configuration: a frozen dataclass with named presets.

``r50-detr`` holds the numbers of facebookresearch/detr (``main.py`` defaults and the paper),
``r50`` the same with the convergence aids.
``tiny-detr`` is vanilla DETR at the size of the reference CPU run of facebookresearch/detr
(experiments/README.md), and ``tiny`` the same size with the convergence aids that let it learn
in minutes on a CPU (two-stage queries, box refinement, local cross-attention; see
`PRESETS`). The number of classes is not here: it comes from the data
(``build_model(config, num_classes)``).

Every field is checked once, in ``__post_init__`` (also after `preset` overrides); errors
name the field and the value.

Example:
    >>> config = preset("tiny", num_queries=10)
    >>> config.hidden_dim
    128
"""

from __future__ import annotations

import dataclasses

from tfx_transformer import checks
from vision.matching.assignment import SOLVERS
from vision.modeling.backbone import BACKBONES, TINY_NORMS
from vision.modeling.queries import query_layer_class
from vision.modeling.refinement import make_box_decoding
from vision.pretrained.dfine_config import ARCHITECTURES as DFINE_ARCHITECTURES
from vision.pretrained.rtdetr_config import ARCHITECTURES as RTDETR_ARCHITECTURES

__all__ = ["ARCHITECTURES", "AUGMENTATIONS", "DetrConfig", "PRESETS", "preset"]

ARCHITECTURES = ("detr", "rtdetr")

# The training images' augmentations (`vision.data.batching.make_batches`).
AUGMENTATIONS = ("detr", "flip", "none")

# The `DETR` constructor arguments that come from the config (`model_kwargs`).
_MODEL_FIELDS = ("hidden_dim", "num_heads", "num_encoder_layers", "num_decoder_layers",
                 "ffn_dim", "dropout", "num_queries", "norm_first", "query_type",
                 "attention_radius", "box_refinement", "look_forward_twice",
                 "one_to_many_queries", "denoising_groups", "denoising_label_noise",
                 "denoising_box_noise")
_POSITIVE_INTS = ("hidden_dim", "num_heads", "num_encoder_layers", "num_decoder_layers",
                  "ffn_dim", "num_queries", "proposal_matches", "epochs", "batch_size",
                  "image_size", "max_image_size", "one_to_many_copies")
_NON_NEGATIVE = ("eos_coef", "cost_class", "cost_bbox", "cost_giou", "loss_ce", "loss_bbox",
                 "loss_giou", "backbone_lr_multiplier", "weight_decay")
_BOOLS = ("norm_first", "box_refinement", "look_forward_twice", "aux_loss",
          "iou_aware_classification", "matchability_aware_loss", "dense_one_to_one")


@dataclasses.dataclass(frozen=True)
class DetrConfig:
    """Hyperparameters of the DETR model, its loss and its optimizer (defaults = ``r50-detr``,
    facebookresearch/detr's)."""

    name: str = "r50-detr"

    # The detector: "detr" (the fields below) or "rtdetr" (RT-DETR, `vision.modeling.rtdetr`:
    # its architecture is `rtdetr`, transformers' RTDetrConfig fields as in a config.json,
    # read by `vision.pretrained.rtdetr_config.rtdetr_settings`, with num_queries from here; its
    # images are stretched to image_size x image_size and scaled to [0, 1], RT-DETR's
    # preprocessing; its loss is `vision.modeling.rtdetr.rtdetr_criterion` with the weights and
    # costs here, loss_ce weighting the varifocal loss). DETR's architecture fields do not apply
    # to it.
    architecture: str = "detr"
    rtdetr: dict | None = None

    # Backbone.
    # "resnet50" or "resnet101" (torchvision's v1.5, DETR's; stride 32, 2048 channels) or
    # "tiny" (stride 16).
    backbone: str = "resnet50"
    # A local torchvision-layout ResNet state dict (.pth, or .safetensors with the same names)
    # with the ImageNet weights DETR starts from; None starts from random weights. Nothing is
    # ever downloaded.
    backbone_weights: str | None = None
    tiny_filters: tuple[int, ...] = (32, 64, 128, 256)  # one stride-2 conv block per entry
    # The tiny backbone's normalization: "batch" (BatchNorm over the valid pixels of the
    # global batch) or "layer" (LayerNorm per pixel).
    tiny_norm: str = "batch"

    # Transformer.
    hidden_dim: int = 256  # d_model; the sine position embedding uses hidden_dim / 2 per axis
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    ffn_dim: int = 2048
    dropout: float = 0.1
    num_queries: int = 100  # upper bound on detections per image
    norm_first: bool = False  # post-norm, as DETR's default (pre_norm=False)
    # Convergence aids (DETR: "learned", None, False). query_type names a layer of
    # vision.modeling.queries.QUERY_LAYERS: "reference", a learned reference point per query
    # positions the query and its box centre; "encoder", two-stage queries from the encoder's
    # best proposals; "mixed", their boxes with learned content (DINO's mixed query
    # selection). attention_radius limits each query's cross-attention to a window around
    # its reference point (needs reference points).
    query_type: str = "learned"
    attention_radius: float | None = None
    box_refinement: bool = False  # each decoder layer refines the previous layer's boxes
    # With box_refinement: each box is an offset from the previous layer's box with its
    # gradient (DINO's look forward twice).
    look_forward_twice: bool = False
    # H-DETR's hybrid branch: this many more queries in training only, matched to
    # one_to_many_copies copies of the targets (0: none).
    one_to_many_queries: int = 0
    one_to_many_copies: int = 6
    # Contrastive denoising (DN-DETR, DINO): this many groups of a positive and a negative
    # noised copy of every target as training-only queries (0: none); DINO's label noise
    # ratio and box noise scale. Needs reference boxes (query_type "encoder" or "mixed").
    denoising_groups: int = 0
    denoising_label_noise: float = 0.5
    denoising_box_noise: float = 1.0

    # Loss (SetCriterion) and matching (HungarianMatcher).
    aux_loss: bool = True  # also supervise every earlier decoder layer
    eos_coef: float = 0.1  # classification weight of the no-object class
    cost_class: float = 1.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0
    loss_ce: float = 1.0
    loss_bbox: float = 5.0
    loss_giou: float = 2.0
    # How many proposals each object is matched to (one-to-many); used only with
    # query_type="encoder", the only one with proposals.
    proposal_matches: int = 1
    # A matched query's class target is its IoU with its object (the rest on no-object):
    # the softmax form of varifocal loss's IoU-aware target (RT-DETR).
    iou_aware_classification: bool = False
    # RT-DETR / D-FINE: DEIM's two losses (`vision.modeling.rtdetr.criterion_terms`; both
    # are train_detr.py's --deim): the matchability-aware loss, dense one-to-one box losses.
    matchability_aware_loss: bool = False
    dense_one_to_one: bool = False
    # "scipy": exact host solver; the train step must run with jit_compile=False.
    # "ops": pure keras.ops solver, same minimum cost, lets the whole step compile with XLA.
    matcher_solver: str = "scipy"

    # Optimizer: AdamW with a 10x smaller learning rate for the backbone.
    learning_rate: float = 1e-4
    # The backbone's learning rate is learning_rate times this (DETR: 1e-5 / 1e-4); it
    # follows the learning-rate drop.
    backbone_lr_multiplier: float = 0.1
    weight_decay: float = 1e-4  # decoupled, applied to every trainable variable as in DETR
    adam_epsilon: float = 1e-8  # PyTorch's AdamW default, which DETR uses (Keras's is 1e-7)
    clip_norm: float | None = 0.1  # gradient clipping by the global norm over all gradients
    epochs: int = 300
    lr_drop_epochs: int = 200  # both learning rates are multiplied by 0.1 after this epoch
    # A run bounded by --max-steps or --time-budget drops them once this share of the bound is
    # spent (if that comes before lr_drop_epochs): DETR's 200 of 300 epochs (what the drop
    # does to short runs: experiments/README.md).
    lr_drop_fraction: float | None = 2 / 3

    # Data.
    # Images per replica; the paper trains with 4 per GPU on 16 GPUs (batch 64).
    batch_size: int = 4
    image_size: int = 800  # shorter side after resizing (DETR's multi-scale max scale)
    max_image_size: int = 1333  # cap on the longer side
    # Training augmentation: "detr" (flip, multi-scale resize, random crop), "flip" or "none".
    augmentation: str = "detr"

    def __post_init__(self):
        if isinstance(self.tiny_filters, list):  # e.g. from JSON
            object.__setattr__(self, "tiny_filters", tuple(self.tiny_filters))
        _check_types(self)
        _check_values(self)

    def model_kwargs(self) -> dict:
        """The `vision.modeling.detr.DETR` constructor arguments (all but num_classes and
        backbone)."""
        return {field: getattr(self, field) for field in _MODEL_FIELDS}

    @property
    def uses_denoising(self) -> bool:
        """Whether training adds denoising queries (made from the targets, which the inputs
        then carry): DETR's ``denoising_groups``, RT-DETR's ``num_denoising`` (its rtdetr
        field; transformers' default 100)."""
        if self.architecture == "rtdetr":
            return bool(self.rtdetr.get("num_denoising", 100))
        return bool(self.denoising_groups)

    def backbone_kwargs(self) -> dict:
        """The arguments of `vision.modeling.backbone.build_backbone`."""
        kwargs = {"name": self.backbone, "weights": self.backbone_weights}
        if self.backbone == "tiny":
            kwargs.update(filters=self.tiny_filters, norm=self.tiny_norm)
        return kwargs


def _fail(field: str, value, expected: str):
    raise checks.CheckError(f"DetrConfig.{field}", value, expected)


def _check_types(config: DetrConfig) -> None:
    for field in _POSITIVE_INTS:
        checks.positive_int(f"DetrConfig.{field}", getattr(config, field))
    for field in _NON_NEGATIVE:
        checks.non_negative_number(f"DetrConfig.{field}", getattr(config, field))
    for field in ("learning_rate", "adam_epsilon"):
        checks.positive_number(f"DetrConfig.{field}", getattr(config, field))
    for field in _BOOLS:
        checks.boolean(f"DetrConfig.{field}", getattr(config, field))
    for field in ("name", "backbone", "tiny_norm", "query_type", "matcher_solver",
                  "augmentation", "architecture"):
        if not isinstance(getattr(config, field), str):
            _fail(field, getattr(config, field), "a string")
    if not isinstance(config.tiny_filters, tuple):
        _fail("tiny_filters", config.tiny_filters, "a non-empty tuple of positive integers")
    checks.positive_ints("DetrConfig.tiny_filters", config.tiny_filters)


def _check_values(config: DetrConfig) -> None:
    if config.architecture not in ARCHITECTURES:
        _fail("architecture", config.architecture, f"one of {ARCHITECTURES}")
    if (config.architecture == "rtdetr") != isinstance(config.rtdetr, dict):
        _fail("rtdetr", config.rtdetr, "a dict of RTDetrConfig fields with architecture "
                                       "'rtdetr', None otherwise")
    if config.architecture == "rtdetr" and config.denoising_groups:
        _fail("denoising_groups", config.denoising_groups, "0 with architecture 'rtdetr' "
              "(RT-DETR's denoising queries are its rtdetr field 'num_denoising')")
    for field in ("matchability_aware_loss", "dense_one_to_one"):  # DEIM's
        if getattr(config, field) and config.architecture != "rtdetr":
            _fail(field, True, "False unless architecture is 'rtdetr' (rtdetr-*, dfine-*)")
    if config.backbone not in BACKBONES:
        _fail("backbone", config.backbone, f"one of {BACKBONES}")
    if config.tiny_norm not in TINY_NORMS:
        _fail("tiny_norm", config.tiny_norm, f"one of {TINY_NORMS}")
    if config.backbone_weights is not None and (
            config.backbone == "tiny" or not isinstance(config.backbone_weights, str)):
        _fail("backbone_weights", config.backbone_weights,
              "None, or a weights file path with a ResNet backbone")
    if config.hidden_dim % 4 or config.hidden_dim % config.num_heads:
        _fail("hidden_dim", config.hidden_dim,
              f"a multiple of 4 and of num_heads={config.num_heads}")
    checks.fraction("DetrConfig.dropout", config.dropout)
    # Query strategy, then the decoder side that must fit it (refinement, radius).
    query_layer = query_layer_class(config.query_type)
    make_box_decoding(config.box_refinement, config.attention_radius,
                      query_layer.reference_size, config.query_type, config.look_forward_twice)
    checks.non_negative_int("DetrConfig.one_to_many_queries", config.one_to_many_queries)
    checks.non_negative_int("DetrConfig.denoising_groups", config.denoising_groups)
    if config.denoising_groups and query_layer.reference_size != 4:
        _fail("denoising_groups", config.denoising_groups,
              "0 unless query_type has reference boxes ('encoder' or 'mixed')")
    checks.fraction("DetrConfig.denoising_label_noise", config.denoising_label_noise,
                    interval="[]")
    checks.non_negative_number("DetrConfig.denoising_box_noise", config.denoising_box_noise)
    if config.cost_class == config.cost_bbox == config.cost_giou == 0:
        _fail("cost_class", config.cost_class, "non-zero, or cost_bbox or cost_giou non-zero")
    if config.matcher_solver not in SOLVERS:
        _fail("matcher_solver", config.matcher_solver, f"one of {SOLVERS}")
    checks.positive_number("DetrConfig.clip_norm", config.clip_norm, optional=True)
    checks.non_negative_int("DetrConfig.lr_drop_epochs", config.lr_drop_epochs)
    checks.fraction("DetrConfig.lr_drop_fraction", config.lr_drop_fraction, interval="(]",
                    optional=True)
    if config.augmentation not in AUGMENTATIONS:
        _fail("augmentation", config.augmentation, f"one of {AUGMENTATIONS}")


# A 4-conv backbone, d 128, 3+3 layers, 20 queries, 128 px images, batch 16, lr 2e-4: the
# setting of the reference CPU run of facebookresearch/detr (experiments/README.md).
_TINY = dict(
    backbone="tiny",
    hidden_dim=128,
    num_heads=4,
    num_encoder_layers=3,
    num_decoder_layers=3,
    ffn_dim=512,
    num_queries=20,
    learning_rate=2e-4,
    backbone_lr_multiplier=0.1,  # DETR's ratio
    batch_size=16,
    image_size=128,
    max_image_size=128,
    epochs=50,
    lr_drop_epochs=40,
    lr_drop_fraction=0.8,
)

# The convergence aids of `tiny` that hold at any size (the preset's others, no dropout and the
# full backbone rate, suit a backbone trained from scratch; r50's starts from ImageNet).
_AIDS = dict(query_type="encoder", box_refinement=True, attention_radius=0.3)

# RT-DETR's training settings (lyuwenyu/RT-DETR's rtdetr_r50vd_6x_coco: AdamW 1e-4, backbone
# 1e-5, weight decay 1e-4, clip 0.1, batch 4 per GPU, 640 x 640; transformers' RTDetrConfig
# matcher and loss weights: class cost 2, L1 5, GIoU 2; VFL 1, L1 5, GIoU 2).
_RTDETR_TRAINING = dict(architecture="rtdetr", image_size=640, max_image_size=640,
                        num_queries=300, cost_class=2.0, epochs=72, lr_drop_epochs=72,
                        lr_drop_fraction=None, dropout=0.0)

PRESETS: dict[str, DetrConfig] = {
    # DETR-R50 with the convergence aids (experiments/README.md): two-stage queries, iterative
    # box refinement, cross-attention within 0.3 of each reference box.
    "r50": DetrConfig(name="r50", **_AIDS),
    # facebookresearch/detr's DETR-R50 as published: the model its checkpoints load into
    # (vision.pretrained.init_from.load_reference_checkpoint).
    "r50-detr": DetrConfig(),
    # Vanilla DETR at the reference CPU setting (how it converges: experiments/README.md).
    "tiny-detr": DetrConfig(name="tiny-detr", **_TINY),
    # The same model size with the convergence aids that make it learn in minutes on a CPU:
    # two-stage queries from the encoder's proposals, iterative box
    # refinement, cross-attention within 0.3 of each reference box, no dropout, the
    # backbone (trained from scratch) at the full learning rate, and flip-only augmentation
    # (both tiny presets normalize the backbone with BatchNorm, `tiny_norm`).
    "tiny": DetrConfig(name="tiny", **{**_TINY, **_AIDS, "dropout": 0.0,
                                       "backbone_lr_multiplier": 1.0, "augmentation": "flip"}),
    **{f"rtdetr-{size}": DetrConfig(name=f"rtdetr-{size}", rtdetr=RTDETR_ARCHITECTURES[size],
                                    **_RTDETR_TRAINING) for size in ("r101", "r50", "r34", "r18")},
    # RT-DETR and D-FINE at `tiny`'s size and training settings (128 px, 20 queries, batch
    # 16, learning rate 2e-4, the backbone trained from scratch at the full rate, flips).
    **{f"{family}-tiny": DetrConfig(name=f"{family}-tiny", rtdetr=architectures["tiny"], **{
        **_RTDETR_TRAINING, **{k: _TINY[k] for k in (
            "num_queries", "learning_rate", "batch_size", "image_size", "max_image_size",
            "epochs", "lr_drop_epochs", "lr_drop_fraction")},
        "backbone_lr_multiplier": 1.0, "augmentation": "flip"})
       for family, architectures in (("rtdetr", RTDETR_ARCHITECTURES),
                                     ("dfine", DFINE_ARCHITECTURES))},
    # D-FINE (`vision.modeling.dfine`; the real-time DETR family, so architecture "rtdetr"
    # with a d_fine config), nano to x-large as published, with RT-DETR's training settings;
    # dfine-tiny (above) is its CPU size, trained as rtdetr-tiny.
    **{f"dfine-{size}": DetrConfig(name=f"dfine-{size}", rtdetr=DFINE_ARCHITECTURES[size],
                                   **_RTDETR_TRAINING) for size in ("x", "l", "m", "s", "n")},
}


def preset(name: str, **overrides) -> DetrConfig:
    """Returns the named preset, with some fields replaced.

    Args:
        name: a key of `PRESETS` (``"tiny"``, ``"tiny-detr"``, ``"r50"``, ``"r50-detr"``).
        **overrides: fields of `DetrConfig` to replace.

    Returns:
        A new frozen `DetrConfig` (checked again).

    Raises:
        ValueError: For an unknown preset name or field, or a bad value.
    """
    if name not in PRESETS:
        raise ValueError(f"`name` must be one of {sorted(PRESETS)}. Received: name={name!r}")
    fields = {field.name for field in dataclasses.fields(DetrConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"Unknown DetrConfig fields: {unknown}. Known fields: {sorted(fields)}.")
    return dataclasses.replace(PRESETS[name], **overrides)
