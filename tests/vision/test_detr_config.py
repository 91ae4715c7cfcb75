"""Tests of `vision.config`: presets, overrides, validation in one place, model_kwargs."""

import dataclasses
import inspect

import pytest

from vision.config import PRESETS, DetrConfig, preset
from vision.modeling.detr import DETR
from vision.modeling.queries import QUERY_LAYERS


def test_r50_detr_holds_detrs_numbers():
    r50 = preset("r50-detr")  # facebookresearch/detr main.py defaults and the paper
    assert (r50.backbone, r50.hidden_dim, r50.num_heads) == ("resnet50", 256, 8)
    assert (r50.num_encoder_layers, r50.num_decoder_layers, r50.ffn_dim) == (6, 6, 2048)
    assert (r50.num_queries, r50.dropout, r50.norm_first) == (100, 0.1, False)
    assert (r50.learning_rate, r50.weight_decay, r50.clip_norm) == (1e-4, 1e-4, 0.1)
    assert r50.learning_rate * r50.backbone_lr_multiplier == pytest.approx(1e-5)
    assert (r50.eos_coef, r50.cost_class, r50.cost_bbox, r50.cost_giou) == (0.1, 1.0, 5.0, 2.0)
    assert (r50.query_type, r50.attention_radius, r50.box_refinement) == ("learned", None, False)
    assert DetrConfig() == r50


def test_r50_is_detr_with_the_convergence_aids_of_tiny():
    aided, vanilla, tiny = preset("r50"), preset("r50-detr"), preset("tiny")
    aids = {"query_type", "box_refinement", "attention_radius"}
    for field in dataclasses.fields(DetrConfig):
        if field.name in aids:
            assert getattr(aided, field.name) == getattr(tiny, field.name), field.name
        elif field.name != "name":
            assert getattr(aided, field.name) == getattr(vanilla, field.name), field.name
    assert aided.query_type == "encoder" and aided.box_refinement


def test_tiny_presets_share_the_size_and_differ_by_the_convergence_aids():
    vanilla, fast = preset("tiny-detr"), preset("tiny")
    size = ("backbone", "hidden_dim", "num_heads", "num_encoder_layers", "num_decoder_layers",
            "ffn_dim", "num_queries", "learning_rate", "batch_size", "image_size")
    assert [getattr(fast, f) for f in size] == [getattr(vanilla, f) for f in size]
    # Vanilla DETR: DETR's query type, dropout, augmentation and backbone ratio.
    r50 = preset("r50-detr")
    for field in ("query_type", "attention_radius", "box_refinement", "dropout",
                  "augmentation", "backbone_lr_multiplier"):
        assert getattr(vanilla, field) == getattr(r50, field), field
    assert (fast.query_type, fast.box_refinement) == ("encoder", True)
    assert fast.attention_radius > 0 and fast.dropout == 0.0
    assert (fast.backbone_lr_multiplier, fast.augmentation) == (1.0, "flip")


def test_overrides_make_a_new_frozen_config():
    tiny = preset("tiny", num_queries=7)
    assert tiny.num_queries == 7
    assert preset("tiny").num_queries == PRESETS["tiny"].num_queries  # unchanged preset
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.hidden_dim = 64
    with pytest.raises(ValueError, match="num_querys"):
        preset("tiny", num_querys=3)
    with pytest.raises(ValueError, match="'huge'"):
        preset("huge")
    assert "num_classes" not in {f.name for f in dataclasses.fields(DetrConfig)}
    assert preset("tiny", tiny_filters=[8, 16]).tiny_filters == (8, 16)


def test_model_kwargs_are_the_detr_arguments():
    config = preset("tiny", num_queries=9, attention_radius=0.2)
    params = set(inspect.signature(DETR.__init__).parameters)
    assert set(config.model_kwargs()) == params - {"self", "num_classes", "backbone", "kwargs"}
    assert config.model_kwargs()["num_queries"] == 9
    assert config.model_kwargs()["attention_radius"] == 0.2
    assert config.backbone_kwargs() == {"name": "tiny", "weights": None,
                                        "filters": config.tiny_filters, "norm": "batch"}
    assert preset("r50").backbone_kwargs() == {"name": "resnet50", "weights": None}


@pytest.mark.parametrize("overrides, match", [
    ({"num_queries": 0}, "num_queries=0"),
    ({"num_heads": True}, "num_heads=True"),
    ({"hidden_dim": 130}, "multiple of 4 and of num_heads=4. Received: hidden_dim=130"),
    ({"hidden_dim": 136, "num_heads": 16}, "num_heads=16. Received: hidden_dim=136"),
    ({"dropout": 1.0}, "dropout=1.0"),
    ({"learning_rate": 0}, "learning_rate=0"),
    ({"backbone_lr_multiplier": -0.1}, "backbone_lr_multiplier=-0.1"),
    ({"eos_coef": "0.1"}, "eos_coef='0.1'"),
    ({"aux_loss": 1}, "aux_loss=1"),
    ({"tiny_filters": ()}, "tiny_filters=()"),
    ({"backbone": "vgg"}, "backbone='vgg'"),
    ({"backbone_weights": "w.h5"}, "backbone_weights='w.h5'"),  # tiny has no weights
    ({"matcher_solver": "greedy"}, "matcher_solver='greedy'"),
    ({"augmentation": "crop"}, "augmentation='crop'"),
    ({"lr_drop_fraction": 1.5}, "lr_drop_fraction=1.5"),
    ({"clip_norm": 0}, "clip_norm=0"),
    ({"cost_class": 0, "cost_bbox": 0, "cost_giou": 0}, "cost_class=0"),
    ({"query_type": "anchors"}, "query_type='anchors'"),
    ({"attention_radius": 0}, "attention_radius=0"),
    ({"dense_one_to_one": True}, "dense_one_to_one=True"),  # DEIM's: real-time ones only
    ({"attention_radius": True}, "attention_radius=True"),
    # Combinations: refinement needs reference boxes, a radius needs reference points.
    ({"query_type": "reference"}, "box_refinement=True, query_type='reference'"),
    ({"query_type": "learned", "box_refinement": False}, "attention_radius=0.3, query_type="),
])
def test_each_bad_field_is_named_with_its_value(overrides, match):
    with pytest.raises(ValueError, match=match):
        preset("tiny", **overrides)
    with pytest.raises(ValueError, match=match):  # also built directly, not from a preset
        DetrConfig(**{**dataclasses.asdict(PRESETS["tiny"]), **overrides})


def test_every_query_type_is_accepted_exactly_with_the_aids_its_references_allow():
    for name, layer in QUERY_LAYERS.items():
        refine = layer.reference_size == 4
        radius = 0.3 if layer.reference_size else None
        preset("tiny", query_type=name, box_refinement=refine, attention_radius=radius)
        if not refine:  # box refinement needs reference boxes
            with pytest.raises(ValueError, match="box_refinement=True"):
                preset("tiny", query_type=name, box_refinement=True, attention_radius=radius)
        if radius is None:  # an attention radius needs reference points
            with pytest.raises(ValueError, match="attention_radius=0.3"):
                preset("tiny", query_type=name, box_refinement=False, attention_radius=0.3)
    # Each kind of query layer is there to be checked: learned, points, boxes.
    assert sorted({layer.reference_size for layer in QUERY_LAYERS.values()}) == [0, 2, 4]
