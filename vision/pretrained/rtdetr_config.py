"""The arguments of an RT-DETR from transformers' ``config.json`` (``RTDetrConfig``, or
``RTDetrV2Config``, with an ``RTDetrResNetConfig`` as ``backbone_config``), by the rule
`nlp.pretrained.hf_config` states for Marian.

RT-DETR v2 computes as v1 but for its decoder's deformable attention: ``decoder_n_levels``
levels (read: it must be ``num_feature_levels``), offsets scaled by ``decoder_offset_scale``
over the points per level (v1's is 0.5 over the same count: only 0.5 is implemented) and
``decoder_method`` ``default`` (bilinear; ``discrete`` rounds the locations: refused).

A field that transformers' RT-DETR modeling code reads (`MODEL_FIELDS`, `BACKBONE_FIELDS`;
tests/vision/pretrained/test_rtdetr_convert.py checks the sets against the installed source) is read
here, or has the one value implemented (`_FIXED`), or only matters in training (`_TRAINING`:
losses, matcher, initialization; accepted); every other field is bookkeeping
(names, label maps, dtype...), accepted. A field that would change the computation and is not
implemented is refused by name, with the file it is in.
"""

from __future__ import annotations

from vision.pretrained.config_rule import (
    ACTIVATIONS,
    TRAINING_FIELDS,
    activation,
    check_fields,
    refuse,
)

__all__ = ["ACTIVATIONS", "ARCHITECTURES", "BACKBONE_FIELDS", "MODEL_FIELDS", "PROCESSOR_DEFAULTS",
           "RTDETR_TYPES", "backbone_settings", "preprocessing_settings", "rtdetr_settings"]

# The model_type of the folders read: RTDetrForObjectDetection, RTDetrV2ForObjectDetection
# and DFineForObjectDetection (`vision.pretrained.dfine_config`), the real-time DETR family.
RTDETR_TYPES = ("rt_detr", "rt_detr_v2", "d_fine")

# Every field modeling_rt_detr.py and modeling_rt_detr_v2.py read from their config
# (tests/vision/pretrained/test_rtdetr_convert.py
# checks the set against the installed source), and those of the backbone's config
# (modeling_rt_detr_resnet.py, and ``out_indices``/``out_features`` of BackboneMixin).
MODEL_FIELDS = {
    "activation_dropout", "activation_function", "add_cross_attention", "anchor_image_size",
    "attention_dropout", "auxiliary_loss", "batch_norm_eps", "box_noise_scale", "d_model",
    "decoder_activation_function", "decoder_attention_heads", "decoder_ffn_dim",
    "decoder_in_channels", "decoder_layers", "decoder_n_points", "disable_custom_kernels",
    "dropout", "encode_proj_layers", "encoder_activation_function", "encoder_ffn_dim",
    "encoder_hidden_dim", "encoder_in_channels", "encoder_layers", "eval_size",
    "feat_strides", "freeze_backbone_batch_norms", "hidden_expansion", "id2label",
    "initializer_bias_prior_prob", "initializer_range", "label_noise_ratio", "layer_norm_eps",
    "learn_initial_query", "normalize_before", "num_attention_heads", "num_denoising",
    "num_feature_levels", "num_labels", "num_queries", "output_attentions",
    "positional_encoding_temperature", "two_stage", "two_stage_num_proposals",
    "with_box_refine", "encoder_attention_heads", "backbone_config", "use_timm_backbone",
    "backbone", "use_pretrained_backbone", "backbone_kwargs", "decoder_method",
    "decoder_n_levels", "decoder_offset_scale"}
BACKBONE_FIELDS = {"depths", "downsample_in_bottleneck", "downsample_in_first_stage",
                   "embedding_size", "hidden_act", "hidden_sizes", "layer_type", "num_channels",
                   "output_hidden_states", "return_dict", "out_indices", "out_features"}
# One value implemented. eval_size: transformers then drops AIFI's positions in eval mode;
# normalize_before: transformers' pre-norm keeps the normalized input as the FFN's residual,
# which lyuwenyu/RT-DETR does not; learn_initial_query: learned queries instead of the
# selected cells' features; a timm or Hub backbone: not an RTDetrResNet.
_FIXED = {"eval_size": None, "normalize_before": False, "learn_initial_query": False,
          "decoder_method": "default", "decoder_offset_scale": 0.5,
          "use_timm_backbone": False, "backbone": None, "backbone_kwargs": None,
          "two_stage": None, "add_cross_attention": False}
_READ = (MODEL_FIELDS | BACKBONE_FIELDS) - set(_FIXED) - TRAINING_FIELDS


def backbone_settings(backbone: dict, file: str = "config.json") -> dict:
    """`vision.modeling.rtdetr_backbone.RTDetrResNetBackbone` arguments of an
    ``RTDetrResNetConfig`` dict (an ``RTDetrConfig``'s ``backbone_config``, or a backbone's
    own ``config.json``).

    Raises:
        ValueError: another backbone type or an unsupported field (named with ``file``).
    """
    if backbone.get("model_type", "rt_detr_resnet") != "rt_detr_resnet":
        refuse(file, "model_type", backbone["model_type"],
                "is not supported (only 'rt_detr_resnet')")
    check_fields(backbone, BACKBONE_FIELDS, file, _READ, TRAINING_FIELDS, _FIXED)
    depths = list(backbone.get("depths", [3, 4, 6, 3]))
    stages = ["stem"] + [f"stage{i}" for i in range(1, len(depths) + 1)]
    out = backbone.get("out_indices") or [stages.index(name) for name in
                                          backbone.get("out_features") or [stages[-1]]]
    return dict(
        depths=depths, hidden_sizes=list(backbone.get("hidden_sizes", [256, 512, 1024, 2048])),
        embedding_size=backbone.get("embedding_size", 64),
        layer_type=backbone.get("layer_type", "bottleneck"),
        activation=activation(file, "hidden_act", backbone.get("hidden_act", "relu")),
        downsample_in_bottleneck=bool(backbone.get("downsample_in_bottleneck", False)),
        downsample_in_first_stage=bool(backbone.get("downsample_in_first_stage", False)),
        out_indices=list(out))


def rtdetr_settings(config: dict, file: str = "config.json") -> dict:
    """`build_rtdetr` arguments of an ``RTDetrConfig`` dict (see the module docstring).

    Raises:
        ValueError: a field this conversion does not implement; the message names ``file``,
            the field and its value.
    """
    if config.get("model_type") == "d_fine":
        from vision.pretrained.dfine_config import dfine_settings

        return dfine_settings(config, file)
    if config.get("model_type", "rt_detr") not in RTDETR_TYPES:
        refuse(file, "model_type", config["model_type"], f"is not one of {RTDETR_TYPES}")
    check_fields(config, MODEL_FIELDS, file, _READ, TRAINING_FIELDS, _FIXED)
    get = config.get
    backbone_kwargs = backbone_settings(get("backbone_config") or {"out_indices": [2, 3, 4]},
                                        f"{file} (backbone_config)")
    sizes = [backbone_kwargs["embedding_size"]] + backbone_kwargs["hidden_sizes"]
    channels = [sizes[i] for i in backbone_kwargs["out_indices"]]
    hidden = get("encoder_hidden_dim", 256)
    if list(get("encoder_in_channels", [512, 1024, 2048])) != channels:
        refuse(file, "encoder_in_channels", get("encoder_in_channels"),
                f"differs from the backbone's channels {channels}")
    if list(get("decoder_in_channels", [256] * 3)) != [hidden] * len(channels):
        refuse(file, "decoder_in_channels", get("decoder_in_channels"),
                f"is not supported (only the encoder's {[hidden] * len(channels)})")
    d_model = get("d_model", 256)
    levels = get("num_feature_levels", 3)
    if get("decoder_n_levels", levels) != levels:
        refuse(file, "decoder_n_levels", get("decoder_n_levels"),
                f"is not supported (only num_feature_levels, {levels})")
    if levels > len(channels) + 1 and d_model != hidden:
        refuse(file, "num_feature_levels", levels, "is not supported with d_model "
                "!= encoder_hidden_dim beyond one extra level")
    dropout = float(get("dropout", 0.0))
    encoder = dict(
        hidden_dim=hidden, num_levels=len(channels),
        encode_proj_layers=list(get("encode_proj_layers", [2])),
        num_layers=get("encoder_layers", 1),
        num_heads=get("encoder_attention_heads", get("num_attention_heads", 8)),
        ffn_dim=get("encoder_ffn_dim", 1024), dropout=dropout,
        activation_dropout=float(get("activation_dropout", 0.0)),
        encoder_activation=activation(file, "encoder_activation_function",
                                       get("encoder_activation_function", "gelu")),
        layer_norm_epsilon=get("layer_norm_eps", 1e-5),
        temperature=get("positional_encoding_temperature", 10000),
        activation=activation(file, "activation_function", get("activation_function",
                                                                "silu")),
        hidden_expansion=get("hidden_expansion", 1.0), epsilon=get("batch_norm_eps", 1e-5))
    decoder = dict(
        num_layers=get("decoder_layers", 6), num_heads=get("decoder_attention_heads", 8),
        ffn_dim=get("decoder_ffn_dim", 1024), num_points=get("decoder_n_points", 4),
        num_levels=levels, dropout=dropout,
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation_dropout=float(get("activation_dropout", 0.0)),
        activation=activation(file, "decoder_activation_function",
                               get("decoder_activation_function", "relu")),
        layer_norm_epsilon=get("layer_norm_eps", 1e-5))
    model = dict(d_model=d_model, num_queries=get("num_queries", 300),
                 num_feature_levels=levels, layer_norm_epsilon=get("layer_norm_eps", 1e-5),
                 batch_norm_epsilon=get("batch_norm_eps", 1e-5),
                 num_denoising=get("num_denoising", 100),
                 label_noise_ratio=float(get("label_noise_ratio", 0.5)),
                 box_noise_scale=float(get("box_noise_scale", 1.0)))
    return dict(backbone=backbone_kwargs, encoder=encoder, decoder=decoder, model=model)


# ``RTDetrImageProcessor``'s defaults (what a folder without preprocessor_config.json, e.g. one
# written by the model's own ``save_pretrained``, is run with): 640 x 640, bilinear, pixels
# / 255, no normalization, no padding.
PROCESSOR_DEFAULTS = {"do_resize": True, "size": {"height": 640, "width": 640}, "resample": 2,
                      "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": False,
                      "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
                      "do_pad": False}
_BILINEAR = 2  # PIL's (and transformers' PILImageResampling) BILINEAR


def preprocessing_settings(processor: dict | None,
                           file: str = "preprocessor_config.json") -> dict:
    """`vision.data.augment.FixedSize` arguments of an ``RTDetrImageProcessor``'s
    ``preprocessor_config.json`` (None: the processor's defaults, `PROCESSOR_DEFAULTS`).

    Read: ``size`` (``height`` and ``width``), ``do_rescale``/``rescale_factor``,
    ``do_normalize``/``image_mean``/``image_std``. Refused, naming ``file``: no resize, a resize
    that keeps the aspect ratio (``shortest_edge``, ``max_height``), another resampling than
    bilinear, padding. The rest (``format``, ``do_convert_annotations``, the processor's type,
    ...) concerns annotations or bookkeeping and is accepted.
    """
    fields = {**PROCESSOR_DEFAULTS, **(processor or {})}
    if fields["do_resize"] is not True:
        refuse(file, "do_resize", fields["do_resize"], "is not supported (the model's input "
                "size must be fixed: only true)")
    size = fields["size"]
    if not isinstance(size, dict) or set(size) != {"height", "width"} or not all(
            isinstance(v, int) and v > 0 for v in size.values()):
        refuse(file, "size", size, "is not supported (only {'height': H, 'width': W})")
    if fields["resample"] != _BILINEAR:
        refuse(file, "resample", fields["resample"], "is not supported (only 2, bilinear)")
    if fields["do_pad"]:
        refuse(file, "do_pad", fields["do_pad"], "is not supported (only false)")
    rescale = float(fields["rescale_factor"]) if fields["do_rescale"] else 1.0
    mean = std = None
    if fields["do_normalize"]:
        mean, std = (tuple(float(v) for v in fields[key]) for key in ("image_mean", "image_std"))
        if len(mean) != 3 or len(std) != 3 or not all(v > 0 for v in std):
            refuse(file, "image_std" if len(mean) == 3 else "image_mean",
                    fields["image_std" if len(mean) == 3 else "image_mean"],
                    "is not supported (3 values, std > 0)")
    return dict(height=size["height"], width=size["width"], rescale=rescale, mean=mean,
                std=std)


# The architectures of the RT-DETR presets (`vision.config.PRESETS`), as config.json fields:
# the published ones as transformers' conversion script
# (convert_rt_detr_original_pytorch_checkpoint_to_hf.py) sets them.
# transformers' RTDetrConfig defaults: RT-DETR R50-vd (PekingU/rtdetr_r50vd).
_R50 = {"backbone_config": {"model_type": "rt_detr_resnet",
                            "out_features": ["stage2", "stage3", "stage4"]},
        "encoder_in_channels": [512, 1024, 2048]}
# PekingU/rtdetr_r18vd: basic blocks, CSP expansion 0.5, 3 decoder layers.
_R18 = {
    "backbone_config": {"model_type": "rt_detr_resnet", "layer_type": "basic",
                        "depths": [2, 2, 2, 2], "hidden_sizes": [64, 128, 256, 512],
                        "embedding_size": 64, "downsample_in_bottleneck": False,
                        "out_features": ["stage2", "stage3", "stage4"]},
    "encoder_in_channels": [128, 256, 512], "hidden_expansion": 0.5, "decoder_layers": 3,
}
# PekingU/rtdetr_r34vd: R18's with R34's depths and 4 decoder layers.
_R34 = {**_R18, "backbone_config": {**_R18["backbone_config"], "depths": [3, 4, 6, 3]},
        "decoder_layers": 4}
# PekingU/rtdetr_r101vd: R50-vd with 23 blocks in its third stage, the encoder 384 wide with
# an FFN of 2048 (the decoder stays 256 wide).
_R101 = {**_R50, "backbone_config": {**_R50["backbone_config"], "depths": [3, 4, 23, 3]},
         "encoder_hidden_dim": 384, "encoder_ffn_dim": 2048, "decoder_in_channels": [384] * 3}
# RT-DETR at DETR tiny's size for CPU runs (`vision.config`'s `tiny`: d 128, 4 heads, FFN
# 512, 3 decoder layers): basic blocks of 32-256 channels, one per stage.
_TINY = {
    "backbone_config": {"model_type": "rt_detr_resnet", "layer_type": "basic",
                        "depths": [1, 1, 1, 1], "hidden_sizes": [32, 64, 128, 256],
                        "embedding_size": 32, "out_features": ["stage2", "stage3", "stage4"]},
    "encoder_in_channels": [64, 128, 256], "encoder_hidden_dim": 128, "d_model": 128,
    "encoder_ffn_dim": 512, "decoder_ffn_dim": 512, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "decoder_layers": 3, "hidden_expansion": 0.5,
    "decoder_in_channels": [128, 128, 128],
    # 8 denoising queries (8 // M groups, at least one, for the batch's most objects M: about
    # 2/3 of the 20 matching queries, as the published models' 100 against 300): +0.04 AP at
    # 8 minutes on the photos
    # (experiments/README.md, "RT-DETR's denoising queries").
    "num_denoising": 8,
}
ARCHITECTURES = {"r101": _R101, "r50": _R50, "r34": _R34, "r18": _R18, "tiny": _TINY}
