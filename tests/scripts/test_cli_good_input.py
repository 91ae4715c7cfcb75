"""What the scripts must take without an error (tests/scripts/test_cli_battery.py has the bad
input): camera and phone photos, a corpus smaller than the default vocabulary continued, stdin
with a byte order mark, and 5000 x 10 images batched and scored."""

import io
import json
import os
import shlex
import sys
from unittest import mock

import keras
import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_cases import COCO, TSV, Stopped, coco_images, run_command, write_coco  # noqa: E402

GOOD_INPUT = [  # what must reach training (the trap on `fit`) with no error line
    ("detr-mpo-camera-file", [COCO + "camera.json"]),
    ("detr-exif-rotated-photo", [COCO + "phone.json"]),
    # A corpus too small for the default --vocab-size, then the same command continued.
    ("nmt-small-corpus-continued", [TSV + " --max-steps 1", TSV + " --max-steps 2"]),
]


@pytest.mark.parametrize("commands", [c for _, c in GOOD_INPUT], ids=[i for i, _ in GOOD_INPUT])
def test_good_input_reaches_training(commands, fx, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=Stopped("training started")))
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = [part.format(W=tmp_path / "work", FX=fx) for part in shlex.split(command)]
        code = run_command(argv[0], argv[1:], seconds=60)
        err = capsys.readouterr().err
        assert code == "training started", f"{command}: exit {code}\n{err[-2000:]}"
        assert "error:" not in err and "Traceback" not in err, err[-2000:]



# What must work: not errors.
def test_stdin_with_a_byte_order_mark_and_umlauts_translates(fx, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(
        io.BytesIO("\ufeffgrüße\n\nzwei\n".encode()), "utf-8"))
    assert run_command("translate.py", ["--model", fx / "translator"]) == 0
    assert capsys.readouterr().out == "GRüßE\n\nZWEI\n"  # tf.strings.upper: ASCII only


@pytest.mark.slow
def test_a_5000_by_10_image_is_read_batched_and_scored(fx, tmp_path, monkeypatch, capsys):
    """train_detr.py's own pipeline (default flags) batches 5000 x 10 images into the first
    training batch, and evaluate_detr.py scores them. One training step on such a batch and
    the export's resize of them: tests/vision/data/test_detection_inputs.py,
    tests/scripts/test_detr_scripts.py (detect.py)."""
    sizes = {"wide.png": (10, 5000), "tall.png": (5000, 10), "a.png": (40, 60),
             "b.png": (48, 32), "c.png": (36, 36)}
    (img := tmp_path / "img").mkdir()
    for name, (h, w) in sizes.items():
        Image.new("RGB", (w, h), (200, 60, 30)).save(img / name)
    write_coco(tmp_path / "ann.json", images=coco_images(sizes))
    monkeypatch.chdir(tmp_path)
    data, work = f"coco:{img}:{tmp_path / 'ann.json'}", tmp_path / "work"
    batches = []

    def first_batch(train, **kwargs):  # what `fit` would take first, then stop
        batches.append(next(iter(train)))
        raise Stopped("training started")

    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=first_batch))
    code = run_command("train_detr.py", ["--data", data, "--workdir", work, "--batch-size", 5,
                                  "--valid-fraction", 0])
    assert code == "training started", capsys.readouterr().err[-3000:]
    inputs, targets = batches[0]
    mask = inputs["mask"].numpy()
    assert mask.shape[0] == len(sizes)  # every image, the long thin ones among them
    rows, cols = mask.any(axis=2).sum(axis=1), mask.any(axis=1).sum(axis=1)
    assert rows.min() >= 1 and cols.min() >= 1 and max(rows.max(), cols.max()) <= 128
    assert sorted(np.maximum(rows, cols) / np.minimum(rows, cols))[-2] > 20  # still long, thin
    boxes = targets["boxes"].numpy()[targets["valid"].numpy()]  # cx, cy, w, h in [0, 1]
    assert len(boxes) and np.all((boxes >= 0) & (boxes <= 1)) and np.all(boxes[:, 2:] > 0)
    capsys.readouterr()
    assert run_command("evaluate_detr.py", ["--model", fx / "detector", "--data", data]) == 0, \
        capsys.readouterr().err[-3000:]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == len(sizes)
