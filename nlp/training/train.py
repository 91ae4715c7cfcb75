"""Training a translator end to end: tokenizer, batches, fit, export, held-out BLEU.

`TranslationTask` is what is particular to translation (tokenizer, token-bucketed batches, the
scheduled model, validation BLEU, averaged weights, the export and held-out BLEU);
`train_nmt` hands it to `tfx_transformer.training.trainer.Trainer`, which runs the rest.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable

import keras
import tensorflow as tf

from nlp.config import NMTConfig
from nlp.data.batching import count_batches, make_batches
from nlp.data.sources import load_pairs
from nlp.export.translator import export_translator, trace_translate_fn
from nlp.modeling.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from nlp.modeling.model import build_model
from nlp.pretrained.model_dir import fine_tuning, workdir_tokenizer
from nlp.text.tokenizer import TOKENIZER_FILE, Tokenizer
from nlp.text.vocabulary import train_tokenizer
from nlp.training.callbacks import Patience, ValidationScores
from nlp.training.evaluate import evaluate
from tfx_transformer import BudgetSchedule, NoamSchedule
from tfx_transformer.replicas import GlobalClipAdam
from tfx_transformer.training.checkpoints import Averaging
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import RunContext, Task, TaskData, Trainer
from tfx_transformer.training.workdir import write_atomically

__all__ = ["DEFAULT_EPOCHS", "TranslationTask", "build_tokenizer", "compile_model",
           "count_batches", "make_schedule", "train_nmt"]

DEFAULT_EPOCHS = 10  # when the run sets neither epochs nor a step or time bound
NUM_SAMPLES = 5  # held-out translations recorded in metrics.json


def _requested_vocab_size(tokenizer: Tokenizer) -> int:
    """The vocabulary size the tokenizer was trained for (it may hold fewer pieces)."""
    try:
        from sentencepiece import sentencepiece_model_pb2

        spec = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.model_proto).trainer_spec
        return int(spec.vocab_size) or tokenizer.vocab_size
    except Exception:  # an older or newer protobuf: compare with the pieces it holds
        return tokenizer.vocab_size


def build_tokenizer(path: str, pairs, vocab_size: int, log=print,
                    check: Callable[[Tokenizer], None] | None = None,
                    strategy: tf.distribute.Strategy | None = None) -> Tokenizer:
    """Reuses ``path`` if it exists (a resumed run must keep its vocabulary), else trains it.

    A reused tokenizer trained for another ``vocab_size`` is an error: the work directory's
    run and checkpoints use its vocabulary, so the new size cannot be honoured (a new tokenizer
    needs ``--restart`` or a new work directory). A new one is written to ``path`` only once
    ``check(tokenizer)`` (if given) has passed, so data it rejects leaves no file behind.

    With several workers (``strategy``, by default the `MultiWorkerMirroredStrategy` of this
    process, `tfx_transformer.training.distribute.multi_worker_strategy`) only the chief reuses or
    trains the tokenizer and writes ``path``, in its own work directory. Every other worker
    waits for the chief's model proto, which comes by a collective broadcast over the
    strategy (`tfx_transformer.training.distribute.broadcast_from_chief`: no shared file system is
    needed), runs ``check`` on it and writes nothing. All workers must call this at the same
    point; when the chief fails, the others raise too instead of waiting.

    Raises:
        ValueError: ``path`` was trained for another ``vocab_size``, or ``check`` raised; on
            a non-chief worker, the chief could not build its tokenizer.
    """
    from tfx_transformer.training.distribute import (
        broadcast_from_chief,
        is_chief,
        multi_worker_strategy,
    )

    def build() -> Tokenizer:
        if os.path.exists(path):
            tokenizer = Tokenizer.from_file(path)
            trained_for = _requested_vocab_size(tokenizer)
            if trained_for != vocab_size:
                raise ValueError(
                    f"{path} was trained with --vocab-size {trained_for}, not {vocab_size}, "
                    f"and this work directory keeps its tokenizer (a vocabulary of "
                    f"{tokenizer.vocab_size}): rerun with --vocab-size {trained_for} to go on "
                    "with it, or with --restart (or a new --workdir) to train a new one")
            if check is not None:
                check(tokenizer)
        else:
            texts = [text for pair in pairs for text in pair]
            trained = []

            def write(tmp):  # checked before it becomes the run's tokenizer
                train_tokenizer(texts, tmp, vocab_size=vocab_size)
                trained.append(Tokenizer.from_file(tmp))
                if check is not None:
                    check(trained[0])

            write_atomically(path, write)
            tokenizer = trained[0]
            log(f"tokenizer: trained on {len(texts)} sentences -> {path}")
        return tokenizer

    strategy = strategy if strategy is not None else multi_worker_strategy()
    if strategy is None:
        tokenizer = build()
    elif is_chief():
        try:
            tokenizer = build()
        except BaseException:
            broadcast_from_chief(b"", strategy)  # so that the other workers stop waiting
            raise
        broadcast_from_chief(tokenizer.model_proto, strategy)
    else:
        proto = broadcast_from_chief(None, strategy)
        if not proto:
            raise ValueError("the chief worker could not build the tokenizer; see its log")
        tokenizer = Tokenizer(proto)
        if check is not None:
            check(tokenizer)
        log("tokenizer: received from the chief worker")
    log(f"tokenizer: vocabulary of {tokenizer.vocab_size}")
    return tokenizer


def make_schedule(config: NMTConfig, total_steps: int | None = None, timed: bool = False):
    """``config.schedule``: `BudgetSchedule` over ``total_steps`` and, when ``timed``, the
    run's time budget (the trainer's `tfx_transformer.training.callbacks.ScheduleProgress`); or
    `NoamSchedule`, also for a budget schedule of a run whose length is not known (neither
    ``total_steps`` nor ``timed``)."""
    if config.schedule == "noam" or (total_steps is None and not timed):
        return NoamSchedule(config.d_model, config.warmup_steps, config.lr_scale)
    return BudgetSchedule(config.peak_learning_rate, total_steps, config.warmup_share)


def compile_model(model, config: NMTConfig, jit_compile: bool = True,
                  total_steps: int | None = None, timed: bool = False):
    """Adam(0.9, 0.98, 1e-9) on the config's schedule (`make_schedule`), clipped to
    ``config.clip_norm``, label-smoothed loss, masked accuracy. Returns the schedule."""
    schedule = make_schedule(config, total_steps, timed)
    model.compile(
        optimizer=GlobalClipAdam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                                 global_clipnorm=config.clip_norm),
        loss=MaskedLabelSmoothedCrossEntropy(config.label_smoothing, pad_id=model.pad_id),
        metrics=[MaskedAccuracy(pad_id=model.pad_id)],
        jit_compile=jit_compile,
    )
    return schedule


class TranslationTask(Task):
    """Translation as a `tfx_transformer.training.trainer.Task`: what `train_nmt` runs.

    Args:
        data: ``embedded``, ``tsv:PATH`` or ``tfds:NAME``.
        config: the model, training and decoding settings (`nlp.config.preset`).
        run: the run options (the held-out share, seed, ``eval_limit``, ``jit_compile``).
        log: where progress lines go.
        init_from: a model directory to fine-tune (`nlp.pretrained.model_dir.fine_tuning`).
    """

    default_epochs = DEFAULT_EPOCHS

    def __init__(self, data: str, config: NMTConfig, run: RunOptions,
                 log: Callable[..., None] = print, init_from: str | os.PathLike | None = None):
        self.data, self.run, self.log = data, run, log
        self.initial, self.state_files = None, (TOKENIZER_FILE,)
        self._traced = (None, None)  # `_translate`: (model, its traced search)
        if init_from is not None:
            config, self.initial = fine_tuning(config, init_from, log)
            self.state_files = self.initial.tokenizer_files
        self.config = config
        # The export: the mean of the last epochs, up to the best one with patience.
        self.averaging = Averaging(config.average_last,
                                   "val_bleu" if config.patience is not None else None)

    def load_data(self, context: RunContext) -> TaskData:
        """The pairs, the tokenizer (trained, or the work directory's) and the batches."""
        data, config, run, log = self.data, self.config, self.run, self.log
        self.train_pairs = load_pairs(data, "train", valid_fraction=run.valid_fraction,
                                      seed=run.seed)
        self.valid_pairs = load_pairs(data, "valid", valid_fraction=run.valid_fraction,
                                      seed=run.seed)
        if not self.train_pairs:
            raise ValueError(f"--data {data}: no training pairs.")
        log(f"data: {len(self.train_pairs)} training pairs, {len(self.valid_pairs)} held out")
        counts = {}

        def count(tokenizer) -> None:  # before the pipeline is built and the tokenizer saved
            counts["train"] = count_batches(self.train_pairs, tokenizer, config.batch_tokens,
                                            config.max_length)
            if not counts["train"][0]:
                raise ValueError(
                    f"--data {data}: all {len(self.train_pairs)} training pairs are longer "
                    f"than max_length={config.max_length} tokens (source + eos or bos + "
                    "target), so none is left to train on; raise `max_length`")
            counts["valid"] = count_batches(self.valid_pairs, tokenizer, config.batch_tokens,
                                            config.max_length)

        if self.initial is not None:
            self.tokenizer = workdir_tokenizer(self.initial, context.workdir.root, log)
            count(self.tokenizer)
        else:
            self.tokenizer = build_tokenizer(str(context.workdir.root / TOKENIZER_FILE),
                                             self.train_pairs, config.vocab_size, log,
                                             check=count)
        (self.kept, self.dropped, train_steps), valid_steps = counts["train"], counts["valid"][2]
        self.train_batches = train_steps

        def batches(pairs, shuffle, steps):
            ds = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs],
                                                     [t for _, t in pairs]))
            ds = make_batches(ds, self.tokenizer, config.batch_tokens, config.max_length,
                              shuffle=shuffle, seed=context.data_seed,
                              pad_to_bucket_boundary=run.jit_compile,
                              num_replicas=context.replicas)[0]
            # A known length: Keras then ends each epoch there, without "ran out of data".
            return ds.apply(tf.data.experimental.assert_cardinality(steps))

        valid = batches(self.valid_pairs, False, valid_steps) if valid_steps else None
        return TaskData(batches(self.train_pairs, True, train_steps), valid, train_steps)

    def build_model(self, context: RunContext, data: TaskData) -> keras.Model:
        """The `Seq2SeqTransformer`, compiled (`compile_model`) on the run's schedule."""
        config, run = self.config, self.run
        total_steps = context.total_steps(data.steps_per_epoch)
        if self.initial is not None:  # a resumed run then loads its own state over it
            model = self.initial.model
        else:
            model = build_model(config, vocab_size=self.tokenizer.vocab_size)
        self.schedule = schedule = compile_model(
            model, config, jit_compile=run.jit_compile, total_steps=total_steps,
            timed=run.time_budget is not None)
        self.log(f"model: {config.name}, {model.count_params():,} parameters")
        if isinstance(schedule, BudgetSchedule):
            bound = " and ".join(filter(None, [
                f"{total_steps} steps" if total_steps else "",
                f"{run.time_budget:g} min" if run.time_budget else ""]))
            self.log(f"schedule: warm-up over {config.warmup_share:.0%} of {bound} to "
                     f"{config.peak_learning_rate:.2e}, then linear decay to 0")
        return model

    def callbacks(self, context: RunContext, model: keras.Model) -> list:
        """Per-epoch validation BLEU (``valid_sentences``, on with ``patience``), patience."""
        config, watch = self.config, []
        sentences = config.valid_sentences or (100 if config.patience is not None else 0)
        validating = sentences > 0 and bool(self.valid_pairs)
        if validating:
            watch.append(ValidationScores(self.tokenizer, self.valid_pairs, limit=sentences))
        if config.patience is not None:
            if not validating:
                raise ValueError("`patience` needs held-out pairs (it stops on their val_bleu)")
            watch.append(Patience(context.workdir, config.patience, log=self.log))
        return watch

    def final_weights(self, context: RunContext, model: keras.Model) -> str:
        """The mean of the last epochs' weights (``average_last``), or the best epoch."""
        return self.averaging.choose(model, context.workdir)

    def _translate(self, model: keras.Model):
        """The run's search (``config.decoding``) of ``model``, traced once for the export and
        the evaluation."""
        if self._traced[0] is not model:
            self._traced = (model, trace_translate_fn(model, self.tokenizer,
                                                      self.config.decoding))
        return self._traced[1]

    def export(self, model: keras.Model, path) -> None:
        export_translator(model, self.tokenizer, path, self.config.decoding,
                          translate=self._translate(model))

    def evaluate(self, model: keras.Model) -> dict:
        """Held-out BLEU, chrF and exact match (sacrebleu), samples, data and config."""
        config, run = self.config, self.run
        translate = self._translate(model)
        pairs = self.valid_pairs
        held_out = pairs if run.eval_limit is None else pairs[:run.eval_limit]
        # The bar only on a terminal: a log file would get each of its redraws.
        scores, hypotheses = evaluate(translate, held_out, progress=sys.stdout.isatty()) \
            if held_out else ({}, [])
        samples = [{"source": s, "reference": t, "translation": h}
                   for (s, t), h in list(zip(held_out, hypotheses))[:NUM_SAMPLES]]
        return {
            "valid": scores,
            "samples": samples,
            "data": {"spec": self.data, "train_pairs": len(self.train_pairs),
                     "valid_pairs": len(pairs), "kept": self.kept, "dropped": self.dropped,
                     "train_batches": self.train_batches},
            # ``vocab_size`` as asked; the tokenizer's pieces (fewer on a small corpus) beside it.
            "config": {"preset": config.name, **dataclasses.asdict(config),
                       "tokenizer_vocab_size": self.tokenizer.vocab_size},
        }


def train_nmt(data: str, workdir: str | os.PathLike, config: NMTConfig, run: RunOptions,
              callbacks: Iterable[keras.callbacks.Callback] = (),
              log: Callable[..., None] = print,
              init_from: str | os.PathLike | None = None) -> dict:
    """Trains on ``data``, writes the work directory, returns the held-out scores.

    Work directory: ``tokenizer.model``, ``checkpoints/``, ``backup/`` (while running, so a
    killed run resumes), ``logs/``, ``export/`` (the SavedModel) and ``metrics.json``
    (``valid``, ``samples``, ``data``, ``config``, ``training_seconds``, ``history``, ``train``).

    Args:
        data: ``embedded``, ``tsv:PATH`` or ``tfds:NAME``.
        workdir: work directory (created; nothing in it is deleted).
        config: the model, training and decoding settings (`nlp.config.preset`): the
            learning-rate schedule (``schedule``: the budget schedule spans the run's step
            bound and time budget), per-epoch validation (``valid_sentences``, ``patience``)
            and the exported weights (``average_last``; the best epoch with ``patience``);
            the export and the evaluation decode with ``config.decoding``.
        run: strategy, precision, epochs (default `DEFAULT_EPOCHS`, or unlimited with
            ``max_steps``/``time_budget``), seed, held-out share of a ``tsv:`` file,
            ``eval_limit`` (evaluate on at most this many held-out pairs; None: all) and
            ``jit_compile`` (XLA: every bucket shape compiles anew, which costs more than
            XLA saves on a CPU for the tiny model).
        callbacks: extra Keras callbacks for ``fit``.
        log: where progress lines go.
        init_from: fine-tune this model directory's model (a converted OPUS-MT model) with
            its tokenizer and decoding (`nlp.pretrained.model_dir.fine_tuning`).

    Returns:
        ``metrics.json``'s ``valid`` entry: bleu, chrf, exact_match, n ({} on non-chief
        workers).

    A finished run rerun with nothing more to do returns its recorded scores and changes
    nothing (`tfx_transformer.training.trainer.Trainer`).

    Raises:
        ValueError: bad data (no training pairs, none shorter than ``max_length`` tokens,
            malformed file, unknown scheme), a broken file in the work directory, or a NaN
            loss (`tfx_transformer.training.callbacks.NonFiniteLossError`).
    """
    return Trainer(workdir, run, log).fit(TranslationTask(data, config, run, log, init_from),
                                          callbacks)
