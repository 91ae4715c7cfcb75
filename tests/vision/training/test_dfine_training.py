"""D-FINE's training: FGL and DDF (`vision.matching.fdr_losses`) against transformers'
``DFineLoss.loss_local`` on reference_dfine.py's random distributions and matching, the
criterion's wiring on the converted tiny model, its training-mode loss terms and gradients
against transformers' ``DFineForObjectDetection(labels=...)``, the presets' architectures
against the published configs, and ``--init-from`` a D-FINE folder. Needs the
``[reference]`` extra."""

import dataclasses
import importlib.util
import re

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


WEIGHTS = {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15,
           "loss_ddf": 1.5}  # DFineConfig's defaults


def _transformers_pairing(outputs: dict) -> dict:
    """Our outputs paired as transformers 5.25's ``DFineForObjectDetectionLoss`` pairs its
    own: auxiliary entry ``i`` is layer ``i``'s distributions with layer ``i - 1``'s logits
    and boxes (layer -1: the unrefined ``pre_outputs``); the last layer gets no FGL (see
    experiments/README.md, "The loss's layer pairing"). Ours score each layer on its own."""
    teacher = {"ref_points": outputs["ref_points"],
               "teacher_corners": outputs["pred_corners"], "teacher_logits":
               outputs["pred_logits"]}  # no gradient: the criterion stops it
    earlier = [outputs["pre_outputs"], *outputs["aux_outputs"][:-1]]
    aux = [{"pred_logits": scored["pred_logits"], "pred_boxes": scored["pred_boxes"],
            "pred_corners": layer["pred_corners"], **teacher}
           for scored, layer in zip(earlier, outputs["aux_outputs"])]
    return {"pred_logits": outputs["pred_logits"], "pred_boxes": outputs["pred_boxes"],
            "aux_outputs": aux, "enc_outputs": outputs["enc_outputs"]}


def test_training_mode_loss_and_every_gradient_are_transformers(reference):
    """``small`` in training mode without denoising queries against transformers'
    ``DFineForObjectDetection(labels=...)``. Our criterion gives its terms of the last layer,
    the pre-refinement boxes, layer 0 and the cells as they are; transformers' FGL and DDF
    (and so its total and gradients) pair each layer's distributions with the previous
    layer's boxes, which `_transformers_pairing` reproduces from our outputs."""
    import tensorflow as tf

    from vision.modeling.dfine import dfine_criterion

    folder, expected = reference
    assert expected["small_train_margin"] > 5e-4  # the selections keep clear of ties
    model = rtdetr_convert.load_rtdetr(folder / "small")
    criterion = dfine_criterion(5, model.decoder)
    targets = {key: expected[f"small_train_{key}"] for key in ("labels", "boxes", "valid")}
    with tf.GradientTape() as tape:
        outputs = model(expected["images"], training=True)
        ours = criterion(outputs, targets)
        paired = criterion(_transformers_pairing(outputs), targets)
    layers = model.decoder.num_layers  # 3: transformers' _aux_0 .. _aux_2
    theirs = {key[len("small_train_"):]: float(value) for key, value in expected.items()
              if key.startswith("small_train_loss_")}
    assert len(theirs) == 3 + 5 * (layers - 1) + 3  # last, the paired layers, the cells

    def check(losses, name, ours_name, err):
        base = re.sub(r"_aux_\d+$", "", name)
        np.testing.assert_allclose(WEIGHTS[base] * float(losses[ours_name]), theirs[name],
                                   rtol=2e-5, atol=2e-6, err_msg=f"{err} {name} ({ours_name})")

    # As our criterion scores them: _aux_0 is the unrefined boxes, _aux_i layer i - 1's,
    # the last the cells; none of transformers' terms is our last layer's FGL or layer
    # L - 2's logits and boxes (loss_*_1 here), and its FGL and DDF are paired otherwise.
    direct = 0
    for name in theirs:
        base, _, aux = name.partition("_aux_")
        if base in ("loss_fgl", "loss_ddf"):
            continue
        suffix = "" if not aux else "_pre" if aux == "0" else "_enc" if int(aux) == \
            layers - 1 else f"_{int(aux) - 1}"
        check(ours, name, base + suffix, "ours")
        direct += 1
    assert direct == 3 * (layers + 1)
    # Paired as transformers pairs them: every term, the total and the gradients.
    for name in theirs:
        base, _, aux = name.partition("_aux_")
        check(paired, name, base if not aux else f"{base}_enc" if int(aux) == layers - 1
              else f"{base}_{aux}", "paired")
    assert len(paired) == len(theirs) + 1
    np.testing.assert_allclose(float(paired["loss"]), expected["small_train_loss"], rtol=2e-5)
    grads = tape.gradient(paired["loss"], model.trainable_variables)
    # transformers 5.25 ties each top-level head to the decoder's of the same layer (one
    # parameter, saved once as model.decoder.*); its regexes that would tie every layer's
    # heads to layer 0's are overridden, so each layer's head is its own, as ours.
    assert not expected["small_train_tied_heads"]
    theirs_grads = rtdetr_convert.read_rtdetr(folder / "small_grads").arrays
    largest = max(float(np.abs(theirs_grads[v.path.split("/", 1)[1]]).max())
                  for v in model.trainable_variables)
    # Layer L - 2's logits are in none of transformers' terms (its auxiliary entry L - 2
    # scores layer L - 3's): its class head and LQE get no gradient there (ours do).
    unused = re.compile(rf"decoder/(class_head_{layers - 2}|lqe_{layers - 2})/.*")
    for variable, grad in zip(model.trainable_variables, grads):
        key = variable.path.split("/", 1)[1]
        if key == "denoising/label_embed":  # no denoising queries here
            continue
        want = theirs_grads[key]
        got = np.zeros(variable.shape) if grad is None else np.asarray(grad)
        # float32 rounding through the whole network, as RT-DETR's test bounds it.
        bound = 1e-3 * float(np.abs(want).max()) + 1e-6 * largest
        assert float(np.abs(got - want).max()) <= bound, key
        # every other weight takes part
        assert (float(np.abs(want).max()) > 0) != bool(unused.fullmatch(key)), key


DEIM_WEIGHTS = {**WEIGHTS, "loss_mal": 1.0}  # Deimv2Config's weight_loss_mal


def test_deim_losses_are_transformers_deimv2_criterion(reference):
    """DEIM's losses (the matchability-aware loss, gamma 1.5; dense one-to-one box, FGL and
    DDF terms) on the training-mode outputs of ``small`` against transformers' DEIMv2
    criterion on the same outputs, paired as transformers pairs them."""
    from vision.modeling.dfine import dfine_criterion

    folder, expected = reference
    model = rtdetr_convert.load_rtdetr(folder / "small")
    criterion = dfine_criterion(5, model.decoder, matchability_aware_loss=True,
                                dense_one_to_one=True)
    targets = {key: expected[f"small_train_{key}"] for key in ("labels", "boxes", "valid")}
    outputs = model(expected["images"], training=True)
    ours = criterion(_transformers_pairing(outputs), targets)
    theirs = {key[len("small_deim_"):]: float(value) for key, value in expected.items()
              if key.startswith("small_deim_loss_")}
    layers = model.decoder.num_layers
    assert "loss_mal" in theirs and "loss_vfl" not in theirs
    for name, value in theirs.items():
        base, _, aux = name.partition("_aux_")
        mine = base if not aux else f"{base}_enc" if int(aux) == layers - 1 else \
            f"{base}_{aux}"
        np.testing.assert_allclose(DEIM_WEIGHTS[base] * float(ours[mine]), value, rtol=2e-5,
                                   atol=2e-6, err_msg=f"{name} ({mine})")
    assert len(ours) == len(theirs) + 1
    np.testing.assert_allclose(float(ours["loss"]), expected["small_deim_loss"], rtol=2e-5)
    # The dense matching moved the box terms: without it they are the one-to-one ones.
    plain = dfine_criterion(5, model.decoder)(_transformers_pairing(outputs), targets)
    moved = [name for name in plain if name.startswith("loss_bbox")
             and abs(float(plain[name]) - float(ours[name])) > 1e-4]
    assert len(moved) >= 2, moved


def test_union_of_matches_is_transformers_dense_one_to_one(reference):
    from vision.matching.dense import union_of_matches

    _, expected = reference
    union = union_of_matches(list(expected["union_matches"]), 3)
    np.testing.assert_array_equal(np.asarray(union), expected["union_indices"])
    # A query two layers disagree on once each: the lower target.
    tie = union_of_matches([np.array([[1, -1]]), np.array([[0, -1]])], 2)
    np.testing.assert_array_equal(np.asarray(tie), [[0, -1]])


def test_matchability_aware_loss_is_its_formula():
    """The loss written out in NumPy, with and without ``alpha``, one query invalid."""
    from vision.matching.terms import matchability_aware_loss

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 4, 3)).astype("float32") * 2
    centres, sides = rng.uniform(0.3, 0.7, (2, 2, 4, 2))
    pred = np.concatenate([centres, sides * 0.5], -1).astype("float32")
    target = (pred + rng.normal(0, 0.05, pred.shape)).astype("float32")
    labels = rng.integers(0, 3, (2, 4)).astype("int32")
    matched = np.array([[True, False, True, False], [False, True, True, True]])
    valid = np.array([[True, True, True, True], [True, True, False, True]])

    def iou(a, b):
        a0, a1 = a[..., :2] - a[..., 2:] / 2, a[..., :2] + a[..., 2:] / 2
        b0, b1 = b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2
        inter = np.prod(np.clip(np.minimum(a1, b1) - np.maximum(a0, b0), 0, None), -1)
        return inter / (np.prod(a[..., 2:], -1) + np.prod(b[..., 2:], -1) - inter)

    for alpha in (None, 0.75):
        total = 0.0
        for b, q, c in np.ndindex(*logits.shape):
            if not valid[b, q]:
                continue
            p = 1 / (1 + np.exp(-logits[b, q, c]))
            positive = matched[b, q] and labels[b, q] == c
            t = iou(pred[b, q], target[b, q]) ** 1.5 if positive else 0.0
            w = 1.0 if positive else (alpha or 1.0) * p ** 1.5
            total += -w * (t * np.log(p) + (1 - t) * np.log(1 - p))
        got = matchability_aware_loss(logits, pred, target, labels, matched, valid, 1.5, alpha)
        np.testing.assert_allclose(float(got), total, rtol=1e-5)


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
    assert (criterion.classification, criterion.dense_one_to_one) == ("varifocal", False)
    # --deim: DEIM's losses at the config's weights, and the model's tracker named for them.
    _, deim = build_rtdetr_model(dataclasses.replace(
        config, matchability_aware_loss=True, dense_one_to_one=True, loss_ce=2.0), 2)
    assert (deim.classification, deim.focal_gamma, deim.dense_one_to_one) == (
        "matchability", 1.5, True)
    assert deim.weight_dict["loss_mal"] == 2.0 and "loss_vfl" not in deim.weight_dict
    model.compile(criterion=deim)
    assert model.loss_trackers[0].name == "loss_mal"
    lines = []
    init_from(model, folder / "small", ["dog", "cat"], lines.append)
    # enc_score_head's and the 3 class heads' kernels and biases, the denoising labels.
    heads = 2 * (1 + 3) + 1
    assert lines == ["class head: 5 → 2 outputs, re-initialized",
                     f"init from {folder / 'small'}: {len(model.weights) - heads} of "
                     f"{len(model.weights)} weights loaded"]
