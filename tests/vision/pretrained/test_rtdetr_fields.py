"""What `tfx-convert-detr` reads of a transformers RT-DETR folder besides its weights
(`vision.pretrained.rtdetr_config`, `vision.pretrained.rtdetr`): every config field the modeling
code reads is read, fixed or training-only, fields and backbones it does not implement are
refused by name, and the image processor's config is read as its resize and scaling."""

import importlib.util
import os
import re

import pytest

from vision.pretrained import rtdetr_config


def test_every_field_rt_detr_modeling_reads_is_read_fixed_or_training_only():
    # The installed source as text: importing the PyTorch modeling code here would crash.
    package = importlib.util.find_spec("transformers").submodule_search_locations[0]
    folder = os.path.join(package, "models", "rt_detr")
    for module, fields in (("modeling_rt_detr.py", rtdetr_config.MODEL_FIELDS),
                           ("../rt_detr_v2/modeling_rt_detr_v2.py", rtdetr_config.MODEL_FIELDS),
                           ("modeling_rt_detr_resnet.py", rtdetr_config.BACKBONE_FIELDS)):
        with open(os.path.join(folder, module), encoding="utf-8") as f:
            read = set(re.findall(r"config\.([a-z][a-z_0-9]*)", f.read()))
        assert read, "no config field found: the pattern no longer fits the source"
        assert read <= fields, sorted(read - fields)
    every = rtdetr_config.MODEL_FIELDS | rtdetr_config.BACKBONE_FIELDS
    assert every <= (rtdetr_config._READ | rtdetr_config.TRAINING_FIELDS
                     | set(rtdetr_config._FIXED))


@pytest.mark.parametrize("field, value, message", [
    ("eval_size", [640, 640], "config.json: eval_size=[640, 640] is not supported"),
    ("normalize_before", True, "config.json: normalize_before=True is not supported"),
    ("learn_initial_query", True, "learn_initial_query=True is not supported"),
    ("use_timm_backbone", True, "use_timm_backbone=True is not supported"),
    ("decoder_activation_function", "gelu_new", "decoder_activation_function='gelu_new' is "
                                                "not supported"),
    ("encoder_in_channels", [8, 16, 32], "differs from the backbone's channels"),
    ("decoder_method", "discrete", "decoder_method='discrete' is not supported (only 'default')"),
    ("decoder_offset_scale", 1.0, "decoder_offset_scale=1.0 is not supported (only 0.5)"),
    ("decoder_n_levels", 4, "decoder_n_levels=4 is not supported (only num_feature_levels, 3)"),
])
def test_fields_that_change_the_computation_are_refused_naming_the_file(field, value,
                                                                        message):
    with pytest.raises(ValueError, match=re.escape(message)):
        rtdetr_config.rtdetr_settings({"model_type": "rt_detr", field: value})
    # Bookkeeping and training-only fields are accepted.
    rtdetr_config.rtdetr_settings({"model_type": "rt_detr", "matcher_alpha": 0.5,
                                    "num_denoising": 0, "architectures": ["x"]})


def test_a_backbone_other_than_rtdetr_resnet_is_refused():
    with pytest.raises(ValueError, match=r"backbone_config\): model_type='hgnet_v2' is not"):
        rtdetr_config.rtdetr_settings({"backbone_config": {"model_type": "hgnet_v2"}})


@pytest.mark.parametrize("change, message", [
    ({"size": {"shortest_edge": 640}}, "size={'shortest_edge': 640} is not supported"),
    ({"resample": 3}, "resample=3 is not supported"),
    ({"do_pad": True}, "do_pad=True is not supported"),
])
def test_a_preprocessing_other_than_a_fixed_bilinear_resize_is_refused(change, message):
    fields = {**rtdetr_config.PROCESSOR_DEFAULTS, "format": "coco_detection",
              "image_processor_type": "RTDetrImageProcessor", "do_convert_annotations": True,
              **change}
    with pytest.raises(ValueError, match=re.escape(f"preprocessor_config.json: {message}")):
        rtdetr_config.preprocessing_settings(fields)


# The whole preprocessor_config.json of docling-project/docling-layout-heron, an RT-DETR v2
# published on the Hub (its 444 bytes, field for field): the field set users' folders have.
PUBLISHED_PROCESSOR = {
    "image_processor_type": "RTDetrImageProcessor", "do_convert_annotations": True,
    "do_normalize": False, "do_pad": False, "do_rescale": True, "do_resize": True,
    "format": "coco_detection", "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225], "pad_size": None, "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 640, "width": 640}}


def test_a_published_processor_config_reads_as_its_resize_and_scaling():
    assert rtdetr_config.preprocessing_settings(PUBLISHED_PROCESSOR) == dict(
        height=640, width=640, rescale=0.00392156862745098, mean=None, std=None)
    normalized = {**PUBLISHED_PROCESSOR, "do_normalize": True, "size": {"height": 512,
                                                                        "width": 768}}
    assert rtdetr_config.preprocessing_settings(normalized) == dict(
        height=512, width=768, rescale=0.00392156862745098, mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225))
