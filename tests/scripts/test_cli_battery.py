"""Every script fed bad input: exit code 2, one `error:` line naming what to fix, nothing lost.

Each case runs the ``main`` of the script's command in this process as the script does, with
`keras.Model.fit` trapped (a case that gets to training fails at once); a few run again from
the shell, TensorFlow's start-up logging not suppressed. Checked: exit code 2; stderr is one
``error:`` line (after argparse's usage) matching every pattern; no traceback; no file under the
case's folder or the fixtures changed. Run: pytest tests/scripts/test_cli_battery.py
"""

import collections
import fcntl
import importlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from nlp.text.vocabulary import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {  # scripts/NAME -> the command module it runs
    "train_nmt.py": "nlp.commands.train", "translate.py": "nlp.commands.translate",
    "evaluate_nmt.py": "nlp.commands.evaluate", "train_detr.py": "vision.commands.train",
    "detect.py": "vision.commands.detect", "evaluate_detr.py": "vision.commands.evaluate",
    "quickstart.py": "tfx_transformer.commands.quickstart"}
CATEGORIES = [{"id": i + 1, "name": n} for i, n in enumerate(("circle", "square", "triangle"))]
SIZES = {"0.png": (24, 32), "1.png": (30, 40), "2.png": (32, 24)}  # (height, width)


def F(flag, field=None):  # a flag, ``--batch-size``, or its field name, ``batch_size``
    return rf"({re.escape(flag)}\b|\b{field or flag.lstrip('-').replace('-', '_')}\b)"


def _save(path, info_file, info, **signatures):
    """A stand-in export: a SavedModel with the real signatures and the real info file."""
    tf.saved_model.save(tf.Module(), str(path), signatures={
        name: tf.function(fn, input_signature=[spec]) for name, (fn, spec) in signatures.items()})
    (path / info_file).write_text(json.dumps(info))


def _no_boxes(x):  # two empty detections per image
    n = tf.shape(x)[0]
    return {"boxes": tf.zeros([n, 2, 4]), "scores": tf.zeros([n, 2]),
            "labels": tf.zeros([n, 2], tf.int32)}


def _images(sizes=SIZES):
    return [{"id": i + 1, "file_name": name, "height": h, "width": w}
            for i, (name, (h, w)) in enumerate(sizes.items())]


def _coco(path, images=None, annotations=None, categories=CATEGORIES):
    images = _images() if images is None else images
    if annotations is None:  # two boxes in each image
        annotations = [{"id": 3 * i + k + 1, "image_id": i + 1, "category_id": k % 3 + 1,
                        "bbox": [2 + 4 * k, 2, 5, 6], "area": 30, "iscrowd": 0}
                       for i in range(len(images)) for k in range(2)]
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": categories}))


def _box(bbox, **fields):
    return {"id": 7, "image_id": 1, "category_id": 1, "bbox": bbox, "iscrowd": 0, **fields}


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    fx = tmp_path_factory.mktemp("fx")
    (fx / "good.tsv").write_text("".join(f"I have {n} red apples.\tIch habe {n} rote Äpfel.\n"
                                         for n in range(40)), encoding="utf-8")
    (fx / "bad_utf8.tsv").write_bytes(b"one\teins\ntwo\tzwei\nthree \xff\tdrei\n")
    (fx / "notab.tsv").write_text("one\teins\nno tab on this line\n", encoding="utf-8")
    (fx / "empty.tsv").write_bytes(b"")
    (fx / "tsvdir").mkdir()
    train_tokenizer(["Der Hund schläft.", "The dog sleeps.", "Wir gehen nach Hause."],
                    fx / "other.model", vocab_size=40)
    (img := fx / "img").mkdir()
    for name, (h, w) in SIZES.items():
        Image.new("RGB", (w, h), (40, 120, 200)).save(img / name)
    (img / "broken.png").write_bytes(b"this is no image")
    jpeg = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(jpeg, format="JPEG")  # most bytes after the header
    for i in range(5):  # partial downloads: the header is whole, the pixels are not
        (img / f"trunc{i}.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])
    (img / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"".join(  # 900 M pixels, it says
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        for kind, data in ((b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)),
                           (b"IDAT", zlib.compress(b"")), (b"IEND", b""))))
    camera = io.BytesIO()  # a camera's JPEG that PIL reports as MPO (two pictures)
    Image.fromarray(noise).save(camera, format="MPO", save_all=True,
                                append_images=[Image.new("RGB", (64, 48))])
    (img / "camera.jpg").write_bytes(camera.getvalue())
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 64 wide and 48 high, displayed turned: 48 wide, 64 high
    Image.fromarray(noise).save(img / "phone.jpg", format="JPEG", exif=exif)
    (fx / "invalid.json").write_text('{"images": [')
    images = _images()
    for name, kwargs in {
        "good": {}, "empty_images": dict(images=[], annotations=[]),
        "bbox_null": dict(annotations=[_box(None)]),
        "bbox_nullitem": dict(annotations=[_box([None, 0, 4, 4])]),
        "bbox_str": dict(annotations=[_box(["a", 0, 4, 4])]),
        "ann_int": dict(annotations=[_box([1, 1, 4, 4]), 5]), "ann_notlist": dict(annotations=5),
        "gone_image": dict(images=[*images, {"id": 4, "file_name": "gone.png"}]),
        "broken_image": dict(images=[*images, {"id": 4, "file_name": "broken.png"}]),
        "truncated_image": dict(images=[*images, {"id": 4, "file_name": "trunc0.jpg"}]),
        "bomb_image": dict(images=[*images, {"id": 4, "file_name": "bomb.png"}]),
        "bad_images": dict(images=[*images, *({"id": 4 + i, "file_name": f"trunc{i}.jpg"}
                                              for i in range(5))]),
        "size_mismatch": dict(images=[{**images[0], "width": 99}, *images[1:]]),
        "unknown_cat": dict(annotations=[_box([1, 1, 4, 4], category_id=42)]),
        "other_ids": dict(annotations=[], categories=[{**c, "id": c["id"] + 3}
                                                      for c in CATEGORIES]),
        "camera": dict(images=[*images, {"id": 4, "file_name": "camera.jpg", "height": 48,
                                         "width": 64}]),
        # The size an annotation tool shows (the image as displayed), not the stored one.
        "phone": dict(images=[*images, {"id": 4, "file_name": "phone.jpg", "height": 64,
                                        "width": 48}]),
    }.items():
        _coco(fx / f"{name}.json", **kwargs)
    text = (lambda text: {"translation": tf.strings.upper(text)},
            tf.TensorSpec([None], tf.string, name="text"))
    nbest = (lambda t: {"hypotheses": tf.stack([t] * 4, 1), "scores": tf.zeros([tf.size(t), 4])},
             text[1])
    _save(fx / "translator", "translator.json", {  # as nlp.export.translator writes it
        "format_version": 2, "beam_size": 4, "length_penalty": 0.6, "extra_length": 50,
        "signatures": {"serving_default": {"beam_size": 4}, "greedy": {"beam_size": 1},
                       "translate_nbest": {"beam_size": 4,
                                           "output_keys": ["hypotheses", "scores"]}},
        "input_key": "text", "output_key": "translation", "vocab_size": 40},
        serving_default=text, greedy=text, translate_nbest=nbest)
    _save(fx / "detector", "classes.json", {"class_names": [c["name"] for c in CATEGORIES],
                                            "category_ids": [1, 2, 3]},
          serving_default=(lambda images: _no_boxes(images),
                           tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")),
          serving_bytes=(lambda image_bytes: _no_boxes(image_bytes),
                         tf.TensorSpec([None], tf.string, name="image_bytes")))
    for name, source, path, text in (("badinfo", "translator", "translator.json", "{"),
                                     ("badclasses", "detector", "classes.json", "{"),
                                     ("listclasses", "detector", "classes.json", "[]")):
        shutil.copytree(fx / source, fx / name)
        (fx / name / path).write_text(text)
    return fx


FINISHED = {"metrics.json": json.dumps({"valid": {"score": 1.0}, "history": [{"epoch": 0}],
                                        "train": {"stopped_by": "epochs=1 reached"}}),
            "checkpoints/epoch-001.weights.h5": "\x89HDF stand-in",
            "logs/train/events.out.tfevents.0": "stand-in", "export/saved_model.pb": "stand-in"}
STATES = {  # work directory states: the files in it besides keep.txt
    "fresh": {}, "finished_detr": FINISHED, "finished_nmt": {**FINISHED, "tokenizer.model": None},
    "other_data": {"tokenizer.model": None, "metrics.json": json.dumps(  # other data and vocab
        {"data": {"spec": "tsv:other.tsv"}, "config": {"vocab_size": 40}})},
    "empty_tokenizer": {"tokenizer.model": ""},
    "corrupt_tokenizer": {"tokenizer.model": "\x00\x01 no SentencePiece model"},
    "metrics_list": {"metrics.json": "[]\n"}, "metrics_invalid": {"metrics.json": '{"valid":\n'},
    "quick_metrics_list": {"detr/metrics.json": "[]\n"},  # the first part the quick start runs
    "locked": {".lock": "4242"},
}


_HELD = []  # file descriptors of the "locked" state's lock, closed after its case


def _prepare(case, root, fx):
    """Writes ``root/work`` (sentinel, ``STATES[case.state]``); returns the case's argv.

    ``locked``: another process's run holds the work directory (its lock, its ``.lock``)."""
    work, state = root / "work", case.state
    files = {"keep.txt": "sentinel\n", **STATES[state]} if state != "file" else {"": "a file\n"}
    for path, text in ((work / name, text) for name, text in files.items()):
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fx / "other.model", path) if text is None else path.write_text(text)
    if state == "locked":  # flock: a second open file description is refused, as another
        fd = os.open(work, os.O_RDONLY)  # process would be
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _HELD.append(fd)
    return [part.format(W=work, FX=fx, R=root) for part in shlex.split(case.command)]


def _snapshot(*roots):
    return {p: p.read_bytes() for root in roots for p in Path(root).rglob("*") if p.is_file()}


# command: script and arguments ({W} work dir, {FX} fixtures, {R} the case's folder);
# expect: regexes the error line must all match; state: of the work dir (STATES).
Case = collections.namedtuple("Case", "id command expect state stdin")


def C(id, command, *expect, state="fresh", stdin=None):
    return Case(id, command, expect, state, stdin)


def A(id, command, *expect):
    """An argument error: it fails before anything reads the (finished) work directory."""
    finished = {"train_nmt.py": "finished_nmt", "train_detr.py": "finished_detr"}
    return C(id, command, *expect, state=finished.get(command.split()[0], "fresh"))


NMT, DETR = "train_nmt.py --workdir {W}", "train_detr.py --workdir {W}"
TSV, COCO = NMT + " --data tsv:{FX}/good.tsv", DETR + " --data coco:{FX}/img:{FX}/"
TRANSLATE, EVAL_NMT = "translate.py --model {FX}/translator", "evaluate_nmt.py --model {FX}/"
DETECT, EVAL_DETR = "detect.py --out {R}/out --model {FX}/", "evaluate_detr.py --model {FX}/"
EVAL_COCO = EVAL_DETR + "detector --data coco:{FX}/img:{FX}/"
QUICK, GOOD, IMG = "quickstart.py --workdir {W}", " --data tsv:{FX}/good.tsv", " {FX}/img/0.png"
LINE2, LINE3 = r"(:2\b|line 2)", r"(:3\b|line 3)"
P = "0 -1 nan"  # for every flag that takes a number > 0
NUMBERS = [  # (command, flags, bad values)
    (NMT, "--epochs --max-steps --time-budget --batch-tokens --vocab-size --max-length --beam "
          "--clip-norm", P),
    (DETR, "--epochs --max-steps --time-budget --eval-limit --batch-size --num-queries "
           "--learning-rate --clip-norm", P),
    (TRANSLATE + " Hello", "--batch-size --beam-size", P),
    (EVAL_NMT + "translator" + GOOD, "--beam-size --limit --batch-size", P),
    (EVAL_DETR + "detector --data embedded", "--limit --batch-size", P),
    (QUICK, "--minutes", P + " x"), (DETR, "--learning-rate", "inf"),
    (NMT, "--valid-fraction", "1.5 -0.1 nan"), (DETR, "--valid-fraction", "1 -1 nan"),
    (NMT, "--seed", "-1 x"), (DETR, "--seed", "-1 1.5"),
    (DETECT + "detector" + IMG, "--threshold", "1.5 -0.1 nan"),
    (EVAL_DETR + "detector --data embedded", "--threshold", "1 -0.1 nan"),
]
CASES = [A(f"{command.split()[0][:-3]}{flag}={value}", f"{command} {flag} {value}", F(flag))
         for command, flags, values in NUMBERS for flag in flags.split()
         for value in values.split()]
CASES += [  # bad choices, data files, work-directory states and models
    A("nmt-preset", NMT + " --preset huge", F("--preset"), "huge"),
    A("nmt-multi-worker", NMT + " --strategy multi_worker", "TF_CONFIG"),
    A("nmt-precision", NMT + " --mixed-precision fp8", F("--mixed-precision")),
    A("nmt-not-a-flag", NMT + " --num-queries 3", F("--num-queries")),  # train_detr.py's
    C("nmt-vocab-10", TSV + " --vocab-size 10", F("--vocab-size"), r"\b10\b"),
    C("nmt-data-scheme", NMT + " --data foo:bar", "foo"),
    C("nmt-tsv-no-path", NMT + " --data tsv:", "tsv:"),
    C("nmt-tsv-missing", NMT + " --data tsv:{FX}/missing.tsv", "missing.tsv"),
    C("nmt-tsv-dir", NMT + " --data tsv:{FX}/tsvdir", "tsvdir", "director"),
    C("nmt-tsv-utf8", NMT + " --data tsv:{FX}/bad_utf8.tsv", "bad_utf8.tsv", LINE3),
    C("nmt-tsv-no-tab", NMT + " --data tsv:{FX}/notab.tsv", "notab.tsv", LINE2),
    C("nmt-tsv-empty", NMT + " --data tsv:{FX}/empty.tsv", "empty.tsv"),
    C("nmt-all-filtered", TSV + " --max-length 2 --max-steps 2", F("--max-length")),
    C("nmt-workdir-file", TSV, F("--workdir"), "director", state="file"),
    C("nmt-tokenizer-empty", TSV, "tokenizer.model", state="empty_tokenizer"),
    C("nmt-tokenizer-corrupt", TSV, "tokenizer.model", state="corrupt_tokenizer"),
    C("nmt-metrics-list", TSV, "metrics.json", state="metrics_list"),
    C("nmt-metrics-invalid", TSV, "metrics.json", state="metrics_invalid"),
    C("nmt-other-data", TSV + " --vocab-size 300", "(tokenizer|vocab)", state="other_data"),
    C("translate-beam-3", TRANSLATE + " --beam-size 3 Hello", "beam"),
    C("translate-detector", "translate.py --model {FX}/detector Hi", "detector", "translat"),
    C("translate-nothing", "translate.py --model {FX}/nothing Hello", "nothing"),
    C("translate-bad-info", "translate.py --model {FX}/badinfo Hello", "translator.json"),
    C("translate-stdin-utf8", TRANSLATE, LINE2, stdin=b"Hello\n\xff\xfe bad\nok\n"),
    C("translate-text-utf8", TRANSLATE + " ok \udcffbad", r"(TEXT|argument)"),
    C("evalnmt-detector", EVAL_NMT + "detector" + GOOD, "detector"),
    C("evalnmt-tsv-utf8", EVAL_NMT + "translator --data tsv:{FX}/bad_utf8.tsv", LINE3),
    C("evalnmt-tsv-empty", EVAL_NMT + "translator --data tsv:{FX}/empty.tsv", "empty.tsv"),
    A("detr-preset", DETR + " --preset nope", F("--preset")),
    A("detr-multi-worker", DETR + " --strategy multi_worker", "TF_CONFIG"),
    A("detr-not-a-flag", DETR + " --xla", F("--xla")),  # train_nmt.py's
    A("detr-backbone-missing", DETR + " --preset r50 --backbone-weights {FX}/no.h5", "no.h5"),
    A("detr-init-missing", DETR + " --init-from {FX}/gone", F("--init-from"), "gone"),
    A("detr-init-tsv", DETR + " --init-from {FX}/good.tsv", F("--init-from"), "good.tsv"),
    C("detr-data-scheme", DETR + " --data foo:x", "foo"),
    C("detr-coco-no-ann", DETR + " --data coco:{FX}/img", "coco:"),
    C("detr-coco-missing", COCO + "missing.json", "missing.json"),
    C("detr-coco-invalid", COCO + "invalid.json", "invalid.json", "JSON"),
    C("detr-coco-no-images", COCO + "empty_images.json --max-steps 2", "empty_images"),
    C("detr-bbox-null", COCO + "bbox_null.json", "bbox_null.json", "annotation", "bbox"),
    C("detr-bbox-null-item", COCO + "bbox_nullitem.json", "bbox_nullitem.json", "annotation"),
    C("detr-bbox-str", COCO + "bbox_str.json", "bbox_str.json", "annotation"),
    C("detr-ann-not-object", COCO + "ann_int.json", "ann_int.json", "annotation"),
    C("detr-ann-not-list", COCO + "ann_notlist.json", "ann_notlist.json", "annotations"),
    C("detr-image-missing", COCO + "gone_image.json", "gone.png"),
    C("detr-image-broken", COCO + "broken_image.json", "broken.png"),
    C("detr-image-size", COCO + "size_mismatch.json", "0.png", "99"),
    C("detr-image-truncated", COCO + "truncated_image.json", "trunc0.jpg", "truncated",
      "--skip-bad-images"),
    C("detr-image-bomb", COCO + "bomb_image.json", r"bomb\.png.: too large", "900000000"),
    C("detr-images-bad", COCO + "bad_images.json", r"error: 5 of the 8 image files",
      r"trunc0.*trunc1.*trunc2.*; and 2 more\."),
    C("detr-unknown-category", COCO + "unknown_cat.json", "unknown_cat.json", "42"),
    C("detr-too-many-objects", COCO + "good.json --num-queries 1", r"[012]\.png"),
    C("detr-workdir-file", DETR, F("--workdir"), "director", state="file"),
    C("detr-two-processes", COCO + "good.json", "in use by process 4242", state="locked"),
    C("nmt-two-processes", TSV, "in use by process 4242", state="locked"),
    C("detr-metrics-list", DETR, "metrics.json", state="metrics_list"),
    C("detect-nothing", DETECT + "nothing" + IMG, "nothing"),
    C("detect-translator", DETECT + "translator" + IMG, "translator"),
    C("detect-classes-invalid", DETECT + "badclasses" + IMG, "classes.json"),
    C("detect-classes-list", DETECT + "listclasses" + IMG, "classes.json"),
    C("detect-no-images", DETECT + "detector", "IMAGE"),
    C("evaldetr-translator", EVAL_DETR + "translator --data embedded", "translator"),
    C("evaldetr-nothing", EVAL_DETR + "nothing --data embedded", "nothing"),
    C("evaldetr-scheme", EVAL_DETR + "detector --data foo:x", "foo"),
    C("evaldetr-coco-missing", EVAL_COCO + "missing.json", "missing.json"),
    C("evaldetr-bbox-str", EVAL_COCO + "bbox_str.json", "bbox_str.json", "annotation"),
    C("evaldetr-image-truncated", EVAL_COCO + "truncated_image.json", "trunc0.jpg"),
    C("evaldetr-other-ids", EVAL_COCO + "other_ids.json", "categor"),
    C("quick-workdir-file", QUICK, F("--workdir"), "director", state="file"),
    C("quick-metrics-list", QUICK, "metrics.json", state="quick_metrics_list"),
]


def _check(case, code, err, before, after):
    """What is wrong with one case's outcome; [] when it behaved."""
    problems = [f"exit code {code}, expected 2"] * (code != 2)
    problems += ["a traceback on stderr"] * ("Traceback" in err)
    lines = err.splitlines()
    errors = [i for i, line in enumerate(lines) if re.search(r"(^|: )error: ", line)]
    if len(errors) != 1:
        problems.append(f"{len(errors)} error: lines, expected 1")
    else:
        line, head = lines[errors[0]], lines[:errors[0]]
        problems += [f"error line does not match {p!r}" for p in case.expect
                     if not re.search(p, line)]
        if head and not (head[0].startswith("usage:")
                         and all(not h.strip() or h[0].isspace() for h in head[1:])):
            problems.append("stderr has other lines before the error line")
        if lines[errors[0] + 1:]:
            problems.append("stderr has lines after the error line")
    if before != after:
        changed = sorted(str(k) for k in {*before, *after} if before.get(k) != after.get(k))
        problems.append(f"files changed: {changed}")
    return problems


class _Stopped(BaseException):
    """The trap on `keras.Model.fit`, or the alarm: the case trained, or ran too long."""


_MODULES = {}


def _run(name, argv, seconds=0):
    """``main(argv)`` of the command ``scripts/NAME`` runs, as the script does; the exit code."""
    if name not in _MODULES:
        _MODULES[name] = importlib.import_module(COMMANDS[name])

    def alarm(signum, frame):
        raise _Stopped(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return _MODULES[name].main([str(arg) for arg in argv])
    except SystemExit as stop:  # argparse
        return stop.code
    except _Stopped as stopped:
        return str(stopped)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_named_error(case, fx, tmp_path, monkeypatch, capsys):
    argv = _prepare(case, tmp_path, fx)
    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=_Stopped("training started")))
    monkeypatch.chdir(tmp_path)
    for name in ("TF_CONFIG", "TFX_TRANSFORMER_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    if case.stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin), "utf-8"))
    before = _snapshot(tmp_path, fx)
    try:
        code = _run(argv[0], argv[1:], seconds=60)
    finally:
        while _HELD:
            os.close(_HELD.pop())
    err = capsys.readouterr().err
    problems = _check(case, code, err, before, _snapshot(tmp_path, fx))
    assert not problems, f"{case.command}: {problems}\nstderr:\n{err[-2000:]}"


GOOD_INPUT = [  # what must reach training (the trap on `fit`) with no error line
    ("detr-mpo-camera-file", [COCO + "camera.json"]),
    ("detr-exif-rotated-photo", [COCO + "phone.json"]),
    # A corpus too small for the default --vocab-size, then the same command continued.
    ("nmt-small-corpus-continued", [TSV + " --max-steps 1", TSV + " --max-steps 2"]),
]


@pytest.mark.parametrize("commands", [c for _, c in GOOD_INPUT], ids=[i for i, _ in GOOD_INPUT])
def test_good_input_reaches_training(commands, fx, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=_Stopped("training started")))
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = [part.format(W=tmp_path / "work", FX=fx) for part in shlex.split(command)]
        code = _run(argv[0], argv[1:], seconds=60)
        err = capsys.readouterr().err
        assert code == "training started", f"{command}: exit {code}\n{err[-2000:]}"
        assert "error:" not in err and "Traceback" not in err, err[-2000:]


def test_the_battery_covers_every_script():
    assert {case.command.split()[0] for case in CASES} == {f"{name}.py" for name in (
        "train_nmt", "translate", "evaluate_nmt", "train_detr", "detect", "evaluate_detr",
        "quickstart")}
    assert len(CASES) >= 45 and len({case.id for case in CASES}) == len(CASES)
    assert sorted(case.command.split()[0] for case in SHELL) == [
        "train_detr.py", "train_nmt.py", "translate.py"]


# Run again from the shell, the real entry points, one case per script (started together:
# each pays TensorFlow's import): a train_nmt.py data error found after the tokenizer is trained
# (what C++ code writes to file descriptor 2 reaches the shell, not `capsys`), a DETR data
# error, and a bad line of stdin. The shell adds TensorFlow's quiet start and the exit status of
# the script, the same for every case of a script; the cases themselves, argparse errors among
# them, all run above through the same `main`.
SHELL = [case for case in CASES if case.id in (
    "nmt-all-filtered", "detr-coco-missing", "translate-stdin-utf8")]


@pytest.fixture(scope="module")
def shell_runs(fx, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in (
        "TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG", "TFX_TRANSFORMER_DEBUG", "TFX_TRANSFORMER_VERBOSE")}
    runs = {}
    for case in SHELL:
        root = tmp_path_factory.mktemp(case.id)
        argv = _prepare(case, root, fx)
        before = _snapshot(root, fx)
        process = subprocess.Popen([sys.executable, ROOT / "scripts" / argv[0], *argv[1:]],
                                   cwd=root, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdin.write(case.stdin or b"")
        process.stdin.close()
        process.stdin = None  # so that communicate() does not touch it
        runs[case.id] = (root, before, process)
    yield runs
    for _, _, process in runs.values():
        process.kill()  # a no-op for those that ended


@pytest.mark.xdist_group("cli_shell")  # one worker starts the processes of `shell_runs`
@pytest.mark.parametrize("case", SHELL, ids=[case.id for case in SHELL])
def test_bad_input_from_the_shell(case, fx, shell_runs):
    root, before, process = shell_runs[case.id]
    try:
        err, code = process.communicate(timeout=120)[1], process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        err, code = process.communicate()[1], "still running after 120 s"
    err = err.decode("utf-8", "replace")
    problems = _check(case, code, err, before, _snapshot(root, fx))
    assert not problems, f"{case.command}: {problems}\nstderr:\n{err[-2000:]}"


# What must work: not errors.
def test_stdin_with_a_byte_order_mark_and_umlauts_translates(fx, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(
        io.BytesIO("\ufeffgrüße\n\nzwei\n".encode()), "utf-8"))
    assert _run("translate.py", ["--model", fx / "translator"]) == 0
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
    _coco(tmp_path / "ann.json", images=_images(sizes))
    monkeypatch.chdir(tmp_path)
    data, work = f"coco:{img}:{tmp_path / 'ann.json'}", tmp_path / "work"
    batches = []

    def first_batch(train, **kwargs):  # what `fit` would take first, then stop
        batches.append(next(iter(train)))
        raise _Stopped("training started")

    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=first_batch))
    code = _run("train_detr.py", ["--data", data, "--workdir", work, "--batch-size", 5,
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
    assert _run("evaluate_detr.py", ["--model", fx / "detector", "--data", data]) == 0, \
        capsys.readouterr().err[-3000:]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"] == len(sizes)
