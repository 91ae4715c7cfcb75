"""Training a translator end to end: tokenizer, batches, fit, export, held-out BLEU."""

from __future__ import annotations

import os
import time

import keras
import tensorflow as tf

from nlp import data
from nlp.config import preset
from nlp.evaluate import evaluate
from nlp.export import export_translator, make_translate_fn
from nlp.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from nlp.model import build_model
from nlp.tokenizer import Tokenizer, train_tokenizer
from tfx_transformer import NoamSchedule, training

__all__ = ["train_nmt", "build_tokenizer", "compile_model"]

LONG_RUN_EPOCHS = 100_000  # with a time budget or step limit, those decide when to stop


def build_tokenizer(path: str, pairs, vocab_size: int, log=print) -> Tokenizer:
    """Reuses ``path`` if it exists (a resumed run must keep its vocabulary), else trains it."""
    if not os.path.exists(path):
        texts = [text for pair in pairs for text in pair]
        train_tokenizer(texts, path, vocab_size=vocab_size)
        log(f"tokenizer: trained on {len(texts)} sentences -> {path}")
    tokenizer = Tokenizer.from_file(path)
    log(f"tokenizer: vocabulary of {tokenizer.vocab_size}")
    return tokenizer


def compile_model(model, config, jit_compile: bool = True) -> None:
    """Adam(0.9, 0.98, 1e-9) on the Noam schedule, label-smoothed loss, masked accuracy."""
    schedule = NoamSchedule(config.d_model, config.warmup_steps, config.lr_scale)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=MaskedLabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=jit_compile,
    )


def train_nmt(data_spec: str, workdir: str, preset_name: str = "tiny", epochs: int | None = None,
              max_steps: int | None = None, time_budget: float | None = None,
              batch_tokens: int | None = None, vocab_size: int | None = None,
              max_length: int | None = None, strategy: str = "auto",
              mixed_precision: str = "none", seed: int = 0, valid_fraction: float = 0.05,
              beam_size: int | None = None, eval_limit: int | None = 1000,
              jit_compile: bool = False, callbacks=(), log=print) -> dict:
    """Trains on ``data_spec``, writes the work directory, returns the held-out scores.

    Work directory: ``tokenizer.model``, ``checkpoints/``, ``backup/`` (while running, so a
    killed run resumes), ``logs/``, ``export/`` (the SavedModel) and ``metrics.json``.

    Args:
        data_spec: ``embedded``, ``tsv:PATH`` or ``tfds:NAME``.
        workdir: work directory (created; nothing in it is deleted).
        preset_name: ``tiny``, ``base`` or ``big``.
        epochs: epochs (default 10, or unlimited with ``max_steps``/``time_budget``).
        max_steps: stop after this many steps in total.
        time_budget: stop training after this many minutes, then export and evaluate.
        batch_tokens, vocab_size, max_length: override the preset.
        strategy: ``auto``, ``mirrored`` or ``multi_worker``.
        mixed_precision: ``none``, ``bfloat16`` or ``float16``.
        seed: random seed.
        valid_fraction: held-out share of a ``tsv:`` file.
        beam_size: beam width of the export and evaluation (preset default 4).
        eval_limit: evaluate on at most this many held-out pairs (None: all).
        jit_compile: XLA-compile the train step (off by default: every bucket shape compiles
            anew, which costs more than XLA saves on a CPU for the tiny model).
        callbacks: extra Keras callbacks for ``fit``.
        log: where progress lines go.

    Returns:
        ``metrics.json``'s ``valid`` entry: bleu, chrf, exact_match, n.
    """
    started = time.monotonic()
    strategy_obj = training.get_strategy(strategy)  # before any other TensorFlow work
    training.set_mixed_precision(mixed_precision)
    keras.utils.set_random_seed(seed)
    overrides = {k: v for k, v in dict(batch_tokens=batch_tokens, vocab_size=vocab_size,
                                       max_length=max_length, beam_size=beam_size).items()
                 if v is not None}
    config = preset(preset_name, **overrides)
    wd = training.Workdir(workdir)

    train_pairs = data.load_pairs(data_spec, "train", valid_fraction=valid_fraction, seed=seed)
    valid_pairs = data.load_pairs(data_spec, "valid", valid_fraction=valid_fraction, seed=seed)
    if not train_pairs:
        raise ValueError(f"--data {data_spec}: no training pairs.")
    log(f"data: {len(train_pairs)} training pairs, {len(valid_pairs)} held out")
    tokenizer = build_tokenizer(str(wd.root / "tokenizer.model"), train_pairs,
                                config.vocab_size, log)

    def batches(pairs, shuffle):
        ds = tf.data.Dataset.from_tensor_slices(
            ([s for s, _ in pairs], [t for _, t in pairs])
        )
        return data.make_batches(ds, tokenizer, config.batch_tokens, config.max_length,
                                 shuffle=shuffle, seed=seed, pad_to_bucket_boundary=jit_compile)

    train_ds, train_stats = batches(train_pairs, shuffle=True)
    valid_ds = batches(valid_pairs, shuffle=False)[0] if valid_pairs else None

    with strategy_obj.scope():
        model = build_model(config, vocab_size=tokenizer.vocab_size)
        compile_model(model, config, jit_compile=jit_compile)
    log(f"model: {preset_name}, {model.count_params():,} parameters")
    if epochs is None:
        epochs = LONG_RUN_EPOCHS if (max_steps or time_budget) else 10
    callbacks = training.standard_callbacks(wd, time_budget, max_steps) + list(callbacks)
    model.fit(train_ds, validation_data=valid_ds, epochs=epochs, callbacks=callbacks)
    train_seconds = time.monotonic() - started

    export_translator(model, tokenizer, wd.export, beam_size=config.beam_size,
                      alpha=config.length_penalty, extra_length=config.extra_decode_length)
    log(f"export: {wd.export}")
    translate = tf.function(make_translate_fn(
        model, tokenizer, config.beam_size, config.length_penalty, config.extra_decode_length
    ))
    held_out = valid_pairs if eval_limit is None else valid_pairs[:eval_limit]
    scores, hypotheses = evaluate(translate, held_out) if held_out else ({}, [])
    samples = [{"source": s, "reference": t, "translation": h}
               for (s, t), h in list(zip(held_out, hypotheses))[:5]]
    training.write_metrics(wd, {
        "valid": scores,
        "samples": samples,
        "data": {"spec": data_spec, "train_pairs": len(train_pairs),
                 "valid_pairs": len(valid_pairs), **train_stats.result()},
        "config": {"preset": preset_name, **config.__dict__, "vocab_size": tokenizer.vocab_size},
        "train_seconds": round(train_seconds, 1),
    })
    return scores
