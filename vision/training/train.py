"""Training a detector end to end: data, DETR + set loss + AdamW, fit, export, COCO AP.

`train_detr` builds what is particular to detection (the source's batches with their object
limit, the model, the set criterion, DETR's learning-rate drop) and leaves the rest to
`tfx_transformer.training.trainer.Trainer`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterable

import keras
import tensorflow as tf

from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import Trainer
from vision.config import DetrConfig
from vision.data.batching import ObjectLimit, make_batches
from vision.data.sources import load_source
from vision.modeling.detr import build_criterion, build_model
from vision.training.evaluate import evaluate_records
from vision.training.export import export_detector, make_detect_fn
from vision.training.optimizer import build_optimizer

__all__ = ["LearningRateDrop", "train_detr"]


class LearningRateDrop(keras.callbacks.Callback):
    """DETR's step decay for `fit`, also for runs bounded by steps or time.

    The learning rate is ``learning_rate`` until epoch ``drop_epoch`` (DETR's ``lr_drop``),
    then 0.1 times it. A run bounded by ``max_steps`` or a ``time_budget`` (minutes) drops it
    as well once ``drop_fraction`` of that bound is spent (steps taken, or wall-clock time
    since training began), whichever comes first: such runs stop long before ``drop_epoch``.
    `vision.training.optimizer.DetrAdamW` scales the backbone's rate with it. Steps count from the
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


def train_detr(data: str, workdir: str | os.PathLike, config: DetrConfig, run: RunOptions,
               callbacks: Iterable[keras.callbacks.Callback] = (),
               log: Callable[..., None] = print) -> dict:
    """Trains DETR on ``data``, writes the work directory, returns validation COCO AP.

    Work directory: ``checkpoints/``, ``backup/`` (while running, so a killed run resumes),
    ``logs/``, ``export/`` (the ``Detector`` SavedModel + ``classes.json``) and
    ``metrics.json`` (``valid``: AP, AP50, AP75, n; ``history``; ``train``; ``data``;
    ``config``; ``train_seconds``).

    Args:
        data: ``embedded``, ``coco:IMAGES_DIR:ANNOTATIONS.json`` or ``tfds:NAME``.
        workdir: work directory (created; nothing in it is deleted).
        config: the model, loss, optimizer and data settings (`vision.config.preset`);
            ``batch_size`` is per replica, the global batch is it times the replicas.
        run: strategy, precision, epochs (default ``config.epochs``, or unlimited with
            ``max_steps``/``time_budget``), seed (weights, shuffling, augmentation,
            ``embedded`` data), held-out share of a ``coco:`` source, ``eval_limit``
            (validate and evaluate on at most this many images; None: all) and
            ``jit_compile`` (only with ``config.matcher_solver="ops"``).
        callbacks: extra Keras callbacks for ``fit``.
        log: where progress lines go.

    Returns:
        ``metrics.json``'s ``valid`` entry: AP, AP50, AP75 (pycocotools) and n images
        (empty when there is no validation split, and on non-chief workers).

    A finished run rerun with nothing more to do returns its recorded scores and changes
    nothing (`tfx_transformer.training.trainer.Trainer`).

    Raises:
        ValueError: bad data or options (no training images among them), a broken file in
            the work directory, or a NaN loss
            (`tfx_transformer.training.callbacks.NonFiniteLossError`).
        vision.data.batching.TooManyObjectsError: an image with more objects than
            ``config.num_queries`` (DETR needs a query per object); a `ValueError`.
    """
    if run.jit_compile and config.matcher_solver == "scipy":
        raise ValueError("`jit_compile=True` needs `matcher_solver='ops'`: the scipy matcher "
                         "is a host callback. Received: matcher_solver='scipy'")
    trainer = Trainer(workdir, run, log)
    trainer.check_data(data)
    done = trainer.finished(config.epochs)
    if done is not None:
        return done
    source = load_source(data, valid_fraction=run.valid_fraction, seed=run.seed)
    num_train, num_valid = source.num_examples("train"), source.num_examples("valid")
    if num_train == 0:
        held_out = f" ({num_valid} held out by valid_fraction={run.valid_fraction})" if (
            num_valid) else ""
        raise ValueError(f"--data {data}: no training images{held_out}; nothing to train on")
    limit = ObjectLimit(config.num_queries)  # DETR needs a query per object
    global_batch = config.batch_size * trainer.replicas
    # Several replicas: each replica gets as many images in every batch (Keras builds the
    # model from the first batch split over the replicas, which must give one shape, and a
    # replica without images cannot run): whole training batches (DETR drops the last one
    # too), and validation images to a multiple of the replicas.
    whole = trainer.replicas > 1
    train_steps = (num_train // global_batch if whole else math.ceil(num_train / global_batch)
                   ) if num_train else None
    if train_steps == 0:
        raise ValueError(f"--data {data}: {num_train} training images, fewer than the global "
                         f"batch of {global_batch} ({config.batch_size} per replica times "
                         f"{trainer.replicas} replicas)")
    sizes = dict(image_size=config.image_size, max_size=config.max_image_size)
    train_ds = source.batches("train", batch_size=global_batch, object_limit=limit,
                              seed=run.seed, augmentation=config.augmentation,
                              drop_remainder=whole, **sizes)
    if num_valid is not None and run.eval_limit is not None:
        num_valid = min(num_valid, run.eval_limit)
    source.check_max_objects("valid", config.num_queries)
    valid_records = source.records("valid")
    if run.eval_limit is not None:
        valid_records = valid_records.take(run.eval_limit)
    fit_valid = num_valid  # the validation images of fit
    if whole and num_valid is not None:
        fit_valid = num_valid - num_valid % trainer.replicas
        valid_records = valid_records.take(fit_valid)
    valid_ds = None if fit_valid == 0 else make_batches(
        valid_records, batch_size=global_batch, object_limit=limit,
        drop_remainder=whole and fit_valid is None, **sizes)
    if valid_ds is not None and fit_valid is not None:  # Keras then needs no "ran out of data"
        valid_ds = valid_ds.apply(tf.data.experimental.assert_cardinality(
            math.ceil(fit_valid / global_batch)))
    log(f"data: {data}, {source.num_classes} classes, {num_train} training images, "
        f"{num_valid} validation images")
    if fit_valid != num_valid:
        log(f"validation during fit: {fit_valid} of the {num_valid} images (a multiple of the "
            f"{trainer.replicas} replicas); the evaluation scores all of them")

    if trainer.replicas > 1:
        train_ds, valid_ds = _float_masks(train_ds), _float_masks(valid_ds)
    with trainer.strategy.scope():
        model = build_model(config, source.num_classes)
        model.configure_replicas(trainer.replicas,
                                 _all_reduce_sum if trainer.replicas > 1 else None)
        model.compile(optimizer=build_optimizer(config, model),
                      criterion=build_criterion(config, source.num_classes),
                      jit_compile=run.jit_compile)
    log(f"model: {config.name}, {model.count_params():,} parameters, "
        f"{trainer.replicas} replica(s), batch {global_batch}")
    schedule = LearningRateDrop(config.learning_rate, config.lr_drop_epochs,
                                config.lr_drop_fraction, run.max_steps, run.time_budget)

    def export(path) -> None:
        export_detector(model, path, source.class_names, config.image_size,
                        config.max_image_size, category_ids=source.category_ids)

    def evaluate() -> dict:
        scores: dict = {}
        if num_valid != 0:
            detect = make_detect_fn(model, config.image_size, config.max_image_size)
            scores = evaluate_records(detect, source.records("valid"), batch_size=global_batch,
                                      limit=run.eval_limit, num_classes=source.num_classes)
        return {
            "valid": scores,
            "data": {"spec": data, "class_names": list(source.class_names),
                     "train_images": num_train, "valid_images": scores.get("n", num_valid)},
            "config": {"preset": config.name, **dataclasses.asdict(config)},
        }

    return trainer.train(
        model, train_ds, valid_ds, default_epochs=config.epochs,
        steps_per_epoch=train_steps,
        export=export, evaluate=evaluate,
        # The schedule first: it puts `learning_rate` into the logs the other callbacks record.
        first_callbacks=[schedule, limit.callback()], callbacks=callbacks,
        checks=[limit.check],
    )
