"""The RT-DETR presets against the published models' config.json
(`vision.pretrained.rtdetr_config`)."""

import copy

import pytest

from vision.config import PRESETS
from vision.pretrained import rtdetr_config

COCO = {str(i): f"class {i}" for i in range(80)}

# The config.json of an RTDetrForObjectDetection as transformers writes it (every RTDetrConfig
# attribute: the loss and matcher settings, bookkeeping, and the backbone's config with its
# stage names), with the values of PekingU/rtdetr_r50vd: the field set users' folders have.
PUBLISHED_R50 = {
    "activation_dropout": 0.0, "activation_function": "silu", "anchor_image_size": None,
    "architectures": ["RTDetrForObjectDetection"], "attention_dropout": 0.0,
    "auxiliary_loss": True, "backbone": None,
    "backbone_config": {
        "model_type": "rt_detr_resnet", "depths": [3, 4, 6, 3],
        "downsample_in_bottleneck": False, "downsample_in_first_stage": False,
        "embedding_size": 64, "hidden_act": "relu", "hidden_sizes": [256, 512, 1024, 2048],
        "layer_type": "bottleneck", "num_channels": 3,
        "out_features": ["stage2", "stage3", "stage4"], "out_indices": [2, 3, 4],
        "stage_names": ["stem", "stage1", "stage2", "stage3", "stage4"]},
    "backbone_kwargs": None, "batch_norm_eps": 1e-05, "box_noise_scale": 1.0, "d_model": 256,
    "decoder_activation_function": "relu", "decoder_attention_heads": 8,
    "decoder_ffn_dim": 1024, "decoder_in_channels": [256, 256, 256], "decoder_layers": 6,
    "decoder_n_points": 4, "disable_custom_kernels": True, "dropout": 0.0,
    "encode_proj_layers": [2], "encoder_activation_function": "gelu",
    "encoder_attention_heads": 8, "encoder_ffn_dim": 1024, "encoder_hidden_dim": 256,
    "encoder_in_channels": [512, 1024, 2048], "encoder_layers": 1, "eos_coefficient": 0.0001,
    "eval_size": None, "feat_strides": [8, 16, 32], "focal_loss_alpha": 0.75,
    "focal_loss_gamma": 2.0, "freeze_backbone_batch_norms": True, "hidden_expansion": 1.0,
    "id2label": COCO, "initializer_bias_prior_prob": None, "initializer_range": 0.01,
    "is_encoder_decoder": True, "label2id": {v: int(k) for k, v in COCO.items()},
    "label_noise_ratio": 0.5, "layer_norm_eps": 1e-05, "learn_initial_query": False,
    "matcher_alpha": 0.25, "matcher_bbox_cost": 5.0, "matcher_class_cost": 2.0,
    "matcher_gamma": 2.0, "matcher_giou_cost": 2.0, "model_type": "rt_detr",
    "normalize_before": False, "num_denoising": 100, "num_feature_levels": 3,
    "num_queries": 300, "positional_encoding_temperature": 10000, "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0", "use_focal_loss": True,
    "use_pretrained_backbone": False, "use_timm_backbone": False, "weight_loss_bbox": 5.0,
    "weight_loss_giou": 2.0, "weight_loss_vfl": 1.0, "with_box_refine": True,
}


def _published(backbone: dict | None = None, **fields) -> dict:
    """PUBLISHED_R50 with the fields transformers' conversion script
    (convert_rt_detr_original_pytorch_checkpoint_to_hf.py) sets for another size."""
    config = copy.deepcopy(PUBLISHED_R50)
    config["backbone_config"].update(backbone or {})
    config.update(fields)
    return config


BASIC = dict(layer_type="basic", hidden_sizes=[64, 128, 256, 512])
PUBLISHED = {
    "r50": PUBLISHED_R50,
    "r18": _published({**BASIC, "depths": [2, 2, 2, 2]}, encoder_in_channels=[128, 256, 512],
                      hidden_expansion=0.5, decoder_layers=3),
    "r34": _published({**BASIC, "depths": [3, 4, 6, 3]}, encoder_in_channels=[128, 256, 512],
                      hidden_expansion=0.5, decoder_layers=4),
    "r101": _published({"depths": [3, 4, 23, 3]}, encoder_ffn_dim=2048, encoder_hidden_dim=384,
                       decoder_in_channels=[384, 384, 384]),
}


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_each_preset_builds_the_published_models_architecture(size):
    preset = PRESETS[f"rtdetr-{size}"]
    ours = rtdetr_config.rtdetr_settings({**preset.rtdetr, "num_queries": preset.num_queries})
    assert ours == rtdetr_config.rtdetr_settings(PUBLISHED[size])


def test_the_published_field_set_is_read_to_its_values():
    settings = rtdetr_config.rtdetr_settings(PUBLISHED_R50)
    assert settings["backbone"]["out_indices"] == [2, 3, 4]
    assert settings["model"] == dict(d_model=256, num_queries=300, num_feature_levels=3,
                                     layer_norm_epsilon=1e-5, batch_norm_epsilon=1e-5,
                                     num_denoising=100, label_noise_ratio=0.5,
                                     box_noise_scale=1.0)
    assert settings["encoder"]["encoder_activation"] == "gelu"
    assert settings["decoder"]["num_layers"] == 6 and settings["decoder"]["num_points"] == 4
    changed = rtdetr_config.rtdetr_settings({**PUBLISHED_R50, "num_denoising": 0,
                                             "label_noise_ratio": 0.25,
                                             "box_noise_scale": 0.4})["model"]
    assert (changed["num_denoising"], changed["label_noise_ratio"],
            changed["box_noise_scale"]) == (0, 0.25, 0.4)


def test_an_rtdetr_v2_config_reads_as_the_v1_of_its_sizes():
    # RTDetrV2Config writes v1's fields and three of its decoder's attention, at these values
    # in the published v2 models (PekingU/rtdetr_v2_r50vd and its kin).
    v2 = {**PUBLISHED_R50, "model_type": "rt_detr_v2",
          "architectures": ["RTDetrV2ForObjectDetection"], "decoder_method": "default",
          "decoder_n_levels": 3, "decoder_offset_scale": 0.5}
    assert rtdetr_config.rtdetr_settings(v2) == rtdetr_config.rtdetr_settings(PUBLISHED_R50)
    with pytest.raises(ValueError, match="config.json: model_type='rt_detr_v3' is not one of"):
        rtdetr_config.rtdetr_settings({**v2, "model_type": "rt_detr_v3"})
