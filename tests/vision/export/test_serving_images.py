"""What the exported detector and detect.py take: EXIF-rotated JPEGs as displayed, empty
batches (empty outputs), zero-size images (a clear error)."""

import io
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from vision.commands import detect

ZERO_SIZE = "`images` must be \\(B, H, W, 3\\) with H and W of at least 1 pixel"


@pytest.fixture(scope="module")
def signatures(detr_export):
    model, path, config = detr_export
    loaded = tf.saved_model.load(str(path))
    return loaded.signatures["serving_default"], loaded.signatures["serving_bytes"], path


def _jpeg(orientation):
    image = np.random.default_rng(orientation).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    image[:15, :20] = (250, 20, 20)  # a block that any wrong turn moves
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", exif=exif)
    return buffer.getvalue()


def _displayed(data):
    """PIL's `exif_transpose` of TensorFlow's pixels of the stored (unrotated) image."""
    image = Image.fromarray(tf.io.decode_jpeg(data, channels=3).numpy())
    image.info["exif"] = Image.open(io.BytesIO(data)).info["exif"]
    return np.asarray(ImageOps.exif_transpose(image))


def _numpy(out):
    return {key: value.numpy() for key, value in out.items()}


def test_serving_bytes_detects_in_the_displayed_image(signatures):
    default, from_bytes, _ = signatures
    for orientations in ((1, 2, 3, 4), (5, 6, 7, 8)):  # one displayed size per batch
        data = [_jpeg(k) for k in orientations]
        got = _numpy(from_bytes(image_bytes=tf.constant(data)))
        want = _numpy(default(images=tf.constant(np.stack([_displayed(d) for d in data]))))
        np.testing.assert_allclose(got["boxes"], want["boxes"], atol=1e-3)
        np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-5)
        np.testing.assert_array_equal(got["labels"], want["labels"])
    stored = _numpy(default(images=tf.constant(tf.io.decode_jpeg(_jpeg(6))[None])))
    rotated = _numpy(from_bytes(image_bytes=tf.constant([_jpeg(6)])))
    assert np.abs(stored["boxes"] - rotated["boxes"]).max() > 1  # a test that can fail


def test_detect_reads_jpegs_as_displayed(signatures, tmp_path, capsys):
    path = tmp_path / "phone.jpg"
    path.write_bytes(_jpeg(6))
    np.testing.assert_array_equal(detect.read_image(str(path)), _displayed(_jpeg(6)))
    out = tmp_path / "out"
    assert detect.main(["--model", str(signatures[2]), "--out", str(out), "--threshold", "0",
                        str(path)]) == 0, capsys.readouterr().err
    report = json.loads((out / "phone.json").read_text())
    assert (report["height"], report["width"]) == (50, 30)
    want = _numpy(signatures[0](images=tf.constant(_displayed(_jpeg(6))[None])))
    best = int(np.argmax(want["scores"][0]))
    np.testing.assert_allclose(report["detections"][0]["box"], want["boxes"][0, best], atol=0.01)


def test_empty_batches_give_empty_outputs(signatures, detr_export):
    default, from_bytes, _ = signatures
    queries = detr_export[2].num_queries
    for out in (default(images=tf.zeros([0, 20, 30, 3], tf.uint8)),
                from_bytes(image_bytes=tf.zeros([0], tf.string))):
        assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {
            "boxes": ((0, queries, 4), tf.float32), "scores": ((0, queries), tf.float32),
            "labels": ((0, queries), tf.int32)}


@pytest.mark.parametrize("shape", [(1, 0, 0, 3), (2, 0, 7, 3), (1, 7, 0, 3)])
def test_zero_size_images_are_refused_with_a_message(signatures, shape):
    with pytest.raises(tf.errors.InvalidArgumentError, match=ZERO_SIZE):
        signatures[0](images=tf.zeros(shape, tf.uint8))
