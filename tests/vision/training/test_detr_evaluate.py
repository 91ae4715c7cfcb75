"""COCO AP through pycocotools, the object-limit error, DETR's learning-rate drop, pictures."""

import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfx_transformer.schedules import StepDropSchedule
from tfx_transformer.training.callbacks import RunClock, ScheduleProgress
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.workdir import read_metrics
from vision.config import preset
from vision.data.batching import ObjectLimit, TooManyObjectsError, make_batches
from vision.data.sources import DetectionSource
from vision.export.saved_model import preprocess_images
from vision.modeling.detr import build_model
from vision.modeling.optimizer import DetrAdamW
from vision.plots import cross_attention, draw_detections, plot_query_attention
from vision.training.evaluate import coco_evaluate, evaluate_records
from vision.training.train import train_detr

# COCO's AP is the mean, over IoU thresholds 0.50:0.05:0.95 and over the categories with
# ground truth, of the precision interpolated (made non-increasing) at the 101 recall points
# 0, 0.01, ..., 1, and 0 beyond the highest recall reached. Finding k of n objects, all
# ranked first, reaches recall points 0 .. k/n: (100 k/n + 1) of the 101 have precision 1.
HALF_FOUND = 51 / 101


def _gt(image_id, boxes, labels, size=(100, 200)):
    return {"image_id": image_id, "height": size[0], "width": size[1],
            "boxes": np.array(boxes, "float32").reshape(-1, 4), "labels": np.array(labels)}


def _det(image_id, boxes, scores, labels):
    return {"image_id": image_id, "boxes": np.array(boxes, "float32").reshape(-1, 4),
            "scores": np.array(scores, "float32"), "labels": np.array(labels)}


FOUR = [[10, 10, 30, 30], [50, 10, 80, 40], [100, 50, 150, 90], [160, 20, 190, 60]]


def test_perfect_detections_give_ap_one_even_with_low_scored_extra_queries():
    ground_truth = [_gt(1, FOUR, [0, 1, 1, 2]), _gt(2, FOUR[:2], [2, 0]), _gt(3, [], [])]
    detections = [
        _det(g["image_id"], np.concatenate([g["boxes"], [[0, 0, 5, 5]] * 3]),
             [0.9] * len(g["labels"]) + [0.05, 0.04, 0.03], [*g["labels"], 0, 1, 2])
        for g in ground_truth
    ]
    # Image 3 has no objects: its three detections score below the 0.5 threshold.
    assert coco_evaluate(ground_truth, detections, num_classes=3) == {
        "AP": 1.0, "AP50": 1.0, "AP75": 1.0, "n": 3, "empty_images": 1,
        "false_positives_per_empty_image": 0.0}


def test_known_values_from_the_101_point_definition():
    gt = [_gt(1, FOUR, [0] * 4)]
    half = coco_evaluate(gt, [_det(1, FOUR[:2], [0.9, 0.8], [0, 0])])
    for key in ("AP", "AP50", "AP75"):
        assert half[key] == pytest.approx(HALF_FOUND, abs=1e-6)
    # A false positive ranked above the two hits: precision 1/2 then 2/3, interpolated to 2/3.
    ranked = coco_evaluate(gt, [_det(1, [[0, 80, 9, 99]] + FOUR[:2], [0.95, 0.9, 0.8], [0] * 3)])
    assert ranked["AP"] == pytest.approx(HALF_FOUND * 2 / 3, abs=1e-6)
    # IoU 0.62: a hit at thresholds 0.50, 0.55, 0.60 only.
    loose = coco_evaluate([_gt(1, [[0, 0, 100, 100]], [0])],
                          [_det(1, [[0, 0, 100, 62]], [0.9], [0])])
    assert (loose["AP50"], loose["AP75"]) == (1.0, 0.0)
    assert loose["AP"] == pytest.approx(0.3, abs=1e-6)
    # Categories are averaged: class 0 all found, class 1 half found.
    two = coco_evaluate([_gt(1, FOUR, [0, 0, 1, 1]), _gt(2, FOUR[:2], [1, 1])],
                        [_det(1, FOUR, [0.9] * 4, [0, 0, 1, 1])])
    assert two["AP"] == pytest.approx((1 + HALF_FOUND) / 2, abs=1e-6) and two["n"] == 2
    per_class = coco_evaluate([_gt(1, FOUR, [0, 0, 1, 1]), _gt(2, FOUR[:2], [1, 1])],
                              [_det(1, FOUR, [0.9] * 4, [0, 0, 1, 1])], num_classes=3,
                              class_names=["a", "b", "c"])["per_class"]
    assert per_class == {"a": 1.0, "b": pytest.approx(HALF_FOUND, abs=1e-6), "c": None}
    # Nothing detected: 0; nothing to detect: None (COCO's -1).
    assert coco_evaluate(gt, [])["AP"] == 0.0
    assert coco_evaluate([_gt(1, [], [])], [], num_classes=2)["AP"] is None
    with pytest.raises(ValueError, match="image_id=\\[9\\]"):
        coco_evaluate(gt, [_det(9, FOUR[:1], [0.9], [0])])


def test_false_positives_are_counted_on_images_without_objects_only():
    ground_truth = [_gt(1, FOUR[:1], [0]), _gt(2, [], []), _gt(3, [], []),
                    {**_gt(4, [], []), "crowd_boxes": np.array([FOUR[1]], "float32"),
                     "crowd_labels": np.array([0])}]  # a crowd region: not empty
    three = [[0.9, 0.6, 0.4], [0.55, 0.2, 0.1], [0.9, 0.9, 0.9]]
    detections = [_det(i, FOUR[1:], scores, [0, 1, 0]) for i, scores in zip((1, 2, 4), three)]
    scores = coco_evaluate(ground_truth, detections, num_classes=2)
    # Empty: images 2 (one detection above 0.5) and 3 (none detected).
    assert (scores["empty_images"], scores["false_positives_per_empty_image"]) == (2, 0.5)
    strict = coco_evaluate(ground_truth, detections, num_classes=2, threshold=0.15)
    assert strict["false_positives_per_empty_image"] == 1.0  # 0.55 and 0.2 on image 2
    assert coco_evaluate(ground_truth[:1], detections[:1])["false_positives_per_empty_image"] \
        is None


def _pycocotools_stats(ground_truth, results):
    """AP, AP50, AP75 of COCO-format ``results`` (written here, not by `to_coco`)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = ground_truth
        gt.createIndex()
        evaluator = COCOeval(gt, gt.loadRes(results), iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return [round(float(v), 6) for v in evaluator.stats[:3]]


def test_each_image_keeps_its_100_best_detections_over_all_classes():
    # 300 queries an image over 3 classes: pycocotools alone keeps 100 per image *and class*.
    rng = np.random.default_rng(0)
    ground_truth, detections = [], []
    coco = {"images": [], "annotations": [], "categories": [{"id": c} for c in range(3)]}
    for image_id in (1, 2):
        boxes = rng.uniform(0, 60, (12, 2))
        boxes = np.concatenate([boxes, boxes + rng.uniform(10, 40, (12, 2))], axis=1)
        labels = rng.integers(0, 3, 12)
        ground_truth.append(_gt(image_id, boxes, labels))
        coco["images"].append({"id": image_id, "height": 100, "width": 200})
        coco["annotations"] += [{"image_id": image_id, "category_id": int(c),
                                 "bbox": [*b[:2], *(b[2:] - b[:2])],
                                 "area": float(np.prod(b[2:] - b[:2])), "iscrowd": 0}
                                for b, c in zip(boxes, labels)]
        found = np.repeat(boxes, 25, axis=0) + rng.normal(0, 2, (300, 4))  # near the objects
        detections.append(_det(image_id, found, rng.uniform(0, 1, 300),
                               np.repeat(labels, 25)))
    for number, annotation in enumerate(coco["annotations"], start=1):
        annotation["id"] = number  # pycocotools takes id 0 for "unmatched"
    results = [[{"image_id": d["image_id"], "category_id": int(d["labels"][i]),
                 "bbox": [*map(float, d["boxes"][i, :2]),
                          *map(float, d["boxes"][i, 2:] - d["boxes"][i, :2])],
                 "score": float(d["scores"][i])} for i in order]
               for d in detections
               for order in [np.argsort(-d["scores"])]]
    top = _pycocotools_stats(coco, [r for image in results for r in image[:100]])
    every = _pycocotools_stats(coco, [r for image in results for r in image])
    assert top != every  # the cut matters for these detections
    scores = coco_evaluate(ground_truth, detections, num_classes=3)
    assert [scores["AP"], scores["AP50"], scores["AP75"]] == pytest.approx(top, abs=1e-6)
    assert [coco_evaluate(ground_truth, detections, num_classes=3, max_detections=None)[k]
            for k in ("AP", "AP50", "AP75")] == pytest.approx(every, abs=1e-6)


def test_evaluate_records_groups_same_size_images():
    sizes = [(20, 30), (20, 30), (40, 10), (20, 30)]
    records = [{"image": np.full((h, w, 3), i % 2, np.uint8), "image_id": i,
                "boxes": np.array([[1, 2, 8, 9]], "float32"), "labels": np.array([i % 2])}
               for i, (h, w) in enumerate(sizes)]
    calls = []

    def oracle(images):  # the true box and label (written in the pixels), and a wrong box
        calls.append(images.shape)
        labels = images[:, 0, 0, 0].astype("int32")
        return {"boxes": np.tile([[[1, 2, 8, 9], [0, 0, 3, 3]]], (len(images), 1, 1)),
                "scores": np.tile([[0.9, 0.1]], (len(images), 1)),
                "labels": np.stack([labels, 1 - labels], axis=1)}

    scores = evaluate_records(oracle, records, batch_size=2, progress=False)
    assert calls == [(2, 20, 30, 3), (1, 40, 10, 3), (1, 20, 30, 3)]
    assert scores == {"AP": 1.0, "AP50": 1.0, "AP75": 1.0, "n": 4, "empty_images": 0,
                      "false_positives_per_empty_image": None}
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(records[:2]), output_signature={
            "image": tf.TensorSpec([None, None, 3], tf.uint8),
            "image_id": tf.TensorSpec([], tf.int64), "boxes": tf.TensorSpec([None, 4]),
            "labels": tf.TensorSpec([None], tf.int64)})
    assert evaluate_records(oracle, dataset, limit=1, progress=False)["n"] == 1


def _record(image_id, num_objects, size=16):
    return {"image": np.zeros((size, size, 3), np.uint8), "image_id": image_id,
            "boxes": np.array([[0, 0, 4, 4]] * num_objects, "float32").reshape(-1, 4),
            "labels": np.zeros(num_objects, "int32")}


def _records(*records):
    return tf.data.Dataset.from_generator(lambda: iter(records), output_signature={
        "image": tf.TensorSpec([None, None, 3], tf.uint8), "image_id": tf.TensorSpec([], tf.int64),
        "boxes": tf.TensorSpec([None, 4]), "labels": tf.TensorSpec([None], tf.int32)})


def _assert_fields(error, image_id, num_objects, max_objects):
    assert isinstance(error, ValueError)  # scripts report it as one `error:` line
    assert (error.image_id, error.num_objects, error.max_objects) == (
        image_id, num_objects, max_objects)
    for value in (image_id, num_objects, max_objects):
        assert str(value) in str(error)
    assert "num_queries" in str(error)


def test_too_many_objects_are_recorded_left_out_and_raised_with_their_fields():
    limit = ObjectLimit(2)
    batches = make_batches(_records(_record(5, 1), _record(7, 3), _record(9, 2)), batch_size=4,
                           object_limit=limit, image_size=16)
    (inputs, targets), = list(batches)  # one batch: images 5 and 9, not 7
    assert inputs["images"].shape[0] == 2
    np.testing.assert_array_equal(np.asarray(targets["valid"]).sum(axis=1), [1, 2])
    with pytest.raises(TooManyObjectsError) as error_info:
        limit.check()
    _assert_fields(error_info.value, 7, 3, 2)


TINY_RUN = dict(hidden_dim=16, num_heads=2, ffn_dim=32, num_queries=2, tiny_filters=(8, 16),
                num_encoder_layers=1, num_decoder_layers=1, batch_size=2, image_size=32,
                max_image_size=32)


def test_train_detr_stops_on_too_many_objects_before_training(tmp_path, dots_coco):
    # Sources that know their counts fail before training.
    data = dots_coco(tmp_path, [3, 1])
    with pytest.raises(TooManyObjectsError) as error_info:
        train_detr(data, tmp_path / "run", preset("tiny-detr", **TINY_RUN),
                   RunOptions(valid_fraction=0.0), log=lambda *a: None)
    _assert_fields(error_info.value, 1, 3, 2)
    assert "history" not in read_metrics(tmp_path / "run")


@pytest.mark.slow  # one DETR train step is traced (~15 s)
def test_train_detr_stops_on_too_many_objects_found_while_training(tmp_path, monkeypatch,
                                                                  dots_coco):
    # Counts unknown up front (as for tfds:): the pipeline finds the image, fit stops.
    monkeypatch.setattr(DetectionSource, "check_max_objects", lambda *args: None)
    data = dots_coco(tmp_path, [3, 1])
    with pytest.raises(TooManyObjectsError) as error_info:
        train_detr(data, tmp_path / "run", preset("tiny-detr", **TINY_RUN),
                   RunOptions(valid_fraction=0.0, max_steps=3), log=lambda *a: None)
    _assert_fields(error_info.value, 1, 3, 2)
    metrics = read_metrics(tmp_path / "run")
    assert "train" not in metrics  # raised inside fit, by the callback
    assert not (tmp_path / "run" / "export").exists()


class _Holder:
    """Stands for the model: the callback only needs its optimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


def _lr(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def test_step_drop_by_epoch_is_detr_steplr():
    schedule = StepDropSchedule(2e-4, drop_epoch=3)
    optimizer = DetrAdamW(learning_rate=schedule)
    progress = ScheduleProgress(schedule)  # what the trainer puts first in every fit
    progress.set_model(_Holder(optimizer))
    progress.on_train_begin()
    rates = []
    for epoch in range(5):
        progress.on_epoch_begin(epoch)
        logs = {}
        progress.on_epoch_end(epoch, logs)
        rates.append(_lr(optimizer))
        assert logs["learning_rate"] == pytest.approx(rates[-1])
    assert rates == pytest.approx([2e-4] * 3 + [2e-5] * 2)


def test_step_drop_at_a_share_of_the_steps_or_of_the_run_time():
    schedule = StepDropSchedule(1e-3, drop_epoch=100, drop_fraction=0.8, total_steps=10)
    # Keras calls the schedule with the optimizer's iterations: step s is the (s+1)-th update,
    # so a resumed run (iterations restored) is dropped from step 7 on, as a fresh one.
    rates = [float(keras.ops.convert_to_numpy(schedule(step))) for step in range(10)]
    assert rates == pytest.approx([1e-3] * 7 + [1e-4] * 3)

    now = [0.0]
    timed = StepDropSchedule(1e-3, drop_epoch=100, drop_fraction=0.5)
    optimizer = DetrAdamW(learning_rate=timed)
    # 30 s spent by an earlier process of the run: the drop comes 30 s into this one.
    clock = RunClock(offset_seconds=30.0, clock=lambda: now[0])  # the run's, driven by fit
    progress = ScheduleProgress(timed, minutes=2.0, clock=clock)
    for callback in (clock, progress):
        callback.set_model(_Holder(optimizer))
        callback.on_train_begin()
    progress.on_epoch_begin(0)
    for seconds, expected in ((0, 1e-3), (29.9, 1e-3), (30.0, 1e-4), (90.0, 1e-4)):
        now[0] = seconds
        progress.on_train_batch_begin(0)
        assert _lr(optimizer) == pytest.approx(expected), seconds
    again = StepDropSchedule.from_config(timed.get_config())
    assert again.get_config() == timed.get_config()
    for kwargs in ({"drop_fraction": 1.5}, {"drop_fraction": 0.0}, {"drop_epoch": -1},
                   {"learning_rate": 0.0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            StepDropSchedule(**{"learning_rate": 1e-3, "drop_epoch": 10, **kwargs})


SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32),
             num_encoder_layers=1, num_decoder_layers=2)


def test_cross_attention_pass_equals_the_model_and_pictures_are_written(tmp_path):
    model = build_model(preset("tiny", **SMALL), 3)
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    inputs, _ = preprocess_images(image[None], 40, 60)
    outputs, weights, (rows, cols) = cross_attention(model, inputs)
    want = model(inputs)
    for key in ("pred_logits", "pred_boxes"):
        np.testing.assert_allclose(np.asarray(outputs[key]), np.asarray(want[key]), atol=1e-5)
    assert weights.shape == (2, 1, 4, 6, rows * cols) and (rows, cols) == (3, 4)  # 40x53 / 16
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    path = plot_query_attention(model, image, tmp_path / "attention.png", 40, 60,
                                class_names=["a", "b", "c"])
    assert Image.open(path).size[0] > Image.open(path).size[1]  # two panels side by side
    path = draw_detections(image, [[1, 2, 30, 40], [5, 5, 9, 9]], [0.9, 0.2], [0, 2],
                           ["a", "b", "c"], tmp_path / "boxes.png", threshold=0.5, title="x")
    assert Image.open(path).format == "PNG"
