"""``train_detr.py --skip-bad-images``: training goes on without the bad files, says so, and
caches the check in the work directory, so that the rerun decodes nothing again."""

import io
import json
from unittest import mock

import keras
import numpy as np
import pytest
from PIL import Image

from vision.commands import train


class _FitStarted(BaseException):
    pass


def _jpeg(seed):
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_skip_bad_images_trains_without_them_and_caches_the_check(tmp_path, monkeypatch,
                                                                  capsys):
    (img := tmp_path / "img").mkdir()
    names = [f"{i}.jpg" for i in range(4)] + ["cut.jpg"]
    for i, name in enumerate(names):
        data = _jpeg(i)
        (img / name).write_bytes(data if name != "cut.jpg" else data[: len(data) // 2])
    images = [{"id": i + 1, "file_name": name, "width": 32, "height": 24}
              for i, name in enumerate(names)]
    annotations = [{"id": k + 1, "image_id": i + 1, "category_id": 1, "bbox": [2, 2, 9, 9],
                    "iscrowd": 0} for k, i in enumerate((0, 1, 2, 3, 4, 4, 4))]
    (tmp_path / "ann.json").write_text(json.dumps({
        "images": images, "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}]}))
    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=_FitStarted))
    argv = ["--data", f"coco:{img}:{tmp_path / 'ann.json'}", "--workdir", str(tmp_path / "w"),
            "--valid-fraction", "0.25", "--skip-bad-images"]
    with pytest.raises(_FitStarted):
        train.main(argv)
    out = capsys.readouterr().out
    assert f"skipped 1 bad image files ({str(img / 'cut.jpg')!r}) and their 3 annotations" in out
    assert "checking 5 image files (0 checked before)" in out
    assert "\x1b[" not in out and "/image" not in out  # no progress bar outside a terminal
    assert "3 training images, 1 validation images" in out
    cached = json.loads((tmp_path / "w" / "image_check.json").read_text())["images"]
    assert sorted(cached) == [str(img / f"{i}.jpg") for i in range(4)]
    with pytest.raises(_FitStarted):  # the same command again: 4 files known, 1 decoded
        train.main(argv)
    assert "checking 1 image files (4 checked before)" in capsys.readouterr().out
