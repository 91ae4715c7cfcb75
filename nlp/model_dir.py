"""A translation model directory: what `tfx-convert-nmt` writes and ``--init-from`` reads.

Layout (a converted OPUS-MT model, or any ``Seq2SeqTransformer`` with its tokenizer)::

    DIR/model.keras     the Keras model (``keras.saving.load_model`` after ``import nlp``)
    DIR/model.json      how it decodes (`nlp.decoding.DecodingSettings`) and where it came from
    DIR/source.spm, DIR/target.spm, DIR/vocab.json (Marian), or DIR/tokenizer.model
    DIR/export/         the translator SavedModel (`nlp.export.export_translator`)

`write_model_dir` writes it into a temporary directory beside ``DIR`` and renames it into
place at the end, so a failure leaves nothing; an existing ``DIR`` is never replaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import keras

from nlp.decoding import DecodingSettings
from nlp.export import export_translator
from nlp.tokenizer import load_tokenizer
from tfx_transformer.training.h5files import NEW_DIR_MODE

__all__ = ["INFO_FILE", "MODEL_FILE", "read_model_dir", "write_model_dir"]

MODEL_FILE = "model.keras"
INFO_FILE = "model.json"


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
                "tokenizer_files": files}
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
    import nlp.model  # noqa: F401  (registers Seq2SeqTransformer)

    model = keras.saving.load_model(os.path.join(path, MODEL_FILE), compile=False)
    return model, load_tokenizer(path), DecodingSettings(**info["decoding"]), info
