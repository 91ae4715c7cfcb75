"""The exported translator: a SavedModel that maps raw strings to translated strings.

The tokenizer (tensorflow-text SentencePiece) and the search are inside the graph, so the
SavedModel runs in a process that has only ``tensorflow`` and ``tensorflow_text``::

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    translator = tf.saved_model.load("DIR/export")
    out = translator.signatures["serving_default"](text=tf.constant(["I have three apples."]))
    print(out["translation"].numpy()[0].decode())

Layout of ``DIR/export``: the SavedModel, with signatures ``serving_default`` (beam search as
``DecodingSettings`` say) and ``greedy`` (the same with ``beam_size=1``), both ``text`` (N,)
tf.string → ``translation`` (N,) tf.string; and ``translator.json``, which records the
decoding settings, the signatures and the vocabulary size. Exports written before
``translator.json`` existed have ``beam_size.txt`` instead (the width of ``serving_default``);
`load_translator` reads both.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable

import keras
import tensorflow as tf

from nlp.decoding import DecodingSettings, search
from nlp.tokenizer import Tokenizer

__all__ = [
    "GREEDY",
    "INFO_FILE",
    "INPUT_KEY",
    "NotATranslatorError",
    "OUTPUT_KEY",
    "SERVING",
    "export_translator",
    "load_translator",
    "make_translate_fn",
    "read_info",
]

SERVING = "serving_default"  # beam search with the exported `beam_size`
GREEDY = "greedy"  # greedy search
INPUT_KEY = "text"  # signature input: tf.string (N,)
OUTPUT_KEY = "translation"  # signature output: tf.string (N,)
INFO_FILE = "translator.json"
LEGACY_BEAM_FILE = "beam_size.txt"  # what exports had before INFO_FILE
FORMAT_VERSION = 1
SOURCE_LENGTH_MULTIPLE = 16  # with XLA, sources are padded to this so few shapes compile
DETECTOR_FILE = "classes.json"  # what a detector export has (vision.export.CLASSES_FILE)


class NotATranslatorError(ValueError):
    """``path`` holds no exported translator; ``reason`` says what is there instead.

    ``str(error)`` is ``"PATH REASON"``, e.g. "runs/detr/export is a detector export (has
    classes.json), not a translator"; a script puts its flag in front: ``f"--model {error}"``.

    Attributes:
        path: the directory that was given.
        reason: what it is, or what it lacks.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path} {reason}")


def _check_decoding(decoding) -> None:
    if not isinstance(decoding, DecodingSettings):
        raise TypeError("`decoding` must be a DecodingSettings. "
                        f"Received: decoding={decoding!r}")


def make_translate_fn(model, tokenizer: Tokenizer, decoding: DecodingSettings,
                      max_source_length: int | None = None,
                      jit_compile: bool = True) -> Callable[[tf.Tensor], tf.Tensor]:
    """``text (N,) tf.string -> (N,) tf.string``, tokenization and decoding in one graph.

    Sources longer than ``max_source_length`` tokens (default: what the model's position
    encoding allows after ``decoding.extra_length`` decoding steps) are truncated, so any input
    translates; an empty string translates to (usually) an empty string.

    With ``jit_compile`` the search loop is XLA-compiled (tokenization stays outside XLA);
    sources are padded to a multiple of 16 tokens so that few shapes compile. Padding changes
    nothing: it is masked, and each sentence decodes at most its own source length (eos
    included) + ``extra_length`` tokens, so a sentence translates the same alone and in any
    batch.

    Args:
        model: a ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        decoding: beam search for ``beam_size > 1``, else greedy search.
        max_source_length: longest source kept, eos included.
        jit_compile: XLA-compile the search loop.
    """
    _check_decoding(decoding)
    if max_source_length is None:
        max_source_length = model.max_positions - decoding.extra_length - SOURCE_LENGTH_MULTIPLE
    if max_source_length < 2:
        raise ValueError(
            "`max_source_length` must be >= 2 (eos and one token); the model's "
            f"`max_positions` ({model.max_positions}) leaves no room after `extra_length` "
            f"({decoding.extra_length}). Received: max_source_length={max_source_length}"
        )

    def run_search(source):
        return search(model, source, decoding)

    if jit_compile:
        run_search = tf.function(run_search, jit_compile=True, reduce_retracing=True)

    def translate(text):
        ids = tokenizer.tokenize(text)  # ragged (N, None)
        ids = ids[:, : max_source_length - 1]
        eos = tf.fill([tf.shape(text)[0], 1], tokenizer.eos_id)
        source = tf.concat([ids, eos], axis=1).to_tensor(default_value=tokenizer.pad_id)
        if jit_compile:
            length = tf.shape(source)[1]
            padded = -(-length // SOURCE_LENGTH_MULTIPLE) * SOURCE_LENGTH_MULTIPLE
            source = tf.pad(source, [[0, 0], [0, padded - length]])
        return tokenizer.detokenize(run_search(source))

    return translate


def _serving(translate):
    def serve(text):
        return {OUTPUT_KEY: translate(text)}

    return serve


def _info(decoding: DecodingSettings, tokenizer: Tokenizer) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "beam_size": decoding.beam_size,
        "length_penalty": decoding.length_penalty,
        "extra_length": decoding.extra_length,
        "signatures": {SERVING: {"beam_size": decoding.beam_size},
                       GREEDY: {"beam_size": 1}},
        "input_key": INPUT_KEY,
        "output_key": OUTPUT_KEY,
        "vocab_size": tokenizer.vocab_size,
    }


def _replace_dir(tmp: str, path: str) -> None:
    """Moves directory ``tmp`` to ``path``; a directory already at ``path`` is kept until then.

    If the move fails, the previous directory is put back (or, should that fail too, left in a
    ``.export-old-*`` directory beside ``path``: never deleted).
    """
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=".export-old-", dir=os.path.dirname(tmp))
        os.replace(path, os.path.join(old, "export"))
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(os.path.join(old, "export"), path)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_translator(model, tokenizer: Tokenizer, path: str | os.PathLike,
                      decoding: DecodingSettings, jit_compile: bool = True) -> str:
    """Writes the SavedModel (signatures ``SERVING`` and ``GREEDY``) and ``translator.json``.

    The export is written to a temporary directory beside ``path`` and moved into place at the
    end, so a failed export never leaves a half-written directory in place of a good one.

    Args:
        model: a trained ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        path: output directory (replaced if it exists).
        decoding: how ``SERVING`` decodes; ``GREEDY`` uses the same with ``beam_size=1``.
        jit_compile: XLA-compile the search loop (see ``make_translate_fn``).

    Returns:
        ``path`` as a string.
    """
    _check_decoding(decoding)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        for name, settings in ((SERVING, decoding), (GREEDY, decoding.greedy())):
            translate = make_translate_fn(model, tokenizer, settings, jit_compile=jit_compile)
            archive.add_endpoint(
                name=name,
                fn=_serving(translate),
                input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)],
            )
        archive.write_out(tmp, verbose=False)
        with open(os.path.join(tmp, INFO_FILE), "w", encoding="utf-8") as f:
            json.dump(_info(decoding, tokenizer), f, indent=2)
        _replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _check_export_dir(path: str) -> None:
    """Raises `NotATranslatorError` unless ``path`` is a SavedModel directory of no detector."""
    expected = "(expected DIR/export of a trained translator)"
    if not os.path.exists(path):
        raise NotATranslatorError(path, f"does not exist {expected}")
    if not os.path.isdir(path):
        raise NotATranslatorError(path, f"is a file, not an export directory {expected}")
    if os.path.isfile(os.path.join(path, DETECTOR_FILE)):
        raise NotATranslatorError(path, f"is a detector export (has {DETECTOR_FILE}), not a "
                                        "translator: use scripts/detect.py")
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        hint = expected
        if os.path.isfile(os.path.join(path, "export", "saved_model.pb")):
            hint = f"(a work directory? its export is {os.path.join(path, 'export')})"
        raise NotATranslatorError(path, f"has no saved_model.pb, so it is no export {hint}")


def read_info(path: str | os.PathLike) -> dict:
    """The export's ``translator.json`` as a dict.

    For an export written before ``translator.json`` existed, the same keys are filled from
    ``beam_size.txt`` (``None`` where that file does not say: ``length_penalty``,
    ``extra_length``, ``vocab_size``; ``beam_size`` too when there is no such file).

    Raises:
        NotATranslatorError: ``path`` is missing, a file, a detector export or no SavedModel.
        ValueError: its info file is unreadable.
    """
    path = os.fspath(path)
    _check_export_dir(path)
    info_file = os.path.join(path, INFO_FILE)
    if os.path.isfile(info_file):
        try:
            with open(info_file, encoding="utf-8") as f:
                info = json.load(f)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{info_file} is not valid JSON: {error}") from None
        if not isinstance(info, dict) or not isinstance(info.get("beam_size"), int):
            raise ValueError(f"{info_file} must hold a JSON object with an integer "
                             f"'beam_size'. Received: {json.dumps(info)[:80]}")
        return info
    legacy = os.path.join(path, LEGACY_BEAM_FILE)
    beam_size = None
    if os.path.isfile(legacy):
        with open(legacy, encoding="utf-8") as f:
            text = f.read().strip()
        try:
            beam_size = int(text)
        except ValueError:
            raise ValueError(f"{legacy} must hold one integer. Received: {text[:40]!r}") from None
    return {
        "format_version": 0,
        "beam_size": beam_size,
        "length_penalty": None,
        "extra_length": None,
        "signatures": {SERVING: {"beam_size": beam_size}, GREEDY: {"beam_size": 1}},
        "input_key": INPUT_KEY,
        "output_key": OUTPUT_KEY,
        "vocab_size": None,
    }


def _signature(path: str, name: str, input_key: str, output_key: str):
    """The signature ``name`` of the SavedModel at ``path``, checked to map strings to strings."""
    try:
        signatures = tf.saved_model.load(path).signatures
    except (OSError, ValueError, tf.errors.OpError) as error:
        reason = " ".join(str(error).split())[:200]
        raise NotATranslatorError(path, f"is not a loadable SavedModel: {reason}") from None
    except Exception as error:  # e.g. protobuf's DecodeError for a corrupt saved_model.pb
        if "DecodeError" not in type(error).__name__:
            raise
        raise NotATranslatorError(path, "has a corrupt saved_model.pb") from None
    if name not in signatures:
        raise NotATranslatorError(path, f"has no {name!r} signature (it has "
                                        f"{sorted(signatures)}), so it is no translator export")
    serve = signatures[name]
    inputs = serve.structured_input_signature[1]
    if input_key not in inputs or inputs[input_key].dtype != tf.string:
        raise NotATranslatorError(
            path, f"has no {input_key!r} signature input (its {name!r} takes "
                  f"{sorted(inputs)}), so it is no translator export")
    if output_key not in serve.structured_outputs:
        raise NotATranslatorError(
            path, f"has no {output_key!r} signature output (its {name!r} returns "
                  f"{sorted(serve.structured_outputs)}), so it is no translator export")
    return serve


def load_translator(path: str | os.PathLike,
                    beam_size: int | None = None) -> Callable[[tf.Tensor], tf.Tensor]:
    """Loads an exported translator; returns ``text (N,) tf.string -> (N,) tf.string``.

    Args:
        path: the export directory.
        beam_size: ``None`` or the exported width: ``SERVING`` (beam search); 1: ``GREEDY``.

    Raises:
        NotATranslatorError: ``path`` is no translator export (missing, a detector export, a
            SavedModel without a ``text`` → ``translation`` signature...); names what it is.
        ValueError: it does not decode with ``beam_size``, or its info file is unreadable.
    """
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    if beam_size is not None and (isinstance(beam_size, bool) or not isinstance(beam_size, int)
                                  or beam_size < 1):
        raise ValueError(f"`beam_size` must be an integer >= 1. Received: beam_size={beam_size!r}")
    path = os.fspath(path)
    info = read_info(path)
    exported = info["beam_size"]
    if beam_size not in (None, 1, exported):
        raise ValueError(f"beam_size={beam_size}: this export decodes with beam_size={exported} "
                         f"({SERVING}) or 1 ({GREEDY}).")
    name = GREEDY if beam_size == 1 and exported != 1 else SERVING
    input_key, output_key = info.get("input_key", INPUT_KEY), info.get("output_key", OUTPUT_KEY)
    serve = _signature(path, name, input_key, output_key)
    return lambda text: serve(**{input_key: text})[output_key]
