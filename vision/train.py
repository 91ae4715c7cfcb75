"""Training a detector end to end: data, DETR + set loss + AdamW, fit, export, COCO AP."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping

import keras
import tensorflow as tf

from tfx_transformer import training
from vision.config import preset
from vision.data import load_source, make_batches
from vision.evaluate import evaluate_records
from vision.export import export_detector, make_detect_fn
from vision.model import build_criterion, build_model
from vision.optimizer import build_optimizer

__all__ = ["LONG_RUN_EPOCHS", "LearningRateDrop", "object_limit_errors", "train_detr"]

LONG_RUN_EPOCHS = 100_000  # with a time budget or step limit, those decide when to stop


@contextlib.contextmanager
def object_limit_errors(max_objects: int):
    """Turns the pipeline's too-many-objects `tf.errors.InvalidArgumentError` into ValueError.

    Sources whose object counts are unknown up front (``tfds:``) check each image in the
    ``tf.data`` pipeline (`vision.batching.make_batches`); this names the image clearly.
    """
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        text = str(error.message)
        if "more than max_objects" not in text:
            raise
        found = re.search(r"Image id\]?\s*\[?(-?\d+)\]?\s*\[?has\]?\s*\[?(\d+)", text)
        image = f"Image id {found.group(1)} has {found.group(2)} objects" if found else (
            "An image has too many objects")
        raise ValueError(
            f"{image}, more than max_objects={max_objects} (the number of queries). Use more "
            "queries (`num_queries`) or remove such images from the data."
        ) from None


class LearningRateDrop(keras.callbacks.Callback):
    """DETR's step decay for `fit`, also for runs bounded by steps or time.

    The learning rate is ``learning_rate`` until epoch ``drop_epoch`` (DETR's ``lr_drop``),
    then 0.1 times it. A run bounded by ``max_steps`` or a ``time_budget`` (minutes) drops it
    as well once ``drop_fraction`` of that bound is spent (steps taken, or wall-clock time
    since training began), whichever comes first: such runs stop long before ``drop_epoch``.
    `vision.optimizer.DetrAdamW` scales the backbone's rate with it. Steps count from the
    optimizer's iterations (read at each epoch's start, after `BackupAndRestore` restored
    them), so a resumed run keeps its place; the time of a resumed run counts from its own
    start, as its ``--time-budget`` does. Wall-clock drops are per process: with several
    workers, bound the run by steps.

    Args:
        learning_rate: the initial rate.
        drop_epoch: 0-based epoch from which the rate is dropped.
        drop_fraction: share of ``max_steps``/``time_budget`` after which the rate is
            dropped; None: by epoch only.
        max_steps, time_budget: the bounds of the run (None: not bounded that way).
        clock: seconds as a float; injectable for tests.
    """

    def __init__(self, learning_rate: float, drop_epoch: int, drop_fraction: float | None = None,
                 max_steps: int | None = None, time_budget: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        if drop_fraction is not None and not 0 < drop_fraction <= 1:
            raise ValueError(f"`drop_fraction` must be in (0, 1]. Received: {drop_fraction!r}")
        self.learning_rate, self.drop_epoch = float(learning_rate), int(drop_epoch)
        self.drop_fraction, self.max_steps, self.time_budget = drop_fraction, max_steps, time_budget
        self.clock, self.start, self.dropped = clock, None, False
        self._epoch_start_step = 0

    def _set(self, dropped: bool) -> None:
        self.dropped = dropped
        self.model.optimizer.learning_rate = self.learning_rate * (0.1 if dropped else 1.0)

    def _past_fraction(self, steps: int) -> bool:
        if self.drop_fraction is None:
            return False
        if self.max_steps is not None and steps >= self.drop_fraction * self.max_steps:
            return True
        if self.time_budget is not None:
            return self.clock() - self.start >= self.drop_fraction * 60.0 * self.time_budget
        return False

    def on_train_begin(self, logs=None):
        self.start, self.dropped = self.clock(), False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        past = self._past_fraction(self._epoch_start_step)
        self._set(self.dropped or epoch >= self.drop_epoch or past)

    def on_train_batch_begin(self, batch, logs=None):
        # `batch` counts the epoch's steps, so no device read per step.
        if not self.dropped and self._past_fraction(self._epoch_start_step + batch):
            self._set(True)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = self.learning_rate * (0.1 if self.dropped else 1.0)


def _float_masks(ds):
    """Boolean ``mask``/``valid`` as float32 0/1 (the model and loss cast them back).

    Keras builds a distributed model from the replicas' first batch averaged with
    ``strategy.reduce("MEAN")``, which cannot sum booleans.
    """
    def cast(inputs, targets):
        return ({**inputs, "mask": tf.cast(inputs["mask"], tf.float32)},
                {**targets, "valid": tf.cast(targets["valid"], tf.float32)})

    return None if ds is None else ds.map(cast)


def _all_reduce_sum(value):
    context = tf.distribute.get_replica_context()
    return value if context is None else context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def train_detr(data_spec: str, workdir: str, preset_name: str = "tiny",
               epochs: int | None = None, max_steps: int | None = None,
               time_budget: float | None = None, batch_size: int | None = None,
               strategy: str = "auto", mixed_precision: str = "none", seed: int = 0,
               valid_fraction: float = 0.05, eval_limit: int | None = None,
               config_overrides: Mapping | None = None, callbacks=(),
               log: Callable[..., None] = print) -> dict:
    """Trains DETR on ``data_spec``, writes the work directory, returns validation COCO AP.

    Work directory: ``checkpoints/``, ``backup/`` (while running, so a killed run resumes),
    ``logs/``, ``export/`` (the ``Detector`` SavedModel + ``classes.json``) and
    ``metrics.json`` (``valid``: AP, AP50, AP75, n; ``history``; ``train``; ``data``;
    ``config``).

    Args:
        data_spec: ``embedded``, ``coco:IMAGES_DIR:ANNOTATIONS.json`` or ``tfds:NAME``.
        workdir: work directory (created; nothing in it is deleted).
        preset_name: ``tiny``, ``tiny-detr`` or ``r50`` (`vision.config.PRESETS`).
        epochs: epochs (default: the preset's, or unlimited with ``max_steps``/``time_budget``).
        max_steps: stop after this many steps in total.
        time_budget: stop training after this many minutes, then export and evaluate.
        batch_size: images per replica (default: the preset's); the global batch is this
            times the number of replicas.
        strategy: ``auto``, ``mirrored`` or ``multi_worker``.
        mixed_precision: ``none``, ``bfloat16`` or ``float16``.
        seed: random seed (weights, shuffling, augmentation, ``embedded`` data).
        valid_fraction: held-out share of a ``coco:`` source.
        eval_limit: validate and evaluate on at most this many images (None: all).
        config_overrides: `vision.config.DetrConfig` fields to change (e.g. ``num_queries``).
        callbacks: extra Keras callbacks for ``fit``.
        log: where progress lines go.

    Returns:
        ``metrics.json``'s ``valid`` entry: AP, AP50, AP75 (pycocotools) and n images
        (empty when there is no validation split, and on non-chief workers).

    Raises:
        ValueError: bad arguments or data, including an image with more objects than the
            number of queries.
    """
    started = time.monotonic()
    strategy_obj = training.get_strategy(strategy)  # before any other TensorFlow work
    training.set_mixed_precision(mixed_precision)
    keras.utils.set_random_seed(seed)
    overrides = dict(config_overrides or {})
    if batch_size is not None:
        overrides["batch_size"] = batch_size
    config = preset(preset_name, **overrides)
    if isinstance(config.batch_size, bool) or not isinstance(config.batch_size, int) or (
            config.batch_size < 1):
        raise ValueError(f"`batch_size` must be a positive integer. Received: {config.batch_size}")
    if eval_limit is not None and (not isinstance(eval_limit, int) or eval_limit < 1):
        raise ValueError(f"`eval_limit` must be None or a positive integer. Received: {eval_limit}")
    wd = training.Workdir(workdir)

    source = load_source(data_spec, valid_fraction=valid_fraction, seed=seed)
    max_objects = config.num_queries  # DETR needs a query per object
    replicas = strategy_obj.num_replicas_in_sync
    global_batch = config.batch_size * replicas
    sizes = dict(image_size=config.image_size, max_size=config.max_image_size)
    train_ds = source.batches("train", batch_size=global_batch, max_objects=max_objects,
                              seed=seed, augmentation=config.augmentation, **sizes)
    num_train, num_valid = source.num_examples("train"), source.num_examples("valid")
    if num_valid is not None and eval_limit is not None:
        num_valid = min(num_valid, eval_limit)
    source.check_max_objects("valid", max_objects)
    valid_records = source.records("valid")
    if eval_limit is not None:
        valid_records = valid_records.take(eval_limit)
    valid_ds = None if num_valid == 0 else make_batches(
        valid_records, batch_size=global_batch, max_objects=max_objects, **sizes)
    log(f"data: {data_spec}, {source.num_classes} classes, {num_train} training images, "
        f"{num_valid} validation images")

    if replicas > 1:
        train_ds, valid_ds = _float_masks(train_ds), _float_masks(valid_ds)
    with strategy_obj.scope():
        model = build_model(config, source.num_classes)
        model.configure_replicas(replicas, _all_reduce_sum if replicas > 1 else None)
        model.compile(optimizer=build_optimizer(config, model),
                      criterion=build_criterion(config, source.num_classes),
                      jit_compile=False)  # the scipy matcher is a host callback (DESIGN 4)
    log(f"model: {preset_name}, {model.count_params():,} parameters, {replicas} replica(s), "
        f"batch {global_batch}")
    if epochs is None:
        epochs = LONG_RUN_EPOCHS if (max_steps or time_budget) else config.epochs
    steps_per_epoch = math.ceil(num_train / global_batch) if num_train else None
    epochs = training.plan_epochs(epochs, max_steps, steps_per_epoch)
    schedule = LearningRateDrop(config.learning_rate, config.lr_drop_epochs,
                                config.lr_drop_fraction, max_steps, time_budget)
    # The schedule first: it puts `learning_rate` into the logs the other callbacks record.
    callbacks = [schedule, *training.standard_callbacks(wd, time_budget, max_steps), *callbacks]
    with object_limit_errors(max_objects):
        model.fit(train_ds, validation_data=valid_ds, epochs=epochs, callbacks=callbacks)
    train_seconds = time.monotonic() - started

    if not training.is_chief():  # only the chief exports, evaluates and writes
        return {}
    export_detector(model, wd.export, source.class_names, config.image_size,
                    config.max_image_size, category_ids=source.category_ids)
    log(f"export: {wd.export}")
    scores: dict = {}
    if num_valid != 0:
        detect = make_detect_fn(model, config.image_size, config.max_image_size)
        scores = evaluate_records(detect, source.records("valid"), batch_size=global_batch,
                                  limit=eval_limit, num_classes=source.num_classes)
    training.write_metrics(wd, {
        "valid": scores,
        "data": {"spec": data_spec, "class_names": list(source.class_names),
                 "train_images": num_train, "valid_images": scores.get("n", num_valid)},
        "config": {"preset": preset_name, **dataclasses.asdict(config)},
        "train_seconds": round(train_seconds, 1),
    })
    return scores
