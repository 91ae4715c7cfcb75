"""`vision.pretrained.init_from.init_from`: a detector started from an export, a work directory or a
model.keras, the class heads kept, reordered or re-initialized, queries cut, misfits refused."""

import shutil
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.workdir import Workdir
from vision.config import preset
from vision.modeling.detr import build_model
from vision.pretrained.init_from import check_init_source, init_from
from vision.training.train import DetectionTask, train_detr

DETR_NAMES = ("circle", "square", "triangle")  # the session's detr_export (tests/conftest.py)
HEADS = ("class_head/kernel", "class_head/bias", "queries/proposal_class_head/kernel",
         "queries/proposal_class_head/bias")


def _small(config, **changes) -> dict:
    """The sizes of the session's small detector (``config``), with ``changes``."""
    fields = ("hidden_dim", "num_heads", "ffn_dim", "num_queries", "tiny_filters",
              "num_encoder_layers", "num_decoder_layers")
    return {**{name: getattr(config, name) for name in fields}, **changes}


def _arrays(model):
    return {v.path.removeprefix("detr/"): keras.ops.convert_to_numpy(v) for v in model.weights}


@pytest.fixture(scope="module")
def exported(detr_export):
    """The session's small detector (circle, square, triangle) and its export's variables,
    read back with TensorFlow alone: {path: array}."""
    model, path, config = detr_export
    loaded = tf.saved_model.load(str(path))
    variables = {v.name.removesuffix(":0").removeprefix("detr/"): v.numpy()
                 for v in loaded.variables}
    return path, config, variables


def test_an_export_sets_every_weight_and_another_class_list_gets_new_class_heads(exported):
    path, config, source = exported
    keras.utils.set_random_seed(5)
    model = build_model(config, 2)
    fresh, lines = _arrays(model), []
    report = init_from(model, path, ["cat", "dog"], lines.append)
    after = _arrays(model)
    assert set(after) == set(source) and len(after) > 50
    for key, value in after.items():
        np.testing.assert_array_equal(value, fresh[key] if key in HEADS else source[key],
                                      err_msg=key)
    assert all(source[key].shape[-1] == 4 and after[key].shape[-1] == 3 for key in HEADS)
    assert lines == ["class head: 4 → 3 outputs, re-initialized",
                     f"init from {path}: {len(after) - 4} of {len(after)} weights loaded"]
    assert sorted(report["reinitialized"]) == sorted(HEADS)


def test_the_same_classes_in_another_order_keep_their_columns(exported, tmp_path):
    path, config, source = exported
    work = tmp_path / "work"  # a finished run's work directory: its export/ is read
    shutil.copytree(path, work / "export")
    names = ["triangle", "circle", "square"]
    model, lines = build_model(config, 3), []
    init_from(model, work, names, lines.append)
    after = _arrays(model)
    columns = [DETR_NAMES.index(name) for name in names] + [3]  # "no object" stays last
    for key in HEADS:
        np.testing.assert_array_equal(after[key], source[key][..., columns], err_msg=key)
    assert not np.array_equal(after["class_head/kernel"], source["class_head/kernel"])
    assert lines[0] == "class head: the same 3 classes in another order, reordered by name"


def test_a_model_keras_file_and_its_first_queries(exported, tmp_path):
    config = exported[1]
    donor_config = preset("tiny-detr", **_small(config))  # vanilla DETR: a learned query_embed
    keras.utils.set_random_seed(1)
    donor = build_model(donor_config, 3)
    donor.save(tmp_path / "model.keras")
    source = _arrays(donor)
    fewer = build_model(preset("tiny-detr", **_small(config, num_queries=4)), 3)
    lines = []
    init_from(fewer, tmp_path, DETR_NAMES, lines.append)  # a directory with model.keras
    after = _arrays(fewer)
    np.testing.assert_array_equal(after["queries/query_embed"],
                                  source["queries/query_embed"][:4])
    for key in set(after) - {"queries/query_embed"}:
        np.testing.assert_array_equal(after[key], source[key], err_msg=key)
    # No classes.json beside it: the class heads are loaded as they are (same size).
    assert lines[0] == f"class head: {tmp_path / 'model.keras'} names no classes; its 4 " \
        "outputs are loaded as they are"
    more = build_model(preset("tiny-detr", **_small(config, num_queries=8)), 3)
    with pytest.raises(ValueError, match="has 6 queries, fewer than the 8 asked for"):
        init_from(more, tmp_path / "model.keras", DETR_NAMES, lines.append)


def test_what_cannot_fit_is_refused_naming_the_source(exported, tmp_path):
    path, config, _ = exported
    wider = build_model(preset("tiny", **_small(config, hidden_dim=48)), 3)
    with pytest.raises(ValueError, match=r"--init-from .*'input_proj/kernel' is \(1, 1, 32, "
                                         r"32\) there and \(1, 1, 32, 48\) here"):
        init_from(wider, path, DETR_NAMES, lambda *a: None)
    deeper = build_model(preset("tiny", **_small(config, num_decoder_layers=3)), 3)
    with pytest.raises(ValueError, match="it has no 'decoder/layer_2/"):
        init_from(deeper, path, DETR_NAMES, lambda *a: None)
    (tmp_path / "detr.onnx").write_bytes(b"\x80\x02")
    (tmp_path / "empty").mkdir()
    for source, message in ((tmp_path / "detr.onnx", "not a work directory, an export, a "
                             r"\.keras file or a DETR checkpoint \(\.pth, \.safetensors\)"),
                            (tmp_path / "missing", "no such file or directory"),
                            (tmp_path / "empty", "has no model.keras")):
        with pytest.raises(ValueError, match=f"--init-from {source}: .*{message}"):
            check_init_source(source)


class _FitStarted(Exception):
    pass


def test_train_detr_starts_a_new_run_from_it_and_a_resumed_one_from_its_own_state(
        exported, tmp_path, monkeypatch, dots_coco):
    path, config, source = exported
    data = dots_coco(tmp_path, [1, 2, 1, 1])  # one class, "dot": a new class list
    started = {}

    def fit(model, *args, **kwargs):  # the weights the first step would start from
        started.update(_arrays(model))
        raise _FitStarted

    monkeypatch.setattr(keras.Model, "fit", fit)
    run, lines = RunOptions(valid_fraction=0.0, max_steps=1), []
    small = preset("tiny", **_small(config, image_size=32, max_image_size=32))
    with pytest.raises(_FitStarted):
        train_detr(data, tmp_path / "run", small, run, log=lines.append, init_from=path)
    for key in set(source) - set(HEADS):
        np.testing.assert_array_equal(started[key], source[key], err_msg=key)
    assert "class head: 4 → 2 outputs, re-initialized" in lines

    # A run that resumes (an epoch in its backup) or only exports: its own weights win.
    task = DetectionTask(data, small, run, lines.append, init_from=path)
    trainer = types.SimpleNamespace(fresh=False, replicas=1, data_seed=0,
                                    workdir=Workdir(tmp_path / "run"))
    lines.clear()
    model = task.build_model(trainer, task.load_data(trainer))
    assert lines[-1] == (f"init: the run resumes from its own state; --init-from {path} is "
                         "not read again")
    assert not np.array_equal(_arrays(model)["input_proj/kernel"], source["input_proj/kernel"])
