"""A translation model directory: what `tfx-convert-nmt` writes and ``--init-from`` reads.

Layout (a converted OPUS-MT or NLLB model, or any ``Seq2SeqTransformer`` with its
tokenizer)::

    DIR/model.keras     the Keras model (``keras.saving.load_model`` after ``import nlp``)
    DIR/model.json      how it decodes (`nlp.search.decoding.DecodingSettings`; NLLB: the target
                        language forced first) and where it came from
    DIR/source.spm, DIR/target.spm, DIR/vocab.json (Marian), or
    DIR/sentencepiece.bpe.model, DIR/nllb_tokenizer.json (NLLB, with its language pair), or
    DIR/tokenizer.model
    DIR/export/         the translator SavedModel (`nlp.export.translator.export_translator`)

`write_model_dir` writes it into a temporary directory beside ``DIR`` and renames it into
place at the end, so a failure leaves nothing; an existing ``DIR`` is never replaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, NamedTuple

import keras

from nlp.export.translator import export_translator
from nlp.search.decoding import DecodingSettings
from nlp.text.nllb_tokenizer import language_pair
from nlp.text.tokenizer import load_tokenizer
from tfx_transformer.training.workdir import NEW_DIR_MODE

__all__ = ["FINE_TUNE_PEAK", "INFO_FILE", "MODEL_FILE", "Initial", "fine_tuning",
           "read_model_dir", "workdir_tokenizer", "write_model_dir"]

MODEL_FILE = "model.keras"
INFO_FILE = "model.json"
# Fine-tuning a trained model (--init-from): the learning rate's peak; the Noam schedule of a
# model trained from nothing peaks 14x higher at d 512 (warm-up 4000).
FINE_TUNE_PEAK = 5e-5


def write_model_dir(path: str | os.PathLike, model, tokenizer, decoding: DecodingSettings,
                    source: str) -> str:
    """Writes the model directory ``path`` (which must not exist); returns it."""
    out = os.path.abspath(os.fspath(path))
    if os.path.exists(out):
        raise ValueError(f"{path}: already exists; choose a new directory (nothing in it is "
                         "replaced)")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(tmp, NEW_DIR_MODE)
    try:
        model.save(os.path.join(tmp, MODEL_FILE))
        files = tokenizer.save(tmp)
        info = {"source": source, "decoding": dataclasses.asdict(decoding),
                "tokenizer_files": files, **language_pair(tokenizer)}
        with open(os.path.join(tmp, INFO_FILE), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
        export_translator(model, tokenizer, os.path.join(tmp, "export"), decoding)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return os.fspath(path)


def read_model_dir(path: str | os.PathLike):
    """``(model, tokenizer, decoding, info)`` of a model directory.

    Raises:
        ValueError: ``path`` is no model directory; the message says what it lacks.
    """
    path = os.fspath(path)
    for name in (MODEL_FILE, INFO_FILE):
        if not os.path.isfile(os.path.join(path, name)):
            raise ValueError(f"{path}: no {name} (a model directory of tfx-convert-nmt is "
                             "expected)")
    with open(os.path.join(path, INFO_FILE), encoding="utf-8") as f:
        info = json.load(f)
    model = keras.saving.load_model(os.path.join(path, MODEL_FILE), compile=False)
    return model, load_tokenizer(path), DecodingSettings(**info["decoding"]), info


class Initial(NamedTuple):
    """What a fine-tuning run starts from: the model directory ``path`` and its contents."""

    path: str
    model: Any
    tokenizer: Any
    tokenizer_files: tuple[str, ...]


def fine_tuning(config, path: str | os.PathLike, log=print):
    """``(config, Initial)``: ``config`` (an `nlp.config.NMTConfig`) with the model's shape,
    its decoding (the beam width of ``config`` where it is not the default) and its learning
    rate scaled to peak at `FINE_TUNE_PEAK`; and the model directory ``path`` read."""
    model, tokenizer, decoding, info = read_model_dir(path)
    shape = dict(num_encoder_layers=model.num_encoder_layers,
                 num_decoder_layers=model.num_decoder_layers, d_model=model.d_model,
                 num_heads=model.num_heads, ffn_dim=model.ffn_dim,
                 vocab_size=model.vocab_size, max_positions=model.max_positions)
    if config.decoding.beam_size != DecodingSettings().beam_size:  # --beam given
        decoding = dataclasses.replace(decoding, beam_size=config.decoding.beam_size)
    peak = config.lr_scale * model.d_model**-0.5 * config.warmup_steps**-0.5
    config = dataclasses.replace(config, **shape,
                                 max_length=min(config.max_length, model.max_positions),
                                 lr_scale=config.lr_scale * FINE_TUNE_PEAK / peak,
                                 decoding=decoding)
    log(f"init: {path} ({model.count_params():,} parameters, its tokenizer and decoding); "
        f"learning rate peak {config.peak_learning_rate:.1e}")
    return config, Initial(os.fspath(path), model, tokenizer, tuple(info["tokenizer_files"]))


def workdir_tokenizer(initial: Initial, root: pathlib.Path, log=print):
    """The tokenizer of a fine-tuning run: its work directory's copy (a resumed run), or the
    model directory's, copied there now (each file moved into place whole)."""
    if all((root / name).exists() for name in initial.tokenizer_files):
        return load_tokenizer(root)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".init-tokenizer-", dir=root))
    try:
        for name in initial.tokenizer.save(tmp):
            os.replace(tmp / name, root / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"tokenizer: {', '.join(initial.tokenizer_files)} of {initial.path}")
    return initial.tokenizer
