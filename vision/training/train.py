"""Training a detector end to end: data, DETR or RT-DETR + set loss + AdamW, fit, export,
COCO AP.

`DetectionTask` is what is particular to detection (the source's batches with their object
limit, the model with its set criterion and AdamW on DETR's learning-rate drop, the export and
COCO AP); `train_detr` hands it to `tfx_transformer.training.trainer.Trainer`, which runs the
rest. The config's ``architecture`` picks the detector: DETR, or RT-DETR (its architecture
from the config's ``rtdetr`` fields or from an ``--init-from`` RT-DETR folder, its images
stretched to a fixed size as RT-DETR's image processor does, its loss `rtdetr_criterion`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable

import keras
import tensorflow as tf

from tfx_transformer.schedules import StepDropSchedule
from tfx_transformer.training.distribute import is_chief
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import RunContext, Task, TaskData, Trainer
from vision.config import PRESETS, DetrConfig
from vision.data.augment import DetrSizes, FixedSize
from vision.data.batching import ObjectLimit, make_batches
from vision.data.image_check import CACHE_FILE
from vision.data.sources import load_source
from vision.export.saved_model import export_detector, make_detect_fn
from vision.modeling.detr import build_criterion, build_model
from vision.modeling.optimizer import build_optimizer
from vision.modeling.rtdetr import rtdetr_criterion
from vision.pretrained.init_from import check_init_source, init_from, rtdetr_folder_config
from vision.training.evaluate import evaluate_records

__all__ = ["DetectionTask", "train_detr"]


def _float_masks(ds):
    """Boolean ``mask``/``valid`` as float32 0/1 (the model and loss cast them back).

    Keras builds a distributed model from the replicas' first batch averaged with
    ``strategy.reduce("MEAN")``, which cannot sum booleans.
    """
    def cast(inputs, targets):
        return ({**inputs, "mask": tf.cast(inputs["mask"], tf.float32)},
                {**targets, "valid": tf.cast(targets["valid"], tf.float32)})

    return None if ds is None else ds.map(cast)


class DetectionTask(Task):
    """Detection as a `tfx_transformer.training.trainer.Task`: what `train_detr` runs.

    Args:
        data: ``embedded``, ``coco:IMAGES_DIR:ANNOTATIONS.json`` or ``tfds:NAME``.
        config: the model, loss, optimizer and data settings (`vision.config.preset`).
        run: the run options (held-out share, seed, ``eval_limit``, ``jit_compile``).
        log: where progress lines go.
        skip_bad_images: train without the ``coco:`` image files that cannot be used (and
            their annotations) instead of stopping with their names.
        init_from: start a new run from these weights (`vision.pretrained.init_from.init_from`: a
            work directory, an export, a ``model.keras`` or, with an RT-DETR preset, a
            transformers RT-DETR or D-FINE folder, whose architecture replaces the preset's); a
            resumed run starts from its own.
    """

    state_files = ()

    def __init__(self, data: str, config: DetrConfig, run: RunOptions,
                 log: Callable[..., None] = print, skip_bad_images: bool = False,
                 init_from: str | os.PathLike | None = None):
        if run.jit_compile and config.matcher_solver == "scipy":
            raise ValueError("`jit_compile=True` needs `matcher_solver='ops'`: the scipy "
                             "matcher is a host callback. Received: matcher_solver='scipy'")
        self.data, self.config, self.run, self.log = data, config, run, log
        self.skip_bad_images = skip_bad_images
        self.init_from = init_from
        folder_config = None
        if init_from is not None:
            check_init_source(init_from)
            folder_config = rtdetr_folder_config(init_from)
            if folder_config is not None:
                if config.architecture != "rtdetr":
                    names = ", ".join(n for n, c in PRESETS.items() if c.architecture == "rtdetr")
                    raise ValueError(
                        f"--init-from {init_from}: an RT-DETR or D-FINE folder needs an RT-DETR "
                        f"preset ({names}: its training settings; the architecture comes from "
                        f"the folder). Received: --preset {config.name}")
                config = self.config = dataclasses.replace(config, rtdetr=folder_config)
        self.fixed_size = None
        if config.architecture == "rtdetr":  # RT-DETR's image processor: stretch, / 255
            scaling = {}
            if folder_config is not None:  # the folder's own scaling and normalization
                scaling = _folder_scaling(init_from)
            self.fixed_size = FixedSize(config.image_size, config.image_size, **scaling)
        self.default_epochs = config.epochs
        self.limit = ObjectLimit(config.num_queries)  # DETR needs a query per object

    def load_data(self, context: RunContext) -> TaskData:
        """The source and its padded batches (whole global batches with several replicas).

        ``coco:`` image files are decoded once up front (the results cached in
        ``DIR/image_check.json``), and shrunk on read to the longest side training resizes to.
        """
        cache = context.workdir.root / CACHE_FILE
        kept = cache.exists()
        try:
            return self._load_data(context, str(cache))
        except BaseException:  # data refused: a check's cache written now goes with the run
            if not kept:
                cache.unlink(missing_ok=True)
            raise

    def _load_data(self, context: RunContext, cache: str) -> TaskData:
        data, config, run, log, limit = self.data, self.config, self.run, self.log, self.limit
        source = self.source = load_source(
            data, valid_fraction=run.valid_fraction, seed=run.seed,
            max_side=DetrSizes.scaled(config.image_size, config.max_image_size).max_size,
            skip_bad_images=self.skip_bad_images,
            check_cache=cache, log=log)
        num_train, num_valid = source.num_examples("train"), source.num_examples("valid")
        if num_train == 0:
            held_out = f" ({num_valid} held out by valid_fraction={run.valid_fraction})" if (
                num_valid) else ""
            raise ValueError(f"--data {data}: no training images{held_out}; nothing to train on")
        replicas = context.replicas
        global_batch = self.global_batch = config.batch_size * replicas
        # Several replicas: each replica gets as many images in every batch (Keras builds the
        # model from the first batch split over the replicas, which must give one shape, and a
        # replica without images cannot run): whole training batches (DETR drops the last one
        # too), and validation images to a multiple of the replicas.
        whole = replicas > 1
        train_steps = (num_train // global_batch if whole else math.ceil(num_train / global_batch)
                       ) if num_train else None
        if train_steps == 0:
            raise ValueError(f"--data {data}: {num_train} training images, fewer than the "
                             f"global batch of {global_batch} ({config.batch_size} per replica "
                             f"times {replicas} replicas)")
        sizes = dict(image_size=config.image_size, max_size=config.max_image_size)
        if self.fixed_size is not None:
            sizes = dict(image_size=self.fixed_size, max_size=None)
        train_ds = source.batches("train", batch_size=global_batch, object_limit=limit,
                                  seed=context.data_seed, augmentation=config.augmentation,
                                  drop_remainder=whole, **sizes)
        if num_valid is not None and run.eval_limit is not None:
            num_valid = min(num_valid, run.eval_limit)
        source.check_max_objects("valid", config.num_queries)
        valid_records = source.records("valid")
        if run.eval_limit is not None:
            valid_records = valid_records.take(run.eval_limit)
        fit_valid = num_valid  # the validation images of fit
        if whole and num_valid is not None:
            fit_valid = num_valid - num_valid % replicas
            valid_records = valid_records.take(fit_valid)
        valid_ds = None if fit_valid == 0 else make_batches(
            valid_records, batch_size=global_batch, object_limit=limit,
            drop_remainder=whole and fit_valid is None, **sizes)
        if valid_ds is not None and fit_valid is not None:  # no "ran out of data" in Keras
            valid_ds = valid_ds.apply(tf.data.experimental.assert_cardinality(
                math.ceil(fit_valid / global_batch)))
        log(f"data: {data}, {source.num_classes} classes, {num_train} training images, "
            f"{num_valid} validation images")
        if fit_valid != num_valid:
            log(f"validation during fit: {fit_valid} of the {num_valid} images (a multiple of "
                f"the {replicas} replicas); the evaluation scores all of them")
        self.num_train, self.num_valid = num_train, num_valid
        if whole:
            train_ds, valid_ds = _float_masks(train_ds), _float_masks(valid_ds)
        if config.uses_denoising:  # the denoising queries are made from the targets
            train_ds = train_ds.map(lambda inputs, targets: ({**inputs, "targets": targets},
                                                             targets))
        return TaskData(train_ds, valid_ds, train_steps)

    def build_model(self, context: RunContext, data: TaskData) -> keras.Model:
        """`DETR` (or `RTDetr`) compiled with its set criterion and AdamW on DETR's step
        drop."""
        config, run, classes = self.config, self.run, self.source.num_classes
        self.schedule = schedule = StepDropSchedule(
            config.learning_rate, config.lr_drop_epochs, config.lr_drop_fraction, run.max_steps)
        if config.architecture == "rtdetr":
            model, criterion = build_rtdetr_model(config, classes)
        else:
            model, criterion = build_model(config, classes), build_criterion(config, classes)
        model.compile(optimizer=build_optimizer(config, model, learning_rate=schedule),
                      criterion=criterion, jit_compile=run.jit_compile)
        self.log(f"model: {config.name}, {model.count_params():,} parameters, "
                 f"{context.replicas} replica(s), batch {self.global_batch}")
        if self.init_from is not None:
            if not context.fresh:
                self.log(f"init: the run resumes from its own state; --init-from "
                         f"{self.init_from} is not read again")
            elif is_chief():  # the other workers get the chief's weights when fit begins
                init_from(model, self.init_from, self.source.class_names, self.log)
        return model

    def callbacks(self, context: RunContext, model: keras.Model) -> list:
        """The object limit: an image over ``num_queries`` objects stops the run."""
        return [self.limit.callback()]

    def export(self, model: keras.Model, path) -> None:
        source = self.source
        export_detector(model, path, source.class_names, *self._eval_sizes(),
                        category_ids=source.category_ids)

    def _eval_sizes(self) -> tuple:
        """``(image_size, max_size)`` of the evaluation resize and the export."""
        if self.fixed_size is not None:
            return self.fixed_size, None
        return self.config.image_size, self.config.max_image_size

    def evaluate(self, model: keras.Model) -> dict:
        """Validation COCO AP (pycocotools), data and config."""
        config, run, source = self.config, self.run, self.source
        scores: dict = {}
        if self.num_valid != 0:
            detect = make_detect_fn(model, *self._eval_sizes())
            scores = evaluate_records(detect, source.records("valid"),
                                      batch_size=self.global_batch, limit=run.eval_limit,
                                      num_classes=source.num_classes)
        self.limit.check()
        return {
            "valid": scores,
            "data": {"spec": self.data, "class_names": list(source.class_names),
                     "train_images": self.num_train,
                     "valid_images": scores.get("n", self.num_valid)},
            "config": {"preset": config.name, **dataclasses.asdict(config)},
        }


def _folder_scaling(folder) -> dict:
    """The pixel scaling and normalization of an RT-DETR folder's image processor (its
    ``preprocessor_config.json``, or the processor's defaults); the size is the run's."""
    from tfx_transformer.hf_files import read_json
    from vision.pretrained.rtdetr_config import preprocessing_settings

    path = os.path.join(os.fspath(folder), "preprocessor_config.json")
    settings = preprocessing_settings(read_json(path) if os.path.isfile(path) else None, path)
    return {key: settings[key] for key in ("rescale", "mean", "std")}


def build_rtdetr_model(config: DetrConfig, num_classes: int):
    """The built `RTDetr` of an ``architecture="rtdetr"`` config (its ``rtdetr`` fields with
    the config's ``num_queries`` and ``dropout``; a `DFine` for a D-FINE's) and its
    `rtdetr_criterion` (the config's matcher costs, solver, auxiliary losses and weights,
    ``loss_ce`` weighting the varifocal loss or DEIM's; `dfine_criterion` with FGL and DDF for
    D-FINE)."""
    from vision.modeling.dfine import DFine, dfine_criterion
    from vision.pretrained.rtdetr import build_rtdetr
    from vision.pretrained.rtdetr_config import rtdetr_settings

    fields = {**config.rtdetr, "num_queries": config.num_queries, "dropout": config.dropout}
    model = build_rtdetr(rtdetr_settings(fields, f"preset {config.name}: rtdetr"), num_classes)
    deim = {key: getattr(config, key) for key in ("matchability_aware_loss", "dense_one_to_one")}
    weights = {"loss_mal" if config.matchability_aware_loss else "loss_vfl": config.loss_ce,
               "loss_bbox": config.loss_bbox, "loss_giou": config.loss_giou}
    costs = (config.cost_class, config.cost_bbox, config.cost_giou)
    if isinstance(model, DFine):  # and D-FINE's localization losses, at its config's weights
        weights.update(loss_fgl=float(fields.get("weight_loss_fgl", 0.15)),
                       loss_ddf=float(fields.get("weight_loss_ddf", 1.5)))
        return model, dfine_criterion(num_classes, model.decoder, solver=config.matcher_solver,
                                      aux_loss=config.aux_loss, weights=weights, costs=costs,
                                      **deim)
    criterion = rtdetr_criterion(num_classes, solver=config.matcher_solver,
                                 aux_loss=config.aux_loss, weights=weights, costs=costs,
                                 **deim)
    return model, criterion


def train_detr(data: str, workdir: str | os.PathLike, config: DetrConfig, run: RunOptions,
               callbacks: Iterable[keras.callbacks.Callback] = (),
               log: Callable[..., None] = print, skip_bad_images: bool = False,
               init_from: str | os.PathLike | None = None) -> dict:
    """Trains DETR on ``data``, writes the work directory, returns validation COCO AP.

    Work directory: ``checkpoints/``, ``backup/`` (while running, so a killed run resumes),
    ``logs/``, ``export/`` (the ``Detector`` SavedModel + ``classes.json``) and
    ``metrics.json`` (``valid``: AP, AP50, AP75, n; ``history``; ``train``; ``data``;
    ``config``; ``training_seconds``).

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
        skip_bad_images: leave out the ``coco:`` image files that cannot be used (missing,
            truncated, not decodable, over PIL's decompression-bomb limit) and their
            annotations; without it they end the run before training, named.
        init_from: a new run starts from these weights instead of random ones: a finished
            work directory, an export or a ``model.keras`` (`vision.pretrained.init_from.init_from`:
            the class heads are re-initialized when the classes differ).

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
    task = DetectionTask(data, config, run, log, skip_bad_images=skip_bad_images,
                         init_from=init_from)
    return Trainer(workdir, run, log).fit(task, callbacks)
