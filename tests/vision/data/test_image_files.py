"""Image files as training reads them: EXIF orientation, MPO, truncated files, decompression
bombs, the bounded decode size, the check's cache and `skip_bad_images`."""

import io
import json
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from vision.data import decode, image_check
from vision.data.sources import load_source

# Four blocks of distinct colours: any wrong flip or rotation moves one of them.
BLOCKS = np.zeros((30, 50, 3), np.uint8)
BLOCKS[:15, :20], BLOCKS[:15, 20:], BLOCKS[15:, :8], BLOCKS[15:, 8:] = (
    (250, 20, 20), (20, 250, 20), (20, 20, 250), (240, 240, 30))
CATEGORIES = [{"id": 1, "name": "thing"}]


def _jpeg(image, orientation=None, endian="<", **save):
    buffer = io.BytesIO()
    if orientation is not None:
        exif = Image.Exif()
        exif.endian = endian
        exif[0x0112] = orientation
        save["exif"] = exif
    Image.fromarray(image).save(buffer, format=save.pop("format", "JPEG"), quality=95, **save)
    return buffer.getvalue()


def _displayed(data):
    """PIL's `exif_transpose` of TensorFlow's pixels of the stored (unrotated) image."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        stored = Image.open(io.BytesIO(data))
    image = Image.fromarray(tf.io.decode_jpeg(data, channels=3).numpy())
    image.info["exif"] = stored.info.get("exif", b"")
    return np.asarray(ImageOps.exif_transpose(image))


def _coco(tmp_path, files, annotations=()):
    """Writes ``files`` ({name: bytes}) into tmp_path/img and an annotations file listing them
    with their displayed sizes; returns the `coco:` spec."""
    (folder := tmp_path / "img").mkdir(exist_ok=True)
    images, limit = [], Image.MAX_IMAGE_PIXELS
    for i, (name, data) in enumerate(files.items()):
        (folder / name).write_bytes(data)
        try:
            Image.MAX_IMAGE_PIXELS = None  # the true sizes of the bombs of a test
            width, height = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size
        except OSError:  # a truncated file: the size its header gives
            width, height = Image.open(io.BytesIO(data)).size
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        images.append({"id": i + 1, "file_name": name, "width": width, "height": height})
    annotations = [{"id": k + 1, "iscrowd": 0, "category_id": 1, **a}
                   for k, a in enumerate(annotations)]
    (tmp_path / "ann.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": CATEGORIES}))
    return f"coco:{folder}:{tmp_path / 'ann.json'}"


def _records(spec, **kwargs):
    source = load_source(spec, valid_fraction=0.0, **kwargs)
    return {int(r["image_id"]): r for r in source.records("all").as_numpy_iterator()}


@pytest.mark.parametrize("endian", ["<", ">"])
def test_decode_applies_every_exif_orientation_as_pil(endian):
    decode_fn = tf.function(decode.decode_image, input_signature=[tf.TensorSpec([], tf.string)])
    for orientation in range(1, 9):
        data = _jpeg(BLOCKS, orientation, endian)
        assert data[30:32] == (b"II" if endian == "<" else b"MM")  # the byte order written
        want, got = _displayed(data), decode_fn(data).numpy()
        assert int(decode.exif_orientation(data)) == orientation
        assert got.shape == want.shape == ((30, 50, 3) if orientation < 5 else (50, 30, 3))
        np.testing.assert_array_equal(got, want)
        # Counter-check: PIL's own decoder agrees up to JPEG rounding; a wrong turn would not.
        pil = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
        assert np.abs(got.astype(int) - pil).mean() < 4
        if orientation > 1:
            assert got.shape != BLOCKS.shape or np.abs(got.astype(int) - BLOCKS).mean() > 40


def test_files_without_orientation_decode_as_stored():
    png = io.BytesIO()
    Image.fromarray(BLOCKS).save(png, format="PNG")
    for data in (png.getvalue(), _jpeg(BLOCKS), b"", b"\xff\xd8\xff\xe1\x00\x08Exif\x00\x00"):
        assert int(decode.exif_orientation(data)) == 1
    np.testing.assert_array_equal(decode.decode_image(png.getvalue()).numpy(), BLOCKS)


def test_a_rotated_phone_photo_trains_upright_with_its_boxes(tmp_path):
    data = _jpeg(BLOCKS, orientation=6)  # stored 50 wide, displayed 30 wide and 50 high
    # The blue block (bottom left as stored) as an annotation tool shows it: turned clockwise,
    # at the top left.
    spec = _coco(tmp_path, {"phone.jpg": data}, [{"image_id": 1, "bbox": [0, 0, 15, 8]}])
    record = _records(spec)[1]
    np.testing.assert_array_equal(record["image"], _displayed(data))
    np.testing.assert_allclose(record["boxes"], [[0, 0, 15, 8]])
    x0, y0, x1, y1 = record["boxes"][0].astype(int)
    np.testing.assert_allclose(record["image"][y0 + 1:y1 - 1, x0 + 1:x1 - 1].mean((0, 1)),
                               (20, 20, 250), atol=12)


def test_camera_mpo_files_are_read(tmp_path):
    data = _jpeg(BLOCKS, format="MPO", save_all=True, append_images=[Image.new("RGB", (50, 30))])
    assert Image.open(io.BytesIO(data)).format == "MPO"
    record = _records(_coco(tmp_path, {"camera.jpg": data}))[1]
    np.testing.assert_array_equal(record["image"], tf.io.decode_jpeg(data).numpy())
    assert np.abs(record["image"].astype(int) - BLOCKS).mean() < 10  # the first picture


def _truncated():
    data = _jpeg(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    return data[: len(data) // 2]


def test_truncated_files_are_named_with_the_count(tmp_path):
    good = _jpeg(BLOCKS)
    Image.open(io.BytesIO(_truncated())).size  # the header alone passes
    files = {"good.jpg": good, **{f"cut{i}.jpg": _truncated() for i in range(5)}}
    spec = _coco(tmp_path, files)
    with pytest.raises(ValueError) as info:
        load_source(spec)
    message = str(info.value)
    assert message.startswith(f"5 of the 6 image files of {tmp_path / 'ann.json'} cannot be "
                              "used: ")
    assert [f"cut{i}.jpg" in message for i in range(5)] == [True] * 3 + [False] * 2
    assert "truncated or corrupt" in message and "; and 2 more." in message
    assert "--skip-bad-images" in message and "good.jpg" not in message


def test_skip_bad_images_drops_them_and_their_annotations(tmp_path):
    files = {"a.jpg": _jpeg(BLOCKS), "cut.jpg": _truncated(), "b.jpg": _jpeg(BLOCKS[::-1])}
    boxes = [{"image_id": i, "bbox": [1, 1, 5, 5]} for i in (1, 2, 2, 3)]
    lines = []
    records = _records(_coco(tmp_path, files, boxes), skip_bad_images=True, log=lines.append)
    assert sorted(records) == [1, 3]
    assert lines == [f"skipped 1 bad image files ({str(tmp_path / 'img' / 'cut.jpg')!r}) and "
                     "their 2 annotations"]


def test_decompression_bombs_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400)  # PIL refuses over twice this
    spec = _coco(tmp_path, {"small.jpg": _jpeg(BLOCKS[:10, :20]), "big.jpg": _jpeg(BLOCKS)})
    with pytest.raises(ValueError, match=r"1 of the 2 image files .*big\.jpg.: too large "
                                         r"\(Image size \(1500 pixels\) exceeds limit"):
        load_source(spec)


def test_a_real_bomb_in_a_training_folder_is_named_and_skipped_unread(tmp_path):
    """A 20000 x 20000 PNG (1.2 GB decoded) beside a good file, at PIL's own limit: its
    header refuses it (`PIL.Image.open` reads no pixel), as a truncated file is refused."""
    import struct
    import zlib

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    bomb = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0,
                                                              0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(60001) * 8)) + chunk(b"IEND", b""))
    (folder := tmp_path / "img").mkdir()
    sizes = {"a.jpg": (50, 30), "bomb.png": (20000, 20000), "cut.jpg": (64, 48)}
    for name, data in (("a.jpg", _jpeg(BLOCKS)), ("bomb.png", bomb), ("cut.jpg", _truncated())):
        (folder / name).write_bytes(data)
    images = [{"id": i + 1, "file_name": name, "width": w, "height": h}
              for i, (name, (w, h)) in enumerate(sizes.items())]
    annotations = [{"id": 1, "image_id": 2, "iscrowd": 0, "category_id": 1, "bbox": [1, 1, 5, 5]}]
    (tmp_path / "ann.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": CATEGORIES}))
    lines = []
    records = _records(f"coco:{folder}:{tmp_path / 'ann.json'}", skip_bad_images=True,
                       log=lines.append)
    assert sorted(records) == [1]
    assert lines == [f"skipped 2 bad image files ({str(folder / 'bomb.png')!r}, "
                     f"{str(folder / 'cut.jpg')!r}) and their 1 annotations"]
    problems = image_check.check_images([folder / "bomb.png"], progress=False).problems
    assert problems[str(folder / "bomb.png")] == (
        "too large (Image size (400000000 pixels) exceeds limit of 178956970 pixels, could be "
        "decompression bomb DOS attack.)")


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")  # none leaks out
def test_images_under_the_bomb_limit_are_shrunk_on_read(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1500 pixels: PIL only warns
    data = _jpeg(BLOCKS)
    spec = _coco(tmp_path, {"big.jpg": data}, [{"image_id": 1, "bbox": [20, 0, 30, 15]}])
    record = _records(spec, max_side=20)[1]
    assert record["image"].shape == (12, 20, 3)
    np.testing.assert_allclose(record["boxes"], [[8, 0, 20, 6]], atol=1e-5)
    want = tf.image.resize(_displayed(data), (12, 20), antialias=True).numpy()
    np.testing.assert_allclose(record["image"], np.clip(np.round(want), 0, 255), atol=1)
    assert _records(spec, max_side=50)[1]["image"].shape == (30, 50, 3)  # not enlarged


def test_the_check_is_cached_by_size_and_mtime(tmp_path, monkeypatch):
    paths = [tmp_path / "a.jpg", tmp_path / "b.jpg"]
    paths[0].write_bytes(_jpeg(BLOCKS))
    paths[1].write_bytes(_jpeg(BLOCKS, orientation=8))
    cache = tmp_path / image_check.CACHE_FILE
    checked = image_check.check_images(paths, cache=cache, progress=False)
    assert checked.sizes == {str(paths[0]): (30, 50), str(paths[1]): (50, 30)}
    assert checked.problems == {} and checked.decoded == 2 and not cache.exists()
    image_check.write_cache(cache, checked)
    assert len(json.loads(cache.read_text())["images"]) == 2

    decoded = []
    real = image_check._check
    monkeypatch.setattr(image_check, "_check", lambda p: decoded.append(p) or real(p))
    again = image_check.check_images(paths, cache=cache, progress=False)
    assert again.sizes == checked.sizes and decoded == [] and again.decoded == 0
    paths[1].write_bytes(_truncated())  # a new size and mtime
    os.utime(paths[0], ns=(1, 1))  # the same bytes, a new mtime
    checked = image_check.check_images(paths, cache=cache, progress=False)
    assert decoded == [str(p) for p in paths] and list(checked.problems) == [str(paths[1])]
    image_check.write_cache(cache, checked)
    assert list(json.loads(cache.read_text())["images"]) == [str(paths[0].resolve())]


def test_a_read_with_bad_input_writes_no_cache_and_a_good_one_does(tmp_path):
    cache = tmp_path / image_check.CACHE_FILE
    spec = _coco(tmp_path, {"a.jpg": _jpeg(BLOCKS), "cut.jpg": _truncated()})
    with pytest.raises(ValueError, match="cut.jpg"):
        load_source(spec, check_cache=str(cache))
    assert not cache.exists()
    load_source(spec, check_cache=str(cache), skip_bad_images=True, log=lambda line: None)
    assert list(json.loads(cache.read_text())["images"]) == [str(tmp_path / "img" / "a.jpg")]
