"""The arguments of a D-FINE from transformers' ``config.json`` (``DFineConfig`` with an
``HGNetV2Config`` as ``backbone_config``), by the rule of `vision.pretrained.config_rule`.

A field that transformers' ``modeling_d_fine.py`` reads (`MODEL_FIELDS`; the test checks the
set against the installed source) is read here, or has the one value implemented (`_FIXED`:
``eval_idx`` the last layer and ``layer_scale`` 1, as every published checkpoint has), or
only matters in training (losses, matcher, initialization; accepted). A field that would
change the computation and is not implemented is refused by name, with its file. The
published files (``ustc-community/dfine-{nano,small,medium,large,xlarge}-{coco,obj365,
obj2coco}``) carry the fields of ``tests/vision/pretrained/test_dfine_convert.py``'s
``PUBLISHED_LARGE``; each is read, fixed at the value it has, or training-only.
"""

from __future__ import annotations

from vision.pretrained.config_rule import TRAINING_FIELDS, activation, check_fields, refuse

__all__ = ["ARCHITECTURES", "DFINE_TYPE", "MODEL_FIELDS", "dfine_settings"]

DFINE_TYPE = "d_fine"

# Every field modeling_d_fine.py reads from its config, and the backbone loader's.
MODEL_FIELDS = {
    "activation_function", "add_cross_attention", "anchor_image_size", "attention_dropout",
    "auxiliary_loss", "batch_norm_eps", "box_noise_scale", "d_model",
    "decoder_activation_function", "decoder_attention_heads", "decoder_ffn_dim",
    "decoder_in_channels", "decoder_layers", "decoder_method", "decoder_n_points",
    "decoder_offset_scale", "depth_mult", "dropout", "encode_proj_layers",
    "encoder_activation_function", "encoder_ffn_dim", "encoder_hidden_dim",
    "encoder_in_channels", "encoder_layers", "eval_idx", "eval_size", "feat_strides",
    "freeze_backbone_batch_norms", "hidden_expansion", "id2label",
    "initializer_bias_prior_prob", "label_noise_ratio", "layer_norm_eps", "layer_scale",
    "learn_initial_query", "lqe_hidden_dim", "lqe_layers", "max_num_bins", "normalize_before",
    "num_attention_heads", "num_denoising", "num_feature_levels", "num_labels", "num_queries",
    "output_attentions", "positional_encoding_temperature", "reg_scale", "top_prob_values",
    "two_stage", "two_stage_num_proposals", "up", "with_box_refine", "encoder_attention_heads",
    "backbone_config", "use_timm_backbone", "backbone", "use_pretrained_backbone",
    "backbone_kwargs"}
# One value implemented (see vision.pretrained.rtdetr_config for the RT-DETR ones). layer_scale:
# wider layers after eval_idx; eval_idx: checked against decoder_layers in `dfine_settings`.
_FIXED = {"eval_size": None, "normalize_before": False, "learn_initial_query": False,
          "use_timm_backbone": False, "backbone": None, "backbone_kwargs": None,
          "two_stage": None, "add_cross_attention": False, "layer_scale": 1}
_READ = MODEL_FIELDS - set(_FIXED) - TRAINING_FIELDS


def dfine_settings(config: dict, file: str = "config.json") -> dict:
    """`vision.pretrained.dfine.build_dfine` arguments of a ``DFineConfig`` dict.

    Raises:
        ValueError: a field this conversion does not implement; the message names ``file``,
            the field and its value.
    """
    from vision.pretrained.hgnetv2_config import hgnetv2_settings

    if config.get("model_type", DFINE_TYPE) != DFINE_TYPE:
        refuse(file, "model_type", config["model_type"], f"is not {DFINE_TYPE!r}")
    check_fields(config, MODEL_FIELDS, file, _READ, TRAINING_FIELDS, _FIXED)
    get = config.get
    backbone = hgnetv2_settings(get("backbone_config") or {"out_indices": [2, 3, 4]},
                                f"{file} (backbone_config)")
    out = list(backbone["stage_out_channels"])
    channels = [out[i - 1] for i in backbone["out_indices"]]
    if list(get("encoder_in_channels", [512, 1024, 2048])) != channels:
        refuse(file, "encoder_in_channels", get("encoder_in_channels"),
                f"differs from the backbone's channels {channels}")
    hidden, d_model = get("encoder_hidden_dim", 256), get("d_model", 256)
    levels, layers = get("num_feature_levels", 3), get("decoder_layers", 6)
    if list(get("decoder_in_channels", [256] * 3)) != [hidden] * len(channels):
        refuse(file, "decoder_in_channels", get("decoder_in_channels"),
                f"is not supported (only the encoder's {[hidden] * len(channels)})")
    if levels != len(channels):
        refuse(file, "num_feature_levels", levels,
                f"is not supported (only the encoder's {len(channels)} levels)")
    if get("eval_idx", -1) not in (-1, layers - 1):
        refuse(file, "eval_idx", get("eval_idx"), "is not supported (only the last layer)")
    points = get("decoder_n_points", 4)
    points = [points] * levels if isinstance(points, int) else list(points)
    if get("decoder_method", "default") not in ("default", "discrete"):
        refuse(file, "decoder_method", get("decoder_method"),
                "is not supported (one of 'default', 'discrete')")
    encoder = dict(
        hidden_dim=hidden, num_levels=len(channels),
        encode_proj_layers=list(get("encode_proj_layers", [2])),
        num_layers=get("encoder_layers", 1),
        num_heads=get("encoder_attention_heads", get("num_attention_heads", 8)),
        ffn_dim=get("encoder_ffn_dim", 1024), dropout=float(get("dropout", 0.0)),
        encoder_activation=activation(file, "encoder_activation_function",
                                       get("encoder_activation_function", "gelu")),
        layer_norm_epsilon=get("layer_norm_eps", 1e-5),
        temperature=get("positional_encoding_temperature", 10000),
        activation=activation(file, "activation_function", get("activation_function",
                                                                "silu")),
        hidden_expansion=get("hidden_expansion", 1.0), epsilon=get("batch_norm_eps", 1e-5),
        num_blocks=round(3 * get("depth_mult", 1.0)))
    decoder = dict(
        num_layers=layers, num_heads=get("decoder_attention_heads", 8),
        ffn_dim=get("decoder_ffn_dim", 1024), num_levels=levels, num_points=points,
        offset_scale=float(get("decoder_offset_scale", 0.5)),
        method=get("decoder_method", "default"), max_num_bins=get("max_num_bins", 32),
        reg_scale=float(get("reg_scale", 4.0)), up=float(get("up", 0.5)),
        top_prob_values=get("top_prob_values", 4), lqe_hidden_dim=get("lqe_hidden_dim", 64),
        lqe_layers=get("lqe_layers", 2), dropout=float(get("dropout", 0.0)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation=activation(file, "decoder_activation_function",
                               get("decoder_activation_function", "relu")),
        layer_norm_epsilon=get("layer_norm_eps", 1e-5))
    model = dict(d_model=d_model, num_queries=get("num_queries", 300),
                 num_feature_levels=levels, layer_norm_epsilon=get("layer_norm_eps", 1e-5),
                 batch_norm_epsilon=get("batch_norm_eps", 1e-5),
                 num_denoising=get("num_denoising", 100),
                 label_noise_ratio=float(get("label_noise_ratio", 0.5)),
                 box_noise_scale=float(get("box_noise_scale", 1.0)))
    return dict(family=DFINE_TYPE, backbone=backbone, encoder=encoder, decoder=decoder,
                model=model)


# The architectures of the D-FINE presets (`vision.config.PRESETS`), as config.json fields:
# the published ones as transformers' conversion script
# (convert_d_fine_original_pytorch_checkpoint_to_hf.py) sets them. The backbones: HGNetV2 B0
# (N, S), B2 (M), B4 (L; transformers' HGNetV2Config defaults) and B5 (X).
_B0 = {"model_type": "hgnet_v2", "stem_channels": [3, 16, 16],
       "stage_in_channels": [16, 64, 256, 512], "stage_mid_channels": [16, 32, 64, 128],
       "stage_out_channels": [64, 256, 512, 1024], "stage_num_blocks": [1, 1, 2, 1],
       "stage_numb_of_layers": [3, 3, 3, 3], "use_learnable_affine_block": True,
       "hidden_sizes": [64, 256, 512, 1024], "out_indices": [2, 3, 4]}
_S = {"model_type": DFINE_TYPE, "backbone_config": _B0, "decoder_layers": 3,
      "hidden_expansion": 0.5, "depth_mult": 0.34, "decoder_n_points": [3, 6, 3],
      "encoder_in_channels": [256, 512, 1024]}
_N = {**_S, "backbone_config": {**_B0, "out_indices": [3, 4]}, "num_feature_levels": 2,
      "encoder_ffn_dim": 512, "encode_proj_layers": [1], "d_model": 128,
      "encoder_hidden_dim": 128, "decoder_ffn_dim": 512, "encoder_in_channels": [512, 1024],
      "decoder_n_points": [6, 6], "decoder_in_channels": [128, 128], "feat_strides": [16, 32],
      "depth_mult": 0.5, "hidden_expansion": 0.34}
_M = {"model_type": DFINE_TYPE, "backbone_config": {
    "model_type": "hgnet_v2", "stem_channels": [3, 24, 32],
    "stage_in_channels": [32, 96, 384, 768], "stage_mid_channels": [32, 64, 128, 256],
    "stage_out_channels": [96, 384, 768, 1536], "stage_numb_of_layers": [4, 4, 4, 4],
    "use_learnable_affine_block": True, "hidden_sizes": [96, 384, 768, 1536],
    "out_indices": [2, 3, 4]},
    "decoder_layers": 4, "decoder_n_points": [3, 6, 3], "encoder_in_channels": [384, 768, 1536],
    "depth_mult": 0.67, "hidden_expansion": 1.0}
_L = {"model_type": DFINE_TYPE, "backbone_config": {"model_type": "hgnet_v2",
                                                    "out_indices": [2, 3, 4]},
      "decoder_layers": 6, "decoder_n_points": [3, 6, 3], "hidden_expansion": 1.0}
_X = {**_L, "backbone_config": {
    "model_type": "hgnet_v2", "stem_channels": [3, 32, 64],
    "stage_in_channels": [64, 128, 512, 1024], "stage_mid_channels": [64, 128, 256, 512],
    "stage_num_blocks": [1, 2, 5, 2], "out_indices": [2, 3, 4]},
    "encoder_hidden_dim": 384, "encoder_ffn_dim": 2048, "decoder_in_channels": [384] * 3}
# D-FINE at rtdetr-tiny's size for CPU runs: S's backbone (HGNetV2 B0, 3 levels) with N's
# 128-wide encoder and decoder, 8 denoising queries as rtdetr-tiny.
_TINY = {**_S, "encoder_hidden_dim": 128, "d_model": 128, "encoder_ffn_dim": 512,
         "decoder_ffn_dim": 512, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
         "decoder_in_channels": [128] * 3, "num_denoising": 8}
ARCHITECTURES = {"n": _N, "s": _S, "m": _M, "l": _L, "x": _X, "tiny": _TINY}
