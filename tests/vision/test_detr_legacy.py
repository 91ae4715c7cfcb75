"""Old-layout DETR files (saved before the query layers) convert and load with equal outputs.

The fixtures in ``data/`` were written by the code before the change
(``data/make_legacy_fixtures.py``, which documents how); outputs are compared with the ones
that code saved, before and after one more training step (so the optimizer state moved
with its variables).
"""

import gzip
import importlib.util
import os
import shutil

import h5py
import keras
import numpy as np
import pytest

from tfx_transformer.training.cli import run_cli
from vision.config import preset
from vision.legacy import _move_slots, convert_legacy_weights
from vision.modeling.detr import build_criterion, build_model
from vision.training.optimizer import build_optimizer

DATA = os.path.join(os.path.dirname(__file__), "data")
_spec = importlib.util.spec_from_file_location(
    "make_legacy_fixtures", os.path.join(DATA, "make_legacy_fixtures.py"))
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)


def _unpack(name, tmp_path):
    path = str(tmp_path / name)
    with gzip.open(os.path.join(DATA, name + ".gz"), "rb") as packed, open(path, "wb") as raw:
        shutil.copyfileobj(packed, raw)
    return path


def _assert_outputs(model, x, expected, prefix):
    got = fixtures.flat_outputs(model(x), prefix)
    keys = [k for k in expected if k.startswith(prefix + "/")]
    assert keys and sorted(got) == sorted(keys)
    for key in keys:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5, err_msg=key)


def _check_inputs(expected, x):
    # The inputs come from NumPy's seeded generator, as when the outputs were saved.
    assert float(x["images"].sum()) == pytest.approx(float(expected["x/images_sum"]), rel=1e-9)


def test_old_keras_archive_converts_and_keeps_outputs_and_optimizer_state(tmp_path):
    old = _unpack("legacy-refined.keras", tmp_path)
    expected = dict(np.load(os.path.join(DATA, "legacy-refined.npz")))
    x, y = fixtures.batch()
    _check_inputs(expected, x)
    with pytest.raises(ValueError, match="could not be loaded"):
        keras.saving.load_model(old)  # the old layout does not load as is
    new = str(tmp_path / "new.keras")
    assert convert_legacy_weights(old, new) == "encoder"
    model = keras.saving.load_model(new)
    assert (model.query_type, model.box_refinement, model.attention_radius) == (
        "encoder", True, 0.3)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1
    _assert_outputs(model, x, expected, "out")
    model.train_on_batch(x, y)
    _assert_outputs(model, x, expected, "next")
    with pytest.raises(ValueError, match="already in the current"):
        convert_legacy_weights(new, str(tmp_path / "again.keras"))


def test_old_checkpoint_converts_in_place_and_loads_into_a_new_model(tmp_path):
    path = _unpack("legacy-reference.weights.h5", tmp_path)
    expected = dict(np.load(os.path.join(DATA, "legacy-reference.npz")))
    assert convert_legacy_weights(path, path) == "reference"
    assert sorted(os.listdir(tmp_path)) == ["legacy-reference.weights.h5"]  # no temp file left
    config = preset("tiny", **fixtures.SMALL, **fixtures.CONFIGS["reference"])
    model = build_model(config, fixtures.NUM_CLASSES)
    model.compile(optimizer=build_optimizer(config, model),
                  criterion=build_criterion(config, fixtures.NUM_CLASSES))
    model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    x, y = fixtures.batch()
    _assert_outputs(model, x, expected, "out")
    model.train_on_batch(x, y)
    _assert_outputs(model, x, expected, "next")


@pytest.mark.parametrize("own, after", [(1, 0), (1, 4)], ids=["learned", "reference"])
def test_optimizer_slots_of_the_query_weights_move_behind_the_box_head(tmp_path, own, after):
    slots = 7
    with h5py.File(tmp_path / "opt.h5", "w") as f:
        group = f.create_group("vars")
        group["0"], group["1"] = np.int64(3), np.float32(1e-4)  # iterations, learning_rate
        for i in range(slots):  # momentum and velocity of variable i
            group[str(2 + 2 * i)] = np.full((2,), 10.0 * i)
            group[str(3 + 2 * i)] = np.full((2,), 10.0 * i + 1)
        _move_slots(group, own, after)
        values = [float(group[str(k)][()].flat[0]) for k in range(2 + 2 * slots)]
    # Old order: [query weight, backbone... box head, (reference MLP: `after` variables)].
    order = list(range(own, slots - after)) + list(range(own)) + list(range(slots - after, slots))
    assert values[:2] == [3.0, pytest.approx(1e-4)]
    assert values[2:] == [v for i in order for v in (10.0 * i, 10.0 * i + 1)]


def test_bad_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="both end in .keras"):
        convert_legacy_weights(str(tmp_path / "a.keras"), str(tmp_path / "b.weights.h5"))
    with pytest.raises(ValueError, match="not found"):
        convert_legacy_weights(str(tmp_path / "a.keras"), str(tmp_path / "b.keras"))
    (tmp_path / "junk.weights.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match="junk.weights.h5"):
        convert_legacy_weights(str(tmp_path / "junk.weights.h5"), str(tmp_path / "b.weights.h5"))


def test_convert_script(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "convert_detr", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                     "convert_detr.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    old = _unpack("legacy-reference.weights.h5", tmp_path)
    new = str(tmp_path / "new.weights.h5")
    assert run_cli(script.main, [old, new]) == 0
    assert "query_type='reference'" in capsys.readouterr().out
    with h5py.File(new) as f:
        assert "layers/reference_queries/vars/0" in f and "vars/0" not in f
    assert run_cli(script.main, [new, str(tmp_path / "again.weights.h5")]) == 2
    assert "already in the current" in capsys.readouterr().err
