"""The artefacts of tfx-export against the SavedModel they come from: parity, speed, size.

    python benchmarks/formats.py --detector DIR [--images 100] [--repeats 5]

Detector (``detector_rows``): DIR is a finished ``train_detr.py`` work directory. Each LiteRT
variant (float32, float16, int8, int8-full calibrated on 100 training images) and ONNX
(float32, int8) is written from its ``model.keras`` at the export's fixed size
(`vision.export.litert_onnx`), and run on the first ``--images`` held-out images of the run's data
(`prepare_image` for the files; the SavedModel takes the uint8 images, one at a time where
their sizes differ). Parity: the largest
box difference over all queries as a fraction of the image side, the largest score
difference, the share of images whose detections above 0.5 are the same (labels equal,
boxes within 1e-3 of the side), and COCO AP50 (pycocotools, `vision.training.evaluate`)
against the SavedModel's. Speed: images/s of the model alone (inputs prepared beforehand) at
batch 1 and 8, medians of ``--repeats`` alternating passes over 32 images, as a ratio to the
SavedModel's in the same pass (higher is faster). LiteRT at batch 8 is a second file
converted at that batch (its batch is fixed); ONNX has a dynamic batch. Size: bytes on disk
(the SavedModel: its whole directory). Threads: 2 for every runtime.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

THREADS = 2


def _litert_runner(data: bytes):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=data, num_threads=THREADS).get_signature_runner()
    return lambda images, mask: runner(images=images, mask=mask)


def _onnx_runner(data: bytes):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda images, mask: dict(zip(names, session.run(None, {"images": images,
                                                                  "mask": mask})))


def _artefacts(source) -> dict:
    """{name: (batch-1 runner, batch-8 runner, bytes)} of the `DetectorSource`."""
    from vision.export.litert_onnx import DetectorConverter, representative_images

    calibration = representative_images(source)
    found = {}
    with DetectorConverter(source) as one, DetectorConverter(source, batch_size=8) as eight:
        for precision in ("float32", "float16", "int8", "int8-full"):
            try:
                data = one.litert(precision, calibration)
            except Exception as error:  # a conversion that fails is a row of its own
                print(f"litert {precision}: the conversion failed ({type(error).__name__}: "
                      f"{str(error)[:200]})", flush=True)
                continue
            found[f"litert {precision}"] = (_litert_runner(data), _litert_runner(
                eight.litert(precision, calibration)), len(data))
        for precision in ("float32", "int8"):
            data = one.onnx(precision)
            runner = _onnx_runner(data)
            found[f"onnx {precision}"] = (runner, runner, len(data))
    return found


def _in_batches(run, count: int, batch: int) -> dict:
    """``run(slice)`` over the first ``count`` images, ``batch`` at a time, concatenated."""
    return _concatenated([run(slice(i, min(i + batch, count))) for i in range(0, count, batch)])


def _concatenated(outputs: list[dict]) -> dict:
    return {key: np.concatenate([o[key] for o in outputs]) for key in outputs[0]}


def _same_detections(found: dict, want: dict, sides: np.ndarray) -> float:
    """Share of images whose detections above 0.5 agree (labels; boxes within 1e-3)."""
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
    return coco_evaluate(truth, found)["AP50"]


def _images_per_second(run, count: int, batch: int) -> float:
    start = time.perf_counter()
    _in_batches(run, count, batch)
    return count / (time.perf_counter() - start)


def detector_rows(run_dir, count: int = 100, repeats: int = 5) -> list[dict]:
    """One row per artefact and one for the SavedModel (see the module docstring)."""
    from vision.data.sources import load_source
    from vision.export.litert_onnx import find_source, prepare_image
    from vision.export.load import load_detector

    source = find_source(run_dir)
    records = list(load_source(source.data, log=lambda *_: None).records("valid")
                   .take(count).as_numpy_iterator())
    uint8 = [r["image"] for r in records]
    artefacts = _artefacts(source)
    prepared = [prepare_image(image, source.settings()) for image in uint8]
    images, mask = np.stack([p for p, _ in prepared]), np.stack([m for _, m in prepared])
    sides = np.array([max(i.shape[:2]) for i in uint8], np.float32)
    scale = np.array([[i.shape[1], i.shape[0]] * 2 for i in uint8], np.float32)[:, None, :]
    detector = load_detector(pathlib.Path(source.model_file).parent / "export")
    if len({image.shape for image in uint8}) == 1:
        stacked = np.stack(uint8)
        runners = {"SavedModel": (lambda part: detector(stacked[part]),) * 2}
    else:  # images of several sizes: the SavedModel takes them one at a time
        runners = {"SavedModel": (lambda part: _concatenated(
            [detector(uint8[i][None]) for i in range(*part.indices(len(uint8)))]),) * 2}
    for name, (one, eight, _) in artefacts.items():
        runners[name] = tuple((lambda part, run=run: run(images[part], mask[part]))
                              for run in (one, eight))
    want = _in_batches(runners["SavedModel"][1], len(uint8), 8)
    saved_size = sum(f.stat().st_size for f in (source.model_file.parent / "export").rglob("*")
                     if f.is_file())
    rows = [{"artefact": "SavedModel", "AP50": _ap50(records, want), "bytes": saved_size}]
    for name, (_, _, size) in artefacts.items():
        found = _in_batches(runners[name][0], len(uint8), 1)
        found["boxes"] = found["boxes"] * scale
        rows.append({"artefact": name, "bytes": size,
                     "box": float((np.abs(found["boxes"] - want["boxes"]).max(axis=(1, 2))
                                   / sides).max()),
                     "score": float(np.abs(found["scores"] - want["scores"]).max()),
                     "same": _same_detections(found, want, sides),
                     "AP50": _ap50(records, found)})
    for batch, slot in ((1, 0), (8, 1)):
        speeds = {name: [] for name in runners}
        for _ in range(repeats):
            for name, pair in runners.items():  # alternating: every artefact each repeat
                speeds[name].append(_images_per_second(pair[slot], min(32, len(uint8)), batch))
        base = statistics.median(speeds["SavedModel"])
        for row in rows:
            median = statistics.median(speeds[row["artefact"]])
            row[f"img/s b{batch}"] = median
            row[f"ratio b{batch}"] = median / base
    return rows


def _table(rows: list[dict]) -> str:
    lines = ["| artefact | max box diff / side | max score diff | same detections > 0.5 | "
             "AP50 | ΔAP50 | img/s b1 | ratio | img/s b8 | ratio | size |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = rows[0]["AP50"]
    for r in rows:
        diff = (f"{r['box']:.1e} | {r['score']:.1e} | {r['same']:.0%}" if "box" in r
                else "— | — | —")
        lines.append(f"| {r['artefact']} | {diff} | {r['AP50']:.4f} | "
                     f"{r['AP50'] - base:+.4f} | {r['img/s b1']:.1f} | {r['ratio b1']:.2f} | "
                     f"{r['img/s b8']:.1f} | {r['ratio b8']:.2f} | {r['bytes'] / 1e6:.2f} MB |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--detector", help="a finished train_detr.py work directory")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.detector:
        print(_table(detector_rows(args.detector, args.images, args.repeats)))


if __name__ == "__main__":
    main()
