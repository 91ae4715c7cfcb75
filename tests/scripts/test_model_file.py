"""Every finished run writes ``DIR/model.keras``: the exported weights in Keras's format.

A process that imports only the application's package and Keras loads it the Keras way
(``import nlp, keras; keras.saving.load_model(P)``: `tfx_transformer.registry`), and its
weights must be the ones the run exported: the average of the last two epochs' checkpoints
for the translation run (``--average-last 2``), the last epoch's for the detector.
"""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

import nlp  # noqa: F401  (registers what the loads below meet, as a user's import does)
import vision  # noqa: F401

_LOAD = """
import sys
import {package}, keras
import numpy as np
model = keras.saving.load_model(sys.argv[1])
np.savez(sys.argv[2], **{{w.path: keras.ops.convert_to_numpy(w) for w in model.weights}})
print(type(model).__module__, type(model).__name__, int(model.optimizer.iterations))
"""


def _load_in_a_new_process(package, path, out):
    """``(class, optimizer steps, {weight path: array})`` as the new process loaded them."""
    done = subprocess.run([sys.executable, "-c", _LOAD.format(package=package), str(path),
                           str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    module, name, steps = done.stdout.split()[-3:]
    return f"{module}.{name}", int(steps), dict(np.load(out))


def _checkpoint_weights(model, paths):
    """The mean of the checkpoints' weights, by weight path, read into ``model``."""
    arrays = []
    for path in paths:
        model.load_weights(str(path))  # weights only: the optimizer keeps its state
        arrays.append({w.path: keras.ops.convert_to_numpy(w) for w in model.weights})
    return {name: np.mean([a[name] for a in arrays], axis=0) for name in arrays[0]}


def _check(work, package, class_name, checkpoints, tmp_path):
    loaded_class, steps, weights = _load_in_a_new_process(package, work / "model.keras",
                                                          tmp_path / "weights.npz")
    assert loaded_class == class_name
    assert steps == json.loads((work / "run.json").read_text())["steps"]
    model = keras.saving.load_model(work / "model.keras")
    expected = _checkpoint_weights(model, [work / "checkpoints" / c for c in checkpoints])
    assert set(weights) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(weights[name], value, atol=1e-6, err_msg=name)


@pytest.mark.xdist_group("nmt_workdir")  # with the other tests of the shared runs
def test_a_translation_run_writes_model_keras_with_its_averaged_weights(nmt_workdir, tmp_path):
    work, _, _ = nmt_workdir  # --epochs 2 --average-last 2
    _check(work, "nlp", "nlp.modeling.model.Seq2SeqTransformer",
           ["epoch-001.weights.h5", "epoch-002.weights.h5"], tmp_path)


@pytest.mark.slow
@pytest.mark.xdist_group("detr_workdir")
def test_a_detection_run_writes_model_keras_with_its_last_weights(detr_workdir, tmp_path):
    work, _ = detr_workdir
    _check(work, "vision", "vision.modeling.detr.DETR", ["epoch-001.weights.h5"], tmp_path)
