"""RT-DETR's training loss (`vision.modeling.rtdetr.rtdetr_criterion`: focal matching cost,
varifocal loss, L1 / GIoU on every decoder layer and the selected cells) against
transformers' ``RTDetrForObjectDetection(labels=...)`` on the converted tiny model of
reference_rtdetr.py: the loss terms in eval mode and in training mode (without and with
denoising queries), and the gradients. Needs the ``[reference]`` extra."""

import importlib.util

import numpy as np
import pytest

from vision.modeling.rtdetr import rtdetr_criterion
from vision.pretrained import rtdetr as rtdetr_convert

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("the [reference] extra (pip install -e '.[reference]': torch, transformers) "
                "is not installed", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("torch_reference")

WEIGHTS = {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}  # RTDetrConfig's defaults


@pytest.fixture(scope="module")
def reference(torch_references):
    folder = torch_references["rtdetr"]
    return folder, dict(np.load(folder / "expected.npz"))


def _targets(expected):
    return {"labels": expected["loss_labels"], "boxes": expected["loss_boxes"],
            "valid": expected["loss_valid"]}


def _assert_transformers_terms(losses, expected, mode, layers):
    """Our unweighted terms times their weights against transformers' weighted ``loss_dict``:
    its ``_aux_i`` are our earlier layers ``_i`` and, last, the selected cells (``_enc``)."""
    compared = 0
    for key in expected:
        if not key.startswith(f"{mode}_loss_"):
            continue
        name = key[len(mode) + 1:]
        base, _, aux = name.partition("_aux_")
        ours = base if not aux else f"{base}_enc" if int(aux) == layers - 1 else name.replace(
            "_aux", "")
        np.testing.assert_allclose(WEIGHTS[base] * float(losses[ours]), expected[key],
                                   rtol=2e-5, atol=2e-6, err_msg=f"{mode} {name} ({ours})")
        compared += 1
    assert compared == 3 * (layers + 1)  # the last layer, the earlier ones, the cells
    np.testing.assert_allclose(float(losses["loss"]), expected[f"{mode}_loss"], rtol=2e-5)


def test_eval_mode_loss_and_the_compiled_default_are_transformers(reference):
    folder, expected = reference
    model = rtdetr_convert.load_rtdetr(folder / "rtdetr")
    model.compile()  # RT-DETR's criterion by default
    assert model.criterion.classification == "varifocal"
    losses = model.criterion(model(expected["images"]), _targets(expected))
    _assert_transformers_terms(losses, expected, "eval", layers=2)
    metrics = model.evaluate(expected["images"], _targets(expected), batch_size=2,
                             verbose=0, return_dict=True)
    np.testing.assert_allclose(metrics["loss"], expected["eval_loss"], rtol=2e-5)
    np.testing.assert_allclose(metrics["loss_vfl"], expected["eval_loss_vfl"], rtol=2e-5)


def test_training_mode_loss_and_every_gradient_are_transformers(reference):
    import tensorflow as tf

    folder, expected = reference
    model = rtdetr_convert.load_rtdetr(folder / "rtdetr")
    criterion = rtdetr_criterion(5)
    with tf.GradientTape() as tape:
        losses = criterion(model(expected["images"], training=True), _targets(expected))
    _assert_transformers_terms(losses, expected, "train", layers=2)
    grads = tape.gradient(losses["loss"], model.trainable_variables)
    theirs = rtdetr_convert.read_rtdetr(folder / "rtdetr_grads").arrays
    largest = max(float(np.abs(g).max()) for g in theirs.values())
    for variable, grad in zip(model.trainable_variables, grads):
        key = variable.path.split("/", 1)[1]
        if key == "denoising/label_embed":  # no denoising queries here (the next test)
            continue
        ours = np.zeros(variable.shape) if grad is None else np.asarray(grad)
        # float32 rounding through the whole network: 1e-3 of the weight's own largest
        # gradient (2.7e-4 measured), and 1e-6 of the model's for the ones that are 0
        # mathematically (a key bias, a shift before a BatchNorm: 6e-7 measured).
        bound = 1e-3 * float(np.abs(theirs[key]).max()) + 1e-6 * largest
        assert float(np.abs(ours - theirs[key]).max()) <= bound, key
        assert float(np.abs(theirs[key]).max()) > 0, key  # every weight takes part


def test_denoising_queries_given_transformers_noise_give_its_losses_and_gradient(reference,
                                                                               tmp_path):
    import json
    import shutil

    import tensorflow as tf

    folder, expected = reference
    shutil.copytree(folder / "rtdetr", tmp_path / "rtdetr")
    config = json.loads((tmp_path / "rtdetr" / "config.json").read_text())
    assert config["num_denoising"] == 100  # transformers' default, as published
    config["num_denoising"] = 6  # 6 // 3 objects: 2 groups, as the reference run
    (tmp_path / "rtdetr" / "config.json").write_text(json.dumps(config))
    model = rtdetr_convert.load_rtdetr(tmp_path / "rtdetr")
    drawn = []

    def draw(labels, boxes, positive):  # transformers' noise instead of a new one
        drawn.append(labels.shape)
        return expected["dn_labels"], expected["dn_reference"]

    model.denoising.draw = draw
    targets = _targets(expected)
    with tf.GradientTape() as tape:
        outputs = model({"images": expected["images"], "targets": targets}, training=True)
        losses = rtdetr_criterion(5)(outputs, targets)
    assert drawn == [(2, 12)]  # 2 groups x (3 positives + 3 negatives)
    layers, compared = 2, 0
    for key in expected:
        if not key.startswith("dn_loss_"):
            continue
        name = key[3:]
        base, _, dn = name.partition("_dn_")
        if dn:  # theirs number every layer, ours leave the last unnumbered
            ours = f"{base}_dn" + ("" if int(dn) == layers - 1 else f"_{dn}")
            np.testing.assert_allclose(WEIGHTS[base] * float(losses[ours]), expected[key],
                                       rtol=2e-5, atol=2e-6, err_msg=name)
            compared += 1
        else:  # the matching queries' terms: as without denoising queries
            np.testing.assert_allclose(expected[key], expected[f"train_{name}"], rtol=1e-5)
    assert compared == 3 * layers
    np.testing.assert_allclose(float(losses["loss"]), expected["dn_loss"], rtol=2e-5)
    variable = next(v for v in model.trainable_variables if v.path.endswith("label_embed"))
    grad = tf.convert_to_tensor(tape.gradient(losses["loss"], variable)).numpy()
    theirs = expected["dn_embed_grad"]
    assert np.abs(theirs).max() > 0
    np.testing.assert_allclose(grad, theirs, atol=1e-3 * float(np.abs(theirs).max()))
    # Traced with a count of targets known only at run time (as fit's data gives them), the
    # matching queries keep their static count: the "ops" solver (XLA) needs it.
    del model.denoising.draw  # its own noise again
    shapes = []

    @tf.function
    def trace(images, labels, boxes, valid):
        out = model({"images": images, "targets": {"labels": labels, "boxes": boxes,
                                                   "valid": valid}}, training=True)
        shapes.append(out["pred_logits"].shape.as_list())
        return out["pred_logits"]

    trace.get_concrete_function(tf.TensorSpec((2, 64, 96, 3)), tf.TensorSpec((2, None), "int32"),
                                tf.TensorSpec((2, None, 4)), tf.TensorSpec((2, None), "bool"))
    assert shapes == [[2, 10, 5]]


def test_init_from_an_rtdetr_folder_reinitializes_or_reorders_the_class_heads(reference):
    import keras

    from vision.config import preset
    from vision.pretrained.init_from import init_from, rtdetr_folder_config
    from vision.training.train import build_rtdetr_model

    folder, _ = reference
    source = rtdetr_convert.load_rtdetr(folder / "rtdetr")
    names = list(source.class_names)  # cat, dog, bird, fish, horse
    config = preset("rtdetr-tiny", rtdetr=rtdetr_folder_config(folder / "rtdetr"),
                    num_queries=10)
    model, _ = build_rtdetr_model(config, 2)
    lines = []
    init_from(model, folder / "rtdetr", ["cat", "dog"], lines.append)
    # Kernel and bias of enc_score_head, class_head_0, class_head_1; the denoising labels.
    heads = 2 * (1 + 2) + 1
    assert lines == ["class head: 5 → 2 outputs, re-initialized",
                     f"init from {folder / 'rtdetr'}: {len(model.weights) - heads} of "
                     f"{len(model.weights)} weights loaded"]

    def array(m, path):
        return next(keras.ops.convert_to_numpy(v) for v in m.weights
                    if v.path.split("/", 1)[1] == path)

    key = "backbone/embedder_0_convolution/kernel"
    np.testing.assert_array_equal(array(model, key), array(source, key))
    # The same classes in another order: every head's columns follow the names (no
    # "no object" column in RT-DETR's heads).
    order = [4, 2, 0, 1, 3]
    model, _ = build_rtdetr_model(config, 5)
    lines = []
    init_from(model, folder / "rtdetr", [names[i] for i in order], lines.append)
    assert lines[0] == "class head: the same 5 classes in another order, reordered by name"
    for head in ("enc_score_head", "decoder/class_head_1"):
        np.testing.assert_array_equal(array(model, f"{head}/kernel"),
                                      array(source, f"{head}/kernel")[:, order])
        np.testing.assert_array_equal(array(model, f"{head}/bias"),
                                      array(source, f"{head}/bias")[order])
    # The denoising labels' rows too, the padding row last.
    np.testing.assert_array_equal(array(model, "denoising/label_embed"),
                                  array(source, "denoising/label_embed")[order + [5]])


@pytest.mark.slow
def test_train_detr_fine_tunes_an_rtdetr_folder_to_new_classes(reference, tmp_path):
    import json

    from vision.commands import train
    from vision.data.augment import FixedSize

    folder, _ = reference
    work = tmp_path / "work"
    # One step, two held-out images scored: the run's own scoring is DETR's (tests/scripts);
    # the export of an RT-DETR is checked against transformers in test_rtdetr_convert.py.
    assert train.main(["--data", "embedded", "--preset", "rtdetr-tiny", "--init-from",
                       str(folder / "rtdetr"), "--workdir", str(work), "--max-steps", "1",
                       "--eval-limit", "2", "--batch-size", "2"]) == 0
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["config"]["architecture"] == "rtdetr"
    assert metrics["config"]["rtdetr"]["d_model"] == 32  # the folder's, not the preset's 128
    assert metrics["valid"]["n"] == 2
    size = FixedSize(**json.loads((work / "export" / "preprocessing.json").read_text()))
    assert size == FixedSize(128, 128)  # the preset's size, the processor's pixels / 255
    classes = json.loads((work / "export" / "classes.json").read_text())
    assert classes["class_names"] == ["circle", "square", "triangle"]


def test_an_rtdetr_folder_with_a_detr_preset_is_one_error_line(reference, tmp_path, capsys):
    from vision.commands import train

    folder, _ = reference
    code = train.main(["--data", "embedded", "--init-from", str(folder / "rtdetr"),
                       "--workdir", str(tmp_path / "work"), "--max-steps", "1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1
    assert "needs an RT-DETR preset" in errors[0] and "--preset tiny" in errors[0]
    assert not (tmp_path / "work").exists()
