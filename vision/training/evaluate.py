"""COCO AP / AP50 / AP75 of a detector, computed by ``pycocotools`` (never a hand-written mAP).

Ground truth and detections are converted to COCO format in memory (boxes ``[x, y, w, h]``
in pixels, one category per label, annotation ids from 1) and scored by ``COCOeval``: AP is
the mean over IoU thresholds 0.50:0.05:0.95 of the 101-point interpolated precision, over
the categories that have ground truth, with at most 100 detections per image (the best-scored
100 of all categories, as the COCO detection challenge counts them). Crowd regions
(records' ``crowd_boxes``/``crowd_labels``) are ground truth with ``iscrowd=1``, as in the
official evaluation: a detection on one is neither a hit nor a false positive. (Two
differences from scoring the original file remain, both absent from well-formed data: boxes
reaching outside the image are clipped to it, and boxes of zero width or height are dropped.)

Two ways in:

- `coco_evaluate(ground_truth, detections)`: per-image dicts of boxes you already have
  (for instance `vision.modeling.postprocess.postprocess` outputs scaled to the original images);
- `evaluate_records(detect, records)`: runs ``detect`` (uint8 images -> boxes/scores/labels,
  e.g. `vision.export.saved_model.make_detect_fn` in process or a loaded
  `vision.export.load.Detector`) over
  a split's records (`vision.data.DetectionSource.records`) and scores it.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import keras
import numpy as np

from tfx_transformer import checks

__all__ = ["MAX_DETECTIONS", "coco_evaluate", "evaluate_records", "match_labels", "to_coco"]


def _xywh(boxes) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)


MAX_DETECTIONS = 100  # per image, over all categories: COCO's detection limit


def to_coco(ground_truth: Sequence[Mapping], detections: Sequence[Mapping],
            num_classes: int | None = None, max_detections: int | None = MAX_DETECTIONS,
            ) -> tuple[dict, list[dict]]:
    """COCO-format ground truth (a dataset dict) and results (a list) of per-image dicts.

    Each image keeps its ``max_detections`` best-scored detections (COCO's limit of 100 per
    image; ``COCOeval``'s own ``maxDets`` counts per image *and category*, so a model with
    more queries than that would otherwise be scored on more than 100 detections an image).

    Args:
        ground_truth: one dict per image: ``image_id`` int, ``height``, ``width``, ``boxes``
            ``(N, 4)`` xyxy pixels, ``labels`` ``(N,)`` int in ``[0, C)``; optionally the
            crowd regions ``crowd_boxes`` ``(K, 4)`` and ``crowd_labels`` ``(K,)`` (written
            with ``iscrowd=1``).
        detections: dicts with ``image_id``, ``boxes`` ``(Q, 4)`` xyxy pixels, ``scores``
            ``(Q,)``, ``labels`` ``(Q,)``; optionally ``keep`` ``(Q,)`` bool.
        num_classes: ``C`` (default: one more than the largest label seen).
        max_detections: the most detections kept per image (None: all).

    Returns:
        ``(dataset, results)`` in the formats ``pycocotools`` reads.
    """
    checks.positive_int("max_detections", max_detections, optional=True)
    if num_classes is None:
        labels = [np.asarray(x[key]).reshape(-1) for x in [*ground_truth, *detections]
                  for key in ("labels", "crowd_labels") if key in x]
        num_classes = int(max((int(v.max()) for v in labels if v.size), default=-1)) + 1
    images, annotations = [], []
    for item in ground_truth:
        images.append({"id": int(item["image_id"]), "height": int(item["height"]),
                       "width": int(item["width"])})
        for crowd, (boxes, labels) in enumerate(
                [(item["boxes"], item["labels"]),
                 (item.get("crowd_boxes", ()), item.get("crowd_labels", ()))]):
            for box, label in zip(_xywh(boxes), np.asarray(labels).reshape(-1)):
                annotations.append({
                    "id": len(annotations) + 1,  # pycocotools treats id 0 as "unmatched"
                    "image_id": int(item["image_id"]), "category_id": int(label),
                    "bbox": [float(v) for v in box], "area": float(box[2] * box[3]),
                    "iscrowd": crowd,
                })
    dataset = {"images": images, "annotations": annotations,
               "categories": [{"id": i, "name": str(i)} for i in range(num_classes)]}
    results = []
    for item in detections:
        keep = np.asarray(item.get("keep", True), bool)
        boxes = _xywh(item["boxes"])
        scores = np.asarray(item["scores"], np.float64).reshape(-1)
        labels = np.asarray(item["labels"]).reshape(-1)
        kept = np.flatnonzero(np.broadcast_to(keep, scores.shape))
        kept = kept[np.argsort(-scores[kept], kind="stable")][:max_detections]
        for i in kept:
            results.append({"image_id": int(item["image_id"]), "category_id": int(labels[i]),
                            "bbox": [float(v) for v in boxes[i]], "score": float(scores[i])})
    return dataset, results


def coco_evaluate(ground_truth: Sequence[Mapping], detections: Sequence[Mapping],
                  num_classes: int | None = None, threshold: float = 0.5,
                  class_names: Sequence[str] | None = None,
                  max_detections: int | None = MAX_DETECTIONS) -> dict:
    """COCO box AP of ``detections`` against ``ground_truth`` (formats as `to_coco`).

    Args:
        ground_truth, detections, num_classes, max_detections: as `to_coco`.
        threshold: a detection scored above it counts as a false positive on an image
            without objects.
        class_names: also report the AP of each class (``per_class``), under these names
            (label ``i`` is ``class_names[i]``).

    Returns:
        ``{"AP", "AP50", "AP75", "n", "empty_images", "false_positives_per_empty_image"}``:
        AP floats in [0, 1] (None when there is no ground-truth box at all, where COCO reports
        -1), the number of images, the number of images without objects (no box, no crowd
        region) and the mean number of detections above ``threshold`` on each (None when there
        is none); with ``class_names``, ``per_class``: ``{name: AP}`` (None for a class without
        ground truth).
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"`threshold` must be in [0, 1). Received: threshold={threshold}")
    dataset, results = to_coco(ground_truth, detections, num_classes, max_detections)
    if class_names is not None and len(class_names) != len(dataset["categories"]):
        raise ValueError(f"`class_names` must name the {len(dataset['categories'])} classes. "
                         f"Received: {len(class_names)} names")
    known = {image["id"] for image in dataset["images"]}
    unknown = sorted({r["image_id"] for r in results} - known)
    if unknown:
        raise ValueError(f"Detections name images without ground truth: image_id={unknown[:5]}")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        if results:
            dt = gt.loadRes(results)
        else:  # loadRes cannot take an empty list
            dt = COCO()
            dt.dataset = {**dataset, "annotations": []}
            dt.createIndex()
        evaluator = COCOeval(gt, dt, iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [None if v < 0 else round(float(v), 6) for v in evaluator.stats[:3]]
    scores = {"AP": stats[0], "AP50": stats[1], "AP75": stats[2], "n": len(dataset["images"]),
              **_false_positives(dataset, results, threshold)}
    if class_names is not None:
        # precision: [IoU threshold, recall point, class, area range "all", maxDets 100]
        precision = evaluator.eval["precision"][:, :, :, 0, -1]
        scores["per_class"] = {}
        for index, name in enumerate(class_names):
            values = precision[:, :, index]
            values = values[values > -1]
            scores["per_class"][str(name)] = round(float(values.mean()), 6) if values.size \
                else None
    return scores


def _false_positives(dataset: Mapping, results: Sequence[Mapping], threshold: float) -> dict:
    """The images without any annotation, and the mean count of results above ``threshold``
    on each (what a detector "sees" in empty scenes)."""
    with_objects = {a["image_id"] for a in dataset["annotations"]}
    empty = {image["id"] for image in dataset["images"]} - with_objects
    found = sum(1 for r in results if r["image_id"] in empty and r["score"] > threshold)
    return {"empty_images": len(empty),
            "false_positives_per_empty_image": round(found / len(empty), 6) if empty else None}


def _same_size_batches(records: Iterable[Mapping], batch_size: int):
    """Groups consecutive records whose images have the same size (the detector takes one
    ``(B, H, W, 3)`` array)."""
    batch: list[Mapping] = []
    for record in records:
        if batch and (len(batch) == batch_size
                      or batch[0]["image"].shape != record["image"].shape):
            yield batch
            batch = []
        batch.append(record)
    if batch:
        yield batch


def _pairs(names: Sequence[str], ids: Sequence[int] | None) -> str:
    if ids is None:
        return "[" + ", ".join(repr(str(n)) for n in names) + "]"
    return "[" + ", ".join(f"{int(i)}: {str(n)!r}" for i, n in zip(ids, names)) + "]"


def match_labels(model_names: Sequence[str], model_ids: Sequence[int] | None,
                 data_names: Sequence[str], data_ids: Sequence[int] | None) -> np.ndarray:
    """The data's label of each model label, matched by COCO category id, else by name.

    Where both sides have category ids (a model trained on ``coco:`` data scored on ``coco:``
    data) label ``i`` maps to the data label with the same id, and the two names of each id
    must agree too; otherwise names are matched. Either way both sides must hold the same
    classes (in any order): a model cannot be scored on classes it does not know.

    Args:
        model_names, model_ids: the export's ``classes.json`` (ids None where it has none).
        data_names, data_ids: the data source's class names and category ids (or None).

    Returns:
        ``(C,)`` int32: ``result[model_label] = data_label``.

    Raises:
        ValueError: the classes differ; the message lists both (ids and names).
    """
    model_names, data_names = [str(n) for n in model_names], [str(n) for n in data_names]
    by_id = model_ids is not None and data_ids is not None
    model_keys = [int(i) for i in model_ids] if by_id else model_names
    data_keys = [int(i) for i in data_ids] if by_id else data_names
    same = (len(set(model_keys)) == len(model_keys) == len(data_keys) == len(set(data_keys))
            and set(model_keys) == set(data_keys))
    mapping = [data_keys.index(key) for key in model_keys] if same else []
    if same and by_id:
        same = all(model_names[i] == data_names[j] for i, j in enumerate(mapping))
    if not same:
        key = "category ids and names" if by_id else "class names"
        raise ValueError(
            f"The model's classes do not match the data's ({key} must agree; order may "
            f"differ): model {_pairs(model_names, model_ids)}, "
            f"data {_pairs(data_names, data_ids)}.")
    return np.array(mapping, np.int32)


def evaluate_records(detect: Callable, records, batch_size: int = 8, limit: int | None = None,
                     num_classes: int | None = None, progress: bool | None = None,
                     label_map: Sequence[int] | None = None, threshold: float = 0.5,
                     class_names: Sequence[str] | None = None) -> dict:
    """Runs ``detect`` over every record and returns its COCO AP (`coco_evaluate`).

    Args:
        detect: ``images (B, H, W, 3) uint8 -> {"boxes" (B, Q, 4) xyxy pixels of those
            images, "scores" (B, Q), "labels" (B, Q)}`` (tensors or arrays).
        records: a `tf.data.Dataset` (or iterable) of records ``{"image" (H, W, 3) uint8,
            "boxes" (N, 4) xyxy pixels, "labels" (N,), "image_id"}`` and optionally the crowd
            regions ``"crowd_boxes"``, ``"crowd_labels"``, as
            `vision.data.DetectionSource.records` gives.
        batch_size: most images per ``detect`` call (consecutive images of one size).
        limit: score at most this many images.
        num_classes: number of classes (default: inferred from the labels).
        progress: show a progress bar on stderr (default: when stderr is a terminal).
        label_map: the records' label of each label ``detect`` returns (`match_labels`);
            default: the same labels.
        threshold, class_names: as `coco_evaluate` (false positives on images without
            objects; AP per class).

    Returns:
        What `coco_evaluate` returns.
    """
    checks.positive_int("batch_size", batch_size)
    total = limit
    if hasattr(records, "as_numpy_iterator"):
        records = records.take(limit) if limit is not None else records
        total = int(records.cardinality()) if int(records.cardinality()) >= 0 else None
        records = records.as_numpy_iterator()
    elif limit is not None:
        records = (r for i, r in zip(range(limit), records))
    progress = sys.stderr.isatty() if progress is None else progress
    bar = keras.utils.Progbar(total, unit_name="image") if progress else None
    ground_truth, detections = [], []
    for batch in _same_size_batches(records, batch_size):
        images = np.stack([np.asarray(r["image"], np.uint8) for r in batch])
        out = {k: keras.ops.convert_to_numpy(v) for k, v in detect(images).items()}
        if label_map is not None:
            out["labels"] = np.asarray(label_map)[out["labels"]]
        for i, record in enumerate(batch):
            image_id = int(record["image_id"])
            ground_truth.append({"image_id": image_id, "height": images.shape[1],
                                 "width": images.shape[2], "boxes": record["boxes"],
                                 "labels": record["labels"],
                                 **{k: record[k] for k in ("crowd_boxes", "crowd_labels")
                                    if k in record}})
            detections.append({"image_id": image_id, "boxes": out["boxes"][i],
                               "scores": out["scores"][i], "labels": out["labels"][i]})
        if bar is not None:
            with contextlib.redirect_stdout(sys.stderr):
                bar.add(len(batch))
    return coco_evaluate(ground_truth, detections, num_classes, threshold, class_names)
