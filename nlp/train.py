"""Training a translator end to end: tokenizer, batches, fit, export, held-out BLEU.

`train_nmt` builds what is particular to translation (tokenizer, token-bucketed batches, the
Noam-scheduled model) and leaves the rest to `tfx_transformer.trainer.Trainer`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

import keras
import tensorflow as tf

from nlp.config import NMTConfig
from nlp.data.batching import make_batches
from nlp.data.sources import load_pairs
from nlp.evaluate import evaluate
from nlp.export import export_translator, make_translate_fn
from nlp.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from nlp.model import build_model
from nlp.tokenizer import Tokenizer, train_tokenizer
from tfx_transformer import NoamSchedule
from tfx_transformer.run import RunOptions
from tfx_transformer.trainer import Trainer

__all__ = ["DEFAULT_EPOCHS", "build_tokenizer", "compile_model", "train_nmt"]

DEFAULT_EPOCHS = 10  # when the run sets neither epochs nor a step or time bound
NUM_SAMPLES = 5  # held-out translations recorded in metrics.json


def build_tokenizer(path: str, pairs, vocab_size: int, log=print) -> Tokenizer:
    """Reuses ``path`` if it exists (a resumed run must keep its vocabulary), else trains it."""
    if not os.path.exists(path):
        texts = [text for pair in pairs for text in pair]
        train_tokenizer(texts, path, vocab_size=vocab_size)
        log(f"tokenizer: trained on {len(texts)} sentences -> {path}")
    tokenizer = Tokenizer.from_file(path)
    log(f"tokenizer: vocabulary of {tokenizer.vocab_size}")
    return tokenizer


def compile_model(model, config: NMTConfig, jit_compile: bool = True) -> None:
    """Adam(0.9, 0.98, 1e-9) on the Noam schedule, label-smoothed loss, masked accuracy."""
    schedule = NoamSchedule(config.d_model, config.warmup_steps, config.lr_scale)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=MaskedLabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=jit_compile,
    )


def train_nmt(data: str, workdir: str | os.PathLike, config: NMTConfig, run: RunOptions,
              callbacks: Iterable[keras.callbacks.Callback] = (),
              log: Callable[..., None] = print) -> dict:
    """Trains on ``data``, writes the work directory, returns the held-out scores.

    Work directory: ``tokenizer.model``, ``checkpoints/``, ``backup/`` (while running, so a
    killed run resumes), ``logs/``, ``export/`` (the SavedModel) and ``metrics.json``
    (``valid``, ``samples``, ``data``, ``config``, ``train_seconds``, ``history``, ``train``).

    Args:
        data: ``embedded``, ``tsv:PATH`` or ``tfds:NAME``.
        workdir: work directory (created; nothing in it is deleted).
        config: the model, training and decoding settings (`nlp.config.preset`); the export
            and the evaluation decode with ``config.decoding``.
        run: strategy, precision, epochs (default `DEFAULT_EPOCHS`, or unlimited with
            ``max_steps``/``time_budget``), seed, held-out share of a ``tsv:`` file,
            ``eval_limit`` (evaluate on at most this many held-out pairs; None: all) and
            ``jit_compile`` (XLA: every bucket shape compiles anew, which costs more than
            XLA saves on a CPU for the tiny model).
        callbacks: extra Keras callbacks for ``fit``.
        log: where progress lines go.

    Returns:
        ``metrics.json``'s ``valid`` entry: bleu, chrf, exact_match, n ({} on non-chief
        workers).

    Raises:
        ValueError: bad data (no training pairs, malformed file, unknown scheme).
    """
    trainer = Trainer(workdir, run, log)
    train_pairs = load_pairs(data, "train", valid_fraction=run.valid_fraction, seed=run.seed)
    valid_pairs = load_pairs(data, "valid", valid_fraction=run.valid_fraction, seed=run.seed)
    if not train_pairs:
        raise ValueError(f"--data {data}: no training pairs.")
    log(f"data: {len(train_pairs)} training pairs, {len(valid_pairs)} held out")
    tokenizer = build_tokenizer(str(trainer.workdir.root / "tokenizer.model"), train_pairs,
                                config.vocab_size, log)

    def batches(pairs, shuffle):
        ds = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))
        return make_batches(ds, tokenizer, config.batch_tokens, config.max_length,
                            shuffle=shuffle, seed=run.seed,
                            pad_to_bucket_boundary=run.jit_compile)

    train_ds, train_stats = batches(train_pairs, shuffle=True)
    valid_ds = batches(valid_pairs, shuffle=False)[0] if valid_pairs else None
    with trainer.strategy.scope():
        model = build_model(config, vocab_size=tokenizer.vocab_size)
        compile_model(model, config, jit_compile=run.jit_compile)
    log(f"model: {config.name}, {model.count_params():,} parameters")

    def evaluate_held_out() -> dict:
        translate = tf.function(make_translate_fn(model, tokenizer, config.decoding))
        held_out = valid_pairs if run.eval_limit is None else valid_pairs[:run.eval_limit]
        scores, hypotheses = evaluate(translate, held_out) if held_out else ({}, [])
        samples = [{"source": s, "reference": t, "translation": h}
                   for (s, t), h in list(zip(held_out, hypotheses))[:NUM_SAMPLES]]
        return {
            "valid": scores,
            "samples": samples,
            "data": {"spec": data, "train_pairs": len(train_pairs),
                     "valid_pairs": len(valid_pairs), **train_stats.result()},
            "config": {"preset": config.name, **dataclasses.asdict(config),
                       "vocab_size": tokenizer.vocab_size},
        }

    return trainer.train(
        model, train_ds, valid_ds, default_epochs=DEFAULT_EPOCHS,
        export=lambda path: export_translator(model, tokenizer, path, config.decoding),
        evaluate=evaluate_held_out, callbacks=callbacks,
    )
