"""tfx-export's files against the SavedModel they come from: parity, speed, size, ΔAP50/BLEU.

Detector (this module): a ``train_detr.py`` work directory, as LiteRT (float32, float16,
int8, int8-full calibrated on the first ``calibration`` training images) and ONNX (float32,
int8), each written from its ``model.keras`` at the export's fixed size by
`vision.export.litert_onnx`, run on the first ``images`` held-out images of the run's data
(`prepare_image` for the files; the SavedModel takes the uint8 images, one at a time where
their sizes differ). Rows per file:

- parity with the SavedModel: the largest box difference over all queries as a fraction of
  the image side, the largest score difference, the share of images whose detections above
  0.5 are the same (labels equal, boxes within 1e-3 of the side), and COCO AP50
  (pycocotools, `vision.training.evaluate`) minus the SavedModel's (its own AP50 is a row);
- speed: milliseconds per image of the model alone (inputs prepared beforehand) at each
  batch, over the first ``speed_images`` images per pass, every file and the SavedModel
  alternating (`harness.alternate`, ``repeats`` rounds); ours = the file, peer = the
  SavedModel. A LiteRT file's batch is fixed: batch 8 is a second file converted at 8; ONNX
  has a dynamic batch;
- size on disk (the SavedModel: its whole directory).

Translator: `cases.formats_translator` (CTranslate2 float32 and int8).

Runs: ``detector``/``translator`` None trains one into the work directory with the project's
commands (reused once finished): ``train_detr.py --data embedded --preset tiny --time-budget
10`` (the 10-minute run of experiments/README.md) and ``train_nmt.py --data embedded --preset
tiny --max-steps 300``; a path takes that run instead. Every runtime (TensorFlow included) gets
2 threads. Each part runs in its own child process (`workers.run_once`).

Sizes: ``standard``: 100 images, batches 1 and 8, 5 rounds; 500 sentences, 3 rounds (with
both trainings about 20 minutes on 2 cores, 6 without). ``tiny``: untrained small models,
4 images at batch 1, 8 sentences, 1 round; both parts at once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib
import json
import pathlib
import shutil
import sys
import time

import harness
import workers

DESCRIPTION = ("the detector's LiteRT and ONNX files and the translator's CTranslate2 models "
               "against their SavedModel: parity, speed, size, AP50 and BLEU")

SIZES = {
    "tiny": {"detector": "random", "images": 4, "calibration": 4, "batches": [1],
             "speed_images": 4, "repeats": 1, "translator": "random", "sentences": 8,
             "batch_size": 8, "translator_repeats": 1, "threads": 2, "parallel": True},
    "standard": {"detector": None, "detector_train": ["--data", "embedded", "--preset", "tiny",
                                                      "--time-budget", "10"],
                 "images": 100, "calibration": 100, "batches": [1, 8], "speed_images": 32,
                 "repeats": 5, "translator": None,
                 "translator_train": ["--data", "embedded", "--preset", "tiny",
                                      "--max-steps", "300"],
                 "sentences": 500, "batch_size": 32, "translator_repeats": 3, "threads": 2,
                 "parallel": False},
}

PARTS = {"detector": "cases.formats", "translator": "cases.formats_translator"}
TRAIN = {"detector": "vision.commands.train", "translator": "nlp.commands.train"}
LITERT = ("float32", "float16", "int8", "int8-full")
ONNX = ("float32", "int8")


def run(size: dict, workdir: pathlib.Path) -> list[harness.Row]:
    runs = {part: _run_dir(size, part, workdir) for part in PARTS}

    def part_rows(part: str) -> list[harness.Row]:
        payload = {"size": size, "run_dir": runs[part], "scratch": str(workdir)}
        argv = [workers.PY, "-m", PARTS[part]] + (["detector"] if part == "detector" else [])
        answer = workers.run_once(argv + [json.dumps(payload)], log=workdir / f"{part}.log")
        return [harness.Row(**row) for row in answer["rows"]]

    if size["parallel"]:  # tiny: the two parts share the cores (their times mean nothing)
        with concurrent.futures.ThreadPoolExecutor(len(PARTS)) as pool:
            found = list(pool.map(part_rows, PARTS))
    else:
        found = [part_rows(part) for part in PARTS]
    return [row for rows in found for row in rows]


def _run_dir(size: dict, part: str, workdir: pathlib.Path) -> str:
    """The run of ``part``: the given path, or ``workdir/part`` (trained there unless it holds
    a finished run; built by the child at random weights for ``"random"``)."""
    given = size[part]
    if given not in (None, "random"):
        return str(pathlib.Path(given).resolve())
    path = workdir / part
    state = path / "run.json"
    if given is None and not (state.is_file()
                              and json.loads(state.read_text()).get("phase") == "finished"):
        workers.run_once([workers.PY, "-m", "cases.formats", "train", part,
                          *size[f"{part}_train"], "--workdir", str(path)],
                         log=workdir / f"train-{part}.log")
    return str(path)


def set_threads(threads: int) -> None:
    """TensorFlow's intra- and inter-op threads (before it starts)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


# ------------------------------------------------------------------------ the detector child

def _random_detector(root: pathlib.Path) -> None:
    """A small untrained DETR as a work directory (export/, model.keras, metrics.json) at
    64 x 64: the embedded data's 128 x 128 images need no padding."""
    import keras

    from vision.config import preset
    from vision.data.shapes import CLASS_NAMES
    from vision.export.saved_model import export_detector
    from vision.modeling.detr import build_model

    shutil.rmtree(root, ignore_errors=True)
    config = preset("tiny", hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6,
                    tiny_filters=(8, 16, 16, 32), num_encoder_layers=1, num_decoder_layers=1,
                    image_size=64, max_image_size=64)
    keras.utils.set_random_seed(5)
    model = build_model(config, len(CLASS_NAMES))
    export_detector(model, root / "export", CLASS_NAMES, 64, 64)
    model.save(root / "model.keras")
    (root / "metrics.json").write_text(json.dumps({"config": dataclasses.asdict(config),
                                                   "data": {"spec": "embedded"}}))


def _litert_runner(data: bytes, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=data, num_threads=threads).get_signature_runner()
    return lambda images, mask: runner(images=images, mask=mask)


def _onnx_runner(data: bytes, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda images, mask: dict(zip(names, session.run(None, {"images": images,
                                                                  "mask": mask})))


def _files(source, size: dict) -> tuple[dict, dict]:
    """``{name: ({batch: runner}, bytes of the first batch's file)}`` and ``{name: error}``
    of the LiteRT conversions that failed."""
    from vision.export.litert_onnx import DetectorConverter, representative_images

    threads, batches = size["threads"], size["batches"]
    calibration = representative_images(source, size["calibration"])
    found, failed = {}, {}
    with contextlib.ExitStack() as stack:
        converters = {batch: stack.enter_context(DetectorConverter(source, batch_size=batch))
                      for batch in batches}
        for precision in LITERT:
            try:
                data = {batch: converter.litert(precision, calibration)
                        for batch, converter in converters.items()}
            except Exception as error:  # a conversion that fails is a row of its own
                failed[f"litert {precision}"] = f"{type(error).__name__}: {str(error)[:200]}"
                continue
            found[f"litert {precision}"] = ({b: _litert_runner(d, threads)
                                             for b, d in data.items()}, len(data[batches[0]]))
        for precision in ONNX:
            data = converters[batches[0]].onnx(precision)
            runner = _onnx_runner(data, threads)
            found[f"onnx {precision}"] = ({batch: runner for batch in batches}, len(data))
    return found, failed


def _in_batches(run, count: int, batch: int) -> dict:
    """``run(slice)`` over the first ``count`` images, ``batch`` at a time, concatenated."""
    return _concatenated([run(slice(i, min(i + batch, count))) for i in range(0, count, batch)])


def _concatenated(outputs: list[dict]) -> dict:
    import numpy as np

    return {key: np.concatenate([o[key] for o in outputs]) for key in outputs[0]}


def _same_detections(found: dict, want: dict, sides) -> float:
    """Share of images whose detections above 0.5 agree (labels; boxes within 1e-3)."""
    import numpy as np

    same = 0
    for i, side in enumerate(sides):
        a, b = found["scores"][i] > 0.5, want["scores"][i] > 0.5
        if (a == b).all() and (found["labels"][i][a] == want["labels"][i][a]).all() and (
                np.abs(found["boxes"][i][a] - want["boxes"][i][a]) <= 1e-3 * side).all():
            same += 1
    return same / len(sides)


def _ap50(records, outputs) -> float:
    from vision.training.evaluate import coco_evaluate

    truth = [{"image_id": int(r["image_id"]), "height": r["image"].shape[0],
              "width": r["image"].shape[1], "boxes": r["boxes"], "labels": r["labels"]}
             for r in records]
    found = [{"image_id": int(r["image_id"]), **{k: outputs[k][i] for k in outputs}}
             for i, r in enumerate(records)]
    return float(coco_evaluate(truth, found)["AP50"])


def _seconds_per_image(run, count: int, batch: int) -> float:
    start = time.perf_counter()
    _in_batches(run, count, batch)
    return (time.perf_counter() - start) / count


def _megabytes(path: pathlib.Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def detector_rows(size: dict, run_dir: str) -> list[harness.Row]:
    """The detector's rows (see the module's docstring)."""
    set_threads(size["threads"])
    import numpy as np

    from vision.data.sources import load_source
    from vision.export.litert_onnx import find_source, prepare_image
    from vision.export.load import load_detector

    if size["detector"] == "random":
        _random_detector(pathlib.Path(run_dir))
    source = find_source(run_dir)
    records = list(load_source(source.data, log=lambda *_: None).records("valid")
                   .take(size["images"]).as_numpy_iterator())
    uint8, batches = [r["image"] for r in records], size["batches"]
    files, failed = _files(source, size)
    prepared = [prepare_image(image, source.settings()) for image in uint8]
    images, mask = np.stack([p for p, _ in prepared]), np.stack([m for _, m in prepared])
    sides = np.array([max(i.shape[:2]) for i in uint8], np.float32)
    scale = np.array([[i.shape[1], i.shape[0]] * 2 for i in uint8], np.float32)[:, None, :]
    export = source.model_file.parent / "export"
    detector = load_detector(export)
    stacked = np.stack(uint8) if len({image.shape for image in uint8}) == 1 else None

    def saved(part: slice) -> dict:
        if stacked is not None:
            return detector(stacked[part])
        # images of several sizes: the SavedModel takes them one at a time
        return _concatenated([detector(uint8[i][None]) for i in range(*part.indices(len(uint8)))])

    runners = {"SavedModel": {batch: saved for batch in batches}}
    for name, (by_batch, _) in files.items():
        runners[name] = {batch: (lambda part, run=run: run(images[part], mask[part]))
                         for batch, run in by_batch.items()}
    want = _in_batches(saved, len(uint8), max(batches))
    base, saved_size = _ap50(records, want), _megabytes(export)
    settings = {"images": len(uint8), "input": list(source.input_shape)}
    rows = [harness.Row("detector SavedModel: AP50", ours=base, unit="AP50", settings=settings),
            harness.Row("detector SavedModel: size", ours=saved_size, unit="MB")]
    for name, error in failed.items():
        rows.append(harness.Row(f"detector {name}: conversion failed", ours=None, unit="",
                                extra={"error": error}))
    for name, (_, nbytes) in files.items():
        found = _in_batches(runners[name][batches[0]], len(uint8), batches[0])
        found["boxes"] = found["boxes"] * scale
        box = (np.abs(found["boxes"] - want["boxes"]).max(axis=(1, 2)) / sides).max()
        ap = _ap50(records, found)
        rows += [
            harness.Row(f"detector {name}: max box diff / side", ours=float(box), unit="",
                        settings=settings),
            harness.Row(f"detector {name}: max score diff", unit="", settings=settings,
                        ours=float(np.abs(found["scores"] - want["scores"]).max())),
            harness.Row(f"detector {name}: same detections > 0.5", unit="%", settings=settings,
                        ours=100 * _same_detections(found, want, sides)),
            harness.Row(f"detector {name}: ΔAP50", ours=ap - base, unit="AP50",
                        settings=settings, extra={"AP50": ap, "SavedModel AP50": base}),
            harness.Row(f"detector {name}: size", ours=nbytes / 1e6, unit="MB",
                        extra={"share of the SavedModel": nbytes / 1e6 / saved_size})]
    count = min(size["speed_images"], len(uint8))
    for batch in batches:
        contenders = {name: (lambda run=by_batch[batch], b=batch: _seconds_per_image(run, count, b))
                      for name, by_batch in runners.items()}
        times = harness.alternate(contenders, size["repeats"])
        for name in files:
            rows.append(harness.compare(
                f"detector {name}: per image, batch {batch}", times, ours=name,
                peer="SavedModel", settings={"batch": batch, "images": count,
                                             "threads": size["threads"]}))
    return rows


def _child(argv: list[str]) -> None:
    """``train PART ARGS...``: the project's training command; ``detector PAYLOAD``: the rows."""
    if argv[0] == "train":
        code = importlib.import_module(TRAIN[argv[1]]).main(argv[2:])
        if code:
            raise SystemExit(code)
        workers.emit({"returncode": code})
    elif argv[0] == "detector":
        payload = json.loads(argv[1])
        rows = detector_rows(payload["size"], payload["run_dir"])
        workers.emit({"rows": [row.to_json() for row in rows]})
    else:
        raise SystemExit(f"unknown command {argv[0]!r}")


if __name__ == "__main__":
    _child(sys.argv[1:])
