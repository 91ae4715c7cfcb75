"""train_detr.py, detect.py and evaluate_detr.py through their command lines."""

import contextlib
import importlib
import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tfx_transformer.cli import run_cli
from vision.config import PRESETS
from vision.data.shapes import ShapesGenerator

# With `-n 2`, the tests of the shared README DETR run (`detr_workdir`) share a worker.
pytestmark = pytest.mark.xdist_group("detr_workdir")

COMMANDS = {"train_detr.py": "vision.commands.train", "detect.py": "vision.commands.detect",
            "evaluate_detr.py": "vision.commands.evaluate"}  # what scripts/NAME runs


@pytest.fixture(scope="module")
def trained(detr_workdir):
    """The README's train_detr.py command, killed at its export and run again
    (tests/conftest.py; the kill: tests/scripts/test_run_lifecycle.py)."""
    work, runs = detr_workdir
    done = runs["done"][0]
    assert done.returncode == 0, done.stderr[-3000:]
    return work, done


@pytest.fixture(scope="module")
def coco_dir(tmp_path_factory):
    """Three shapes images of different sizes in COCO format, categories 1..3 (3 classes)."""
    tmp = tmp_path_factory.mktemp("coco")
    images, annotations = [], []
    generator = ShapesGenerator(seed=5, split="valid", image_size=96, min_image_size=48)
    for i in range(3):
        example = generator.example(i)
        Image.fromarray(example["image"]).save(tmp / f"{i}.png")
        height, width = example["image"].shape[:2]
        images.append({"id": i + 1, "file_name": f"{i}.png", "height": height, "width": width})
        for (x0, y0, x1, y1), label in zip(example["boxes"].tolist(), example["labels"]):
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1,
                                "category_id": int(label) + 1, "bbox": [x0, y0, x1 - x0, y1 - y0],
                                "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    categories = [{"id": i + 1, "name": n}
                  for i, n in enumerate(("circle", "square", "triangle"))]
    (tmp / "ann.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": categories}))
    return tmp


@pytest.mark.slow
def test_train_writes_the_work_directory(trained):
    work, _ = trained
    for name in ("metrics.json", "export/saved_model.pb", "export/classes.json", "logs",
                 "checkpoints/epoch-001.weights.h5"):
        assert (work / name).exists(), name
    metrics = json.loads((work / "metrics.json").read_text())
    valid = metrics["valid"]
    # No --eval-limit: every held-out image of the embedded data is scored.
    assert valid["n"] == metrics["data"]["valid_images"] == 40  # --eval-limit 40
    assert all(0.0 <= valid[k] <= 1.0 for k in ("AP", "AP50", "AP75"))
    assert metrics["config"]["num_queries"] == PRESETS["tiny"].num_queries
    assert metrics["config"]["batch_size"] == PRESETS["tiny"].batch_size
    assert metrics["config"]["preset"] == "tiny"
    assert metrics["data"]["class_names"] == ["circle", "square", "triangle"]


@pytest.mark.slow
def test_detect_writes_pictures_and_reports_unreadable_images(trained, coco_dir, tmp_path,
                                                              capsys):
    work, _ = trained
    (tmp_path / "broken.png").write_bytes(b"this is no image")
    Image.fromarray(np.zeros((30, 50), np.uint8)).save(tmp_path / "gray.png")
    out = tmp_path / "out"
    code = _main("detect.py")("--model", work / "export", "--threshold", 0.0, "--out", out,
                              coco_dir / "0.png", tmp_path / "broken.png",
                              tmp_path / "missing.jpg", tmp_path / "gray.png", coco_dir / "1.png")
    stderr = capsys.readouterr().err
    assert code == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "broken.png" in errors[0] and "missing.jpg" in errors[1]
    assert sorted(p.name for p in out.iterdir()) == [
        "0.json", "0.png", "1.json", "1.png", "gray.json", "gray.png"]
    report = json.loads((out / "gray.json").read_text())
    assert (report["height"], report["width"]) == (30, 50)
    # Threshold 0: every query, best first.
    assert len(report["detections"]) == PRESETS["tiny"].num_queries
    first = report["detections"][0]
    assert first["label"] in ("circle", "square", "triangle") and len(first["box"]) == 4
    scores = [d["score"] for d in report["detections"]]
    assert scores == sorted(scores, reverse=True)
    assert Image.open(out / "0.png").format == "PNG"
    assert _main("detect.py")("--model", work / "export", "--out", out, coco_dir / "0.png") == 0
    assert json.loads((out / "0.json").read_text())["threshold"] == 0.7  # the default


@pytest.mark.slow
def test_evaluate_scores_every_coco_image(trained, coco_dir, capsys):
    work, _ = trained
    code = _main("evaluate_detr.py")("--model", work / "export", "--data",
                                     f"coco:{coco_dir}:{coco_dir / 'ann.json'}")
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    scores = json.loads(captured.out.strip().splitlines()[-1])
    assert scores["n"] == 3 and set(scores) == {"AP", "AP50", "AP75", "n", "empty_images",
                                                "false_positives_per_empty_image"}
    assert all(0.0 <= scores[k] <= 1.0 for k in ("AP", "AP50", "AP75"))


def _main(script):
    """The script's ``main`` wrapped in ``run_cli``, run in this process (saves a start-up)."""
    module = importlib.import_module(COMMANDS[script])
    return lambda *args: run_cli(module.main, [str(a) for a in args])


# Bad input (exit 2, one error line, the work directory kept): tests/scripts/test_cli_battery.py.


# --- detect.py and evaluate_detr.py on a small untrained export (no training: fast) ----------

NAMES = ("circle", "square", "triangle")


@pytest.fixture(scope="module")
def small_export(detr_export):
    """A small untrained detector's export (labels circle, square, triangle; no category ids;
    tests/conftest.py)."""
    return detr_export[1]


def _save_noise(path, height, width, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return pixels


def test_detect_takes_any_readable_image_and_names_each_unreadable_one(small_export, detr_export,
                                                                      tmp_path, capsys):
    queries = detr_export[2].num_queries
    _save_noise(tmp_path / "wide.png", 10, 5000, 0)
    _save_noise(tmp_path / "tall.png", 5000, 10, 1)
    (tmp_path / "broken.png").write_bytes(b"this is no image")
    (tmp_path / "folder.png").mkdir()
    # A 20000 x 20000 PNG's header (a decompression bomb: 1.2 GB decoded): refused unread.
    (tmp_path / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
                                        + (20000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00")
    out = tmp_path / "out"
    images = ["wide.png", "broken.png", "missing.jpg", "folder.png", "bomb.png", "tall.png"]
    code = _main("detect.py")("--model", small_export, "--threshold", 0.0, "--out", out,
                              *(tmp_path / name for name in images))
    err = capsys.readouterr().err
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 4, err
    for line, name in zip(errors, ("broken.png", "missing.jpg", "folder.png", "bomb.png")):
        assert line.startswith("error: cannot read image ") and name in line, line
    assert errors[3].endswith(": a 20000 x 20000 image (400,000,000 pixels) is larger than the "
                              "limit of 89,478,485 pixels (--max-image-pixels)"), errors[3]
    assert "wide.png" not in err and "tall.png" not in err
    assert sorted(p.name for p in out.iterdir()) == [
        "tall.json", "tall.png", "wide.json", "wide.png"]
    for name, size in (("wide", (10, 5000)), ("tall", (5000, 10))):
        report = json.loads((out / f"{name}.json").read_text())
        assert (report["height"], report["width"]) == size
        assert len(report["detections"]) == queries  # threshold 0: every query
        assert Image.open(out / f"{name}.png").format == "PNG"


def _coco_of_own_detections(folder, export, categories):
    """Three noise images (one 5000 x 10) whose ground truth is the export's best detection
    of each, under `categories` (id -> name); returns (annotations path, pycocotools' AP)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from vision.export.load import load_detector

    detector = load_detector(export)
    id_of = {name: i for i, name in categories.items()}
    content = {"images": [], "annotations": [],
               "categories": [{"id": i, "name": n} for i, n in categories.items()]}
    results = []
    for index, (height, width) in enumerate([(10, 5000), (30, 40), (40, 30)]):
        pixels = _save_noise(folder / f"{index}.png", height, width, index)
        found = detector(pixels[None])
        content["images"].append({"id": index + 1, "file_name": f"{index}.png",
                                  "height": height, "width": width})
        boxes = found["boxes"][0].astype(np.float64)
        names = [NAMES[label] for label in found["labels"][0]]
        for box, name, score in zip(boxes, names, found["scores"][0]):
            results.append({"image_id": index + 1, "category_id": id_of[name], "score":
                            float(score), "bbox": [*box[:2], *(box[2:] - box[:2])]})
        best = int(np.argmax(found["scores"][0]))
        x0, y0 = max(boxes[best][0], 0.0), max(boxes[best][1], 0.0)
        x1, y1 = min(boxes[best][2], width), min(boxes[best][3], height)
        content["annotations"].append({
            "id": index + 1, "image_id": index + 1, "category_id": id_of[names[best]],
            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    path = folder / "ann.json"
    path.write_text(json.dumps(content))
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        ground_truth = COCO(str(path))
        evaluator = COCOeval(ground_truth, ground_truth.loadRes(results), iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return path, [round(float(v), 6) for v in evaluator.stats[:3]]


def _with_category_ids(export, folder, ids):
    copy = folder / "export-ids"
    shutil.copytree(export, copy)
    (copy / "classes.json").write_text(json.dumps({"class_names": list(NAMES),
                                                   "category_ids": ids}))
    return copy


def test_evaluate_maps_labels_through_classes_json_or_names_both_lists(small_export, tmp_path,
                                                                       capsys):
    # The file lists the classes in another order: triangle is id 1, circle 2, square 3.
    path, want = _coco_of_own_detections(tmp_path, small_export,
                                         {1: "triangle", 2: "circle", 3: "square"})
    assert want[1] > 0  # the best detection of each image is found
    evaluate = _main("evaluate_detr.py")
    data = f"coco:{tmp_path}:{path}"
    for model in (small_export, _with_category_ids(small_export, tmp_path, [2, 3, 1])):
        assert evaluate("--model", model, "--data", data) == 0  # by name, then by id
        scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert [scores[k] for k in ("AP", "AP50", "AP75")] == want and scores["n"] == 3
    # Ids that disagree with the names, or other classes: refused, both lists named.
    wrong = _with_category_ids(small_export, tmp_path / "w", [1, 2, 3])
    assert evaluate("--model", wrong, "--data", data) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --model ")
    assert "model [1: 'circle', 2: 'square', 3: 'triangle']" in err
    assert "data [1: 'triangle', 2: 'circle', 3: 'square']" in err
    other = json.loads(path.read_text())
    other["categories"] = [{"id": i, "name": n} for i, n in ((1, "cat"), (2, "dog"), (3, "owl"))]
    path.write_text(json.dumps(other))
    assert evaluate("--model", small_export, "--data", data) == 2
    err = capsys.readouterr().err
    assert "class names must agree" in err
    assert "model ['circle', 'square', 'triangle'], data [1: 'cat', 2: 'dog', 3: 'owl']" in err
