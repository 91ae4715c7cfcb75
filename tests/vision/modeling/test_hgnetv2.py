"""`vision.modeling.hgnetv2` against transformers' ``HGNetV2Backbone`` at random weights, and
`vision.pretrained.hgnetv2_config.hgnetv2_settings` on the published field set.

reference_hgnetv2.py runs two tiny transformers backbones (affine blocks on and off, light and
ordinary stages, with and without downsampling, two blocks in a stage, images of odd size) in
a process of its own; each config.json, read by `hgnetv2_settings`, and its state, mapped by
`transformers_arrays` (every tensor read, every weight given), must give every returned
feature map within 1e-4 of the map's scale.
"""

import json

import keras
import numpy as np
import pytest

from vision.modeling.hgnetv2 import HGNetV2Backbone, transformers_arrays
from vision.pretrained.hgnetv2_config import hgnetv2_settings

# The tests reading the reference stay on one worker, which runs it once.
pytestmark = pytest.mark.xdist_group("torch_reference")
PREFIX = "model.backbone.model."  # a DFineForObjectDetection's backbone
# ustc-community/dfine-small-coco's backbone_config, as published (every field).
PUBLISHED_SMALL = {
    "depths": [3, 4, 6, 3], "downsample_in_bottleneck": False,
    "downsample_in_first_stage": False, "embedding_size": 32, "hidden_act": "relu",
    "hidden_sizes": [128, 256, 512, 1024], "initializer_range": 0.02, "layer_type": "basic",
    "model_type": "hgnet_v2", "num_channels": 3, "out_features": ["stage2", "stage3", "stage4"],
    "out_indices": [2, 3, 4], "stage_downsample": [False, True, True, True],
    "stage_downsample_strides": [2, 2, 2, 2], "stage_in_channels": [16, 64, 256, 512],
    "stage_kernel_size": [3, 3, 5, 5], "stage_light_block": [False, False, True, True],
    "stage_mid_channels": [16, 32, 64, 128],
    "stage_names": ["stem", "stage1", "stage2", "stage3", "stage4"],
    "stage_num_blocks": [1, 1, 2, 1], "stage_numb_of_layers": [3, 3, 3, 3],
    "stage_out_channels": [64, 256, 512, 1024], "stem_channels": [3, 16, 16],
    "stem_strides": [2, 1, 1, 2, 1], "use_learnable_affine_block": True,
}
TINY = dict(stem_channels=(3, 8, 8), stage_in_channels=(8, 8), stage_mid_channels=(4, 4),
            stage_out_channels=(8, 12), stage_num_blocks=(2, 1), stage_downsample=(False, True),
            stage_downsample_strides=(2, 2), stage_light_block=(False, True),
            stage_kernel_size=(3, 3), stage_numb_of_layers=(2, 2),
            use_learnable_affine_block=True, out_indices=(1, 2))


@pytest.fixture(scope="module")
def reference(torch_references):
    return dict(np.load(torch_references["hgnetv2"]))  # reference_hgnetv2.py's arrays


def converted(arrays: dict, variant: str):
    """The variant's backbone from its config.json, with its state's weights; checks that
    every tensor is read and every weight given."""
    config = json.loads(str(arrays[f"{variant}/config"]))
    backbone = HGNetV2Backbone(**hgnetv2_settings(config, f"{variant}/config.json"),
                               name="backbone")
    backbone.build((None, None, None, 3))
    state = {key.split("/", 2)[2]: value for key, value in arrays.items()
             if key.startswith(f"{variant}/state/")}
    pairs = list(transformers_arrays(state, PREFIX))
    assert len(pairs) == sum(not key.endswith("num_batches_tracked") for key in state)
    weights = {variable.path: variable for variable in backbone.weights}
    assert {f"backbone/{path}" for path, _ in pairs} == set(weights)
    for path, array in pairs:
        weights[f"backbone/{path}"].assign(array)
    return backbone


@pytest.mark.parametrize("variant", ["lab", "plain"])
def test_feature_maps_match_transformers_hgnetv2(reference, variant):
    backbone = converted(reference, variant)
    images = reference["images"]
    features = [np.asarray(f) for f in backbone(images)]
    expected = [reference[f"{variant}/feature_{i}"] for i in range(len(features))]
    assert f"{variant}/feature_{len(features)}" not in reference
    assert [f.shape for f in features] == backbone.compute_output_shape(images.shape)
    for got, want in zip(features, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_published_small_config_gives_its_backbone():
    settings = hgnetv2_settings(PUBLISHED_SMALL)
    assert settings == dict(
        stem_channels=[3, 16, 16], stem_strides=[2, 1, 1, 2, 1],
        stage_in_channels=[16, 64, 256, 512], stage_mid_channels=[16, 32, 64, 128],
        stage_out_channels=[64, 256, 512, 1024], stage_num_blocks=[1, 1, 2, 1],
        stage_downsample_strides=[2, 2, 2, 2], stage_kernel_size=[3, 3, 5, 5],
        stage_numb_of_layers=[3, 3, 3, 3], stage_downsample=[False, True, True, True],
        stage_light_block=[False, False, True, True], use_learnable_affine_block=True,
        hidden_act="relu", out_indices=[2, 3, 4])
    backbone = HGNetV2Backbone(**settings)
    assert backbone.output_channels == (256, 512, 1024) and backbone.strides == (8, 16, 32)
    nano = {**PUBLISHED_SMALL, "out_indices": [3, 4], "out_features": ["stage3", "stage4"]}
    assert hgnetv2_settings(nano)["out_indices"] == [3, 4]
    assert hgnetv2_settings({"model_type": "hgnet_v2", "out_features": ["stage4"],
                             "transformers_version": "5.0.0"})["stage_num_blocks"] == [1, 1, 3, 1]


@pytest.mark.parametrize("field, value", [
    ("model_type", "rt_detr_resnet"),
    ("hidden_act", "mish"),
    ("stem_strides", [2, 2, 1, 2, 1]),
    ("stage_downsample_strides", [[2, 1], [1, 2], [2, 1], [2, 1]]),
    ("stage_kernel_size", [3, 3, 4, 5]),
    ("stage_num_blocks", [1, 1, 2]),
    ("hidden_sizes", [128, 256, 512, 2048]),  # stage4's channels are 1024
    ("out_features", ["stage2", "stage4"]),  # out_indices say stage3 too
    ("num_channels", 1),
])
def test_settings_refuse_a_value_the_backbone_does_not_implement_by_name(field, value):
    with pytest.raises(ValueError, match=rf"^dfine/config.json: {field}="):
        hgnetv2_settings({**PUBLISHED_SMALL, field: value}, "dfine/config.json")


def test_config_round_trip_and_a_copy_computes_the_same():
    backbone = HGNetV2Backbone(**TINY)
    config = backbone.get_config()
    copy = HGNetV2Backbone.from_config(json.loads(json.dumps(config)))
    assert copy.get_config() == config
    images = np.random.default_rng(0).standard_normal((1, 19, 26, 3)).astype("float32")
    backbone.build(images.shape)
    copy.build(images.shape)
    rng = np.random.default_rng(1)  # BatchNorm's statistics included: not the initial ones
    backbone.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32")
                          for w in backbone.get_weights()])
    copy.set_weights(backbone.get_weights())
    want, got = backbone(images), copy(images)
    assert [tuple(f.shape) for f in got] == [(1, 5, 7, 8), (1, 3, 4, 12)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Frozen BatchNorm; the convolutions and the affine blocks train.
    names = {v.path.split("/")[-2] for v in backbone.trainable_weights}
    assert not any("normalization" in n for n in names)
    assert "stages_1_blocks_0_layers_0_conv2_lab" in names
    assert "embedder_stem1_convolution" in names
    with pytest.raises(ValueError, match="stage_in_channels"):
        HGNetV2Backbone(**{**TINY, "stage_in_channels": (8, 16)})
    with pytest.raises(ValueError, match="stem_channels"):
        HGNetV2Backbone(**TINY)(keras.Input((8, 8, 1)))
