"""The exported Detector runs without this project and equals in-process post-processing."""

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vision.data.batching import ObjectLimit, make_batches
from vision.export.load import load_detector
from vision.export.saved_model import export_detector, make_detect_fn
from vision.modeling.postprocess import postprocess

# One worker runs this module, so that its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("detr_export")

IMAGE_SIZE, MAX_SIZE = 48, 64  # those of the shared `detr_export` (tests/conftest.py)
NAMES = ("circle", "square", "triangle")


@pytest.fixture(scope="module")
def exported(detr_export):
    model, path, config = detr_export
    assert config.num_queries == 6
    return model, path


@pytest.fixture(scope="module")
def replaced(exported, tmp_path_factory):
    """An export with category ids [4, 5, 9] written over a directory that held a stale file:
    (the folder holding it, its path)."""
    model, _ = exported
    folder = tmp_path_factory.mktemp("replaced")
    (folder / "export").mkdir()
    (folder / "export" / "stale.txt").write_text("x")
    export_detector(model, folder / "export", NAMES, IMAGE_SIZE, MAX_SIZE, category_ids=[4, 5, 9])
    return folder, folder / "export"


def _images():
    rng = np.random.default_rng(0)
    same = rng.integers(0, 256, (2, 60, 90, 3), dtype=np.uint8)
    other = [rng.integers(0, 256, (70, 40, 3), dtype=np.uint8), same[0]]
    return same, other


def _expected(model, images):
    """The evaluation pipeline (resize, normalize, pad + mask) -> model -> postprocess."""
    records = tf.data.Dataset.from_generator(lambda: iter(
        {"image": image, "boxes": np.zeros((0, 4), "float32"), "labels": np.zeros(0, "int32"),
         "image_id": i} for i, image in enumerate(images)), output_signature={
        "image": tf.TensorSpec([None, None, 3], tf.uint8), "boxes": tf.TensorSpec([None, 4]),
        "labels": tf.TensorSpec([None], tf.int32), "image_id": tf.TensorSpec([], tf.int64)})
    batches = make_batches(records, batch_size=len(images), object_limit=ObjectLimit(1),
                           image_size=IMAGE_SIZE, max_size=MAX_SIZE, include_info=True)
    inputs, _, info = next(iter(batches))
    out = postprocess(model(inputs), info["orig_size"])
    return {k: np.asarray(out[k]) for k in ("boxes", "scores", "labels")}


def _png(image):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _assert_same(got, want):
    np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-5)
    np.testing.assert_allclose(got["boxes"], want["boxes"], atol=1e-3)  # pixels
    np.testing.assert_array_equal(got["labels"], want["labels"])


def test_fresh_process_without_this_project_gives_the_in_process_detections(exported, tmp_path):
    model, path = exported
    same, other = _images()
    np.save(tmp_path / "same.npy", same)
    for i, image in enumerate(other):
        (tmp_path / f"{i}.png").write_bytes(_png(image))
    script = textwrap.dedent(f"""
        import sys
        for name in ("vision", "tfx_transformer", "nlp", "keras"):
            sys.modules[name] = None  # importing this project (or Keras) would fail
        import numpy as np
        import tensorflow as tf
        detector = tf.saved_model.load({str(path)!r})
        same = detector.signatures["serving_default"](images=tf.constant(np.load("same.npy")))
        data = tf.constant([open(f"{{i}}.png", "rb").read() for i in range(2)])
        other = detector.signatures["serving_bytes"](image_bytes=data)
        np.savez("out.npz", **{{f"same_{{k}}": v.numpy() for k, v in same.items()}},
                 **{{f"other_{{k}}": v.numpy() for k, v in other.items()}})
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    for name, images in (("same", same), ("other", other)):
        got = {k: out[f"{name}_{k}"] for k in ("boxes", "scores", "labels")}
        assert got["boxes"].shape == (len(images), 6, 4) and got["labels"].dtype == np.int32
        _assert_same(got, _expected(model, list(images)))
    # Boxes are in pixels of each input image: the 70x40 one and the 60x90 one differ.
    assert not np.allclose(out["other_boxes"][0], out["other_boxes"][1])


def test_load_detector_and_in_process_detect_fn(exported, tmp_path):
    model, path = exported
    same, other = _images()
    detector = load_detector(path)
    assert detector.class_names == NAMES and detector.category_ids is None
    with open(os.path.join(path, "classes.json")) as f:
        assert json.load(f) == {"class_names": list(NAMES), "category_ids": None}
    want = _expected(model, list(same))
    _assert_same(detector(same), want)
    _assert_same({k: np.asarray(v) for k, v in
                  make_detect_fn(model, IMAGE_SIZE, MAX_SIZE)(same).items()}, want)
    _assert_same(detector.detect_bytes([_png(other[0])]), _expected(model, other[:1]))
    with pytest.raises(ValueError, match="uint8 of shape \\(B, H, W, 3\\)"):
        detector(same.astype("float32"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        detector.detect_bytes([b"not an image"])
    with pytest.raises(ValueError, match="No exported detector"):
        load_detector(tmp_path)
    module = tf.Module()
    module.f = tf.function(lambda images: {"boxes": images},
                           input_signature=[tf.TensorSpec([None], tf.uint8, name="images")])
    tf.saved_model.save(module, str(tmp_path / "other"), signatures={"serving_default": module.f})
    (tmp_path / "other" / "classes.json").write_text('{"class_names": ["a"]}')
    with pytest.raises(ValueError) as info:
        load_detector(tmp_path / "other")
    assert str(info.value) == (f"{tmp_path / 'other'} has no 'serving_bytes' signature (it has "
                               "['serving_default']), so it is no detector export")
    shutil.rmtree(tmp_path / "other")
    with pytest.raises(ValueError, match="model's 3 classes"):
        export_detector(model, tmp_path / "bad", NAMES[:2], IMAGE_SIZE, MAX_SIZE)
    assert not os.listdir(tmp_path)


def test_exporting_again_replaces_the_directory_as_a_whole(replaced):
    folder, export = replaced
    assert sorted(os.listdir(folder)) == ["export"]
    assert not (export / "stale.txt").exists()
    assert load_detector(export).category_ids == [4, 5, 9]


def test_failed_export_leaves_the_previous_export_intact(exported, replaced, tmp_path,
                                                         monkeypatch):

    model, path = exported
    target = tmp_path / "export"
    shutil.copytree(replaced[1], target)  # an earlier export (of category ids [4, 5, 9])
    before = {name: (target / name).read_bytes() for name in ("saved_model.pb", "classes.json")}

    def write_half_and_fail(obj, filepath, **kwargs):
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", write_half_and_fail)
    with pytest.raises(OSError, match="disk full"):
        export_detector(model, target, NAMES, IMAGE_SIZE, MAX_SIZE)
    assert {name: (target / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no temporary directory left behind
    assert load_detector(target).category_ids == [4, 5, 9]  # the earlier export, whole
