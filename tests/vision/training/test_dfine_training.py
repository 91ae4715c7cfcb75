"""D-FINE's training: FGL and DDF (`vision.matching.fdr_losses`) against transformers'
``DFineLoss.loss_local`` on reference_dfine.py's random distributions and matching, the
criterion's wiring on the converted tiny model, the presets' architectures against the
published configs, and ``--init-from`` a D-FINE folder. Needs the ``[reference]`` extra."""

import importlib.util

import numpy as np
import pytest

from vision.matching.fdr_losses import decoupled_distillation_loss, fine_grained_localization_loss
from vision.modeling.dfine_decoder import weighting_function
from vision.pretrained import dfine_config
from vision.pretrained import rtdetr as rtdetr_convert

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("the [reference] extra (pip install -e '.[reference]': torch, transformers) "
                "is not installed", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("torch_reference")


@pytest.fixture(scope="module")
def reference(torch_references):
    folder = torch_references["dfine"]
    return folder, dict(np.load(folder / "expected.npz"))


def test_fgl_and_ddf_are_transformers_loss_local(reference):
    """16 bins, 5 targets over 2 images matched to 5 of 14 queries; some edges beyond the
    outermost offsets on both sides (their weight all on the end bin)."""
    _, expected = reference
    matches = expected["loss_matches"]
    matched = matches >= 0
    targets = np.take_along_axis(expected["loss_targets"],
                                 np.maximum(matches, 0)[..., None].repeat(4, -1), axis=1)
    fgl = fine_grained_localization_loss(
        expected["loss_pred_corners"], expected["loss_ref_points"],
        expected["loss_pred_boxes"], targets, matched, 5.0, weighting_function(16), 4.0)
    ddf = decoupled_distillation_loss(
        expected["loss_pred_corners"], expected["loss_teacher_corners"],
        expected["loss_teacher_logits"], expected["loss_pred_boxes"], targets, matched,
        bins=17)
    np.testing.assert_allclose(float(fgl), expected["loss_fgl"], rtol=1e-5)
    np.testing.assert_allclose(float(ddf), expected["loss_ddf"], rtol=1e-5)


def test_every_layer_is_scored_on_its_own_distributions_and_boxes(reference):
    """Training mode with denoising queries: FGL on every layer, DDF on every earlier one
    against the last, the first layer's unrefined boxes (``_pre``), the cells (``_enc``) and
    the denoising queries' layers likewise; each term from that layer's own outputs."""
    import keras

    from vision.modeling.dfine import dfine_criterion

    folder, expected = reference
    model = rtdetr_convert.load_rtdetr(folder / "small")
    keras.utils.set_random_seed(0)
    targets = {"labels": np.array([[0, 3], [2, 0]], "int32"),
               "boxes": np.array([[[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]],
                                  [[0.5, 0.5, 0.4, 0.4], [0, 0, 0, 0]]], "float32"),
               "valid": np.array([[True, True], [True, False]])}
    outputs = model({"images": expected["images"], "targets": targets}, training=True)
    criterion = dfine_criterion(5, model.decoder)
    losses = criterion(outputs, targets)
    layers = model.decoder.num_layers  # 3
    for suffix in ("", "_dn"):
        assert {f"loss_fgl{suffix}", f"loss_vfl{suffix}_pre", f"loss_giou{suffix}_pre"} \
            <= set(losses)
        assert f"loss_ddf{suffix}" not in losses  # the teacher itself
        for i in range(layers - 1):
            assert {f"loss_fgl{suffix}_{i}", f"loss_ddf{suffix}_{i}"} <= set(losses)
    assert "loss_fgl_enc" not in losses and "loss_fgl_pre" not in losses
    # Layer 0's terms from layer 0's distributions, boxes and matching.
    layer = outputs["aux_outputs"][0]
    indices = criterion.matcher(layer["pred_logits"], layer["pred_boxes"], targets["labels"],
                                targets["boxes"], targets["valid"])
    indices = np.asarray(indices)
    own = np.take_along_axis(targets["boxes"], np.maximum(indices, 0)[..., None].repeat(4, -1),
                             axis=1)
    fgl = fine_grained_localization_loss(layer["pred_corners"], outputs["ref_points"],
                                         layer["pred_boxes"], own, indices >= 0, 3.0,
                                         criterion.project, 4.0)
    ddf = decoupled_distillation_loss(layer["pred_corners"], outputs["pred_corners"],
                                      outputs["pred_logits"], layer["pred_boxes"], own,
                                      indices >= 0, bins=17)
    np.testing.assert_allclose(float(losses["loss_fgl_0"]), float(fgl), rtol=1e-5)
    np.testing.assert_allclose(float(losses["loss_ddf_0"]), float(ddf), rtol=1e-5)
    weighted = sum(criterion._weight(name) * float(value) for name, value in losses.items()
                   if name != "loss")
    np.testing.assert_allclose(float(losses["loss"]), weighted, rtol=1e-5)
    assert criterion._weight("loss_ddf_dn_1") == 1.5 and criterion._weight("loss_fgl") == 0.15


# The published D-FINE configs' architecture fields, as transformers' conversion script
# (convert_d_fine_original_pytorch_checkpoint_to_hf.py) writes them for each size.
PUBLISHED = {
    "n": dict(encoder_in_channels=[512, 1024], encoder_hidden_dim=128, d_model=128,
              decoder_layers=3, decoder_n_points=[6, 6], num_feature_levels=2,
              depth_mult=0.5, hidden_expansion=0.34, stage_out_channels=[64, 256, 512, 1024]),
    "s": dict(encoder_in_channels=[256, 512, 1024], encoder_hidden_dim=256, d_model=256,
              decoder_layers=3, decoder_n_points=[3, 6, 3], num_feature_levels=3,
              depth_mult=0.34, hidden_expansion=0.5, stage_out_channels=[64, 256, 512, 1024]),
    "m": dict(encoder_in_channels=[384, 768, 1536], encoder_hidden_dim=256, d_model=256,
              decoder_layers=4, decoder_n_points=[3, 6, 3], num_feature_levels=3,
              depth_mult=0.67, hidden_expansion=1.0, stage_out_channels=[96, 384, 768, 1536]),
    "l": dict(encoder_in_channels=[512, 1024, 2048], encoder_hidden_dim=256, d_model=256,
              decoder_layers=6, decoder_n_points=[3, 6, 3], num_feature_levels=3,
              depth_mult=1.0, hidden_expansion=1.0,
              stage_out_channels=[128, 512, 1024, 2048]),
    "x": dict(encoder_in_channels=[512, 1024, 2048], encoder_hidden_dim=384, d_model=256,
              decoder_layers=6, decoder_n_points=[3, 6, 3], num_feature_levels=3,
              depth_mult=1.0, hidden_expansion=1.0,
              stage_out_channels=[128, 512, 1024, 2048]),
}


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_each_preset_is_the_published_architecture(size):
    from vision.config import preset

    config = preset(f"dfine-{size}")
    settings = dfine_config.dfine_settings(config.rtdetr, f"preset dfine-{size}")
    want = PUBLISHED[size]
    assert settings["encoder"]["hidden_dim"] == want["encoder_hidden_dim"]
    assert settings["encoder"]["num_blocks"] == round(3 * want["depth_mult"])
    assert settings["encoder"]["hidden_expansion"] == want["hidden_expansion"]
    assert settings["model"]["d_model"] == want["d_model"]
    assert settings["decoder"]["num_layers"] == want["decoder_layers"]
    assert settings["decoder"]["num_points"] == want["decoder_n_points"]
    assert settings["decoder"]["num_levels"] == want["num_feature_levels"]
    assert settings["backbone"]["stage_out_channels"] == want["stage_out_channels"]
    out = settings["backbone"]["out_indices"]
    assert [want["stage_out_channels"][i - 1] for i in out] == want["encoder_in_channels"]


def test_init_from_a_dfine_folder_loads_all_but_the_class_heads(reference):
    from vision.config import preset
    from vision.pretrained.init_from import init_from, rtdetr_folder_config
    from vision.training.train import build_rtdetr_model

    folder, _ = reference
    config = preset("dfine-tiny", rtdetr=rtdetr_folder_config(folder / "small"),
                    num_queries=10)
    model, criterion = build_rtdetr_model(config, 2)
    assert type(criterion).__name__ == "DFineCriterion"
    lines = []
    init_from(model, folder / "small", ["dog", "cat"], lines.append)
    # enc_score_head's and the 3 class heads' kernels and biases, the denoising labels.
    heads = 2 * (1 + 3) + 1
    assert lines == ["class head: 5 → 2 outputs, re-initialized",
                     f"init from {folder / 'small'}: {len(model.weights) - heads} of "
                     f"{len(model.weights)} weights loaded"]
