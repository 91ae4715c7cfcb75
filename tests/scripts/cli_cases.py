"""The command-line battery's cases (test_cli_battery.py, test_cli_good_input.py): work
directory states, each bad input with its error line, and `run_command` (the fixture files
they read: conftest.py)."""


import collections
import fcntl
import importlib
import json
import os
import re
import shlex
import shutil
import signal
from pathlib import Path

import tensorflow as tf

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


def save_export(path, info_file, info, **signatures):
    """A stand-in export: a SavedModel with the real signatures and the real info file."""
    tf.saved_model.save(tf.Module(), str(path), signatures={
        name: tf.function(fn, input_signature=[spec]) for name, (fn, spec) in signatures.items()})
    (path / info_file).write_text(json.dumps(info))


def no_boxes(x):  # two empty detections per image
    n = tf.shape(x)[0]
    return {"boxes": tf.zeros([n, 2, 4]), "scores": tf.zeros([n, 2]),
            "labels": tf.zeros([n, 2], tf.int32)}


def coco_images(sizes=SIZES):
    return [{"id": i + 1, "file_name": name, "height": h, "width": w}
            for i, (name, (h, w)) in enumerate(sizes.items())]


def write_coco(path, images=None, annotations=None, categories=CATEGORIES):
    images = coco_images() if images is None else images
    if annotations is None:  # two boxes in each image
        annotations = [{"id": 3 * i + k + 1, "image_id": i + 1, "category_id": k % 3 + 1,
                        "bbox": [2 + 4 * k, 2, 5, 6], "area": 30, "iscrowd": 0}
                       for i in range(len(images)) for k in range(2)]
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": categories}))


def coco_box(bbox, **fields):
    return {"id": 7, "image_id": 1, "category_id": 1, "bbox": bbox, "iscrowd": 0, **fields}


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


HELD = []  # file descriptors of the "locked" state's lock, closed after its case


def prepare(case, root, fx):
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
        HELD.append(fd)
    return [part.format(W=work, FX=fx, R=root) for part in shlex.split(case.command)]


def snapshot(*roots):
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
    A("detr-deim-detr", DETR + " --deim", F("--deim"), "rtdetr"),  # the default tiny: DETR
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


def check(case, code, err, before, after):
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


class Stopped(BaseException):
    """The trap on `keras.Model.fit`, or the alarm: the case trained, or ran too long."""


MODULES = {}


def run_command(name, argv, seconds=0):
    """``main(argv)`` of the command ``scripts/NAME`` runs, as the script does; the exit code."""
    if name not in MODULES:
        MODULES[name] = importlib.import_module(COMMANDS[name])

    def alarm(signum, frame):
        raise Stopped(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        return MODULES[name].main([str(arg) for arg in argv])
    except SystemExit as stop:  # argparse
        return stop.code
    except Stopped as stopped:
        return str(stopped)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
