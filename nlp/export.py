"""The exported translator: a SavedModel that maps raw strings to translated strings.

The tokenizer (tensorflow-text SentencePiece) and the search are inside the graph, so the
SavedModel runs in a process that has only ``tensorflow`` and ``tensorflow_text``::

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    translator = tf.saved_model.load("DIR/export")
    out = translator.signatures["serving_default"](text=tf.constant(["I have three apples."]))
    print(out["translation"].numpy()[0].decode())
    nbest = translator.signatures["translate_nbest"](text=tf.constant(["I have three apples."]))
    print(nbest["hypotheses"].numpy()[0], nbest["scores"].numpy()[0])

Layout of ``DIR/export``: the SavedModel, with signatures ``serving_default`` (beam search as
``DecodingSettings`` say) and ``greedy`` (the same with ``beam_size=1``), both ``text`` (N,)
tf.string → ``translation`` (N,) tf.string, and ``translate_nbest``: ``text`` (N,) →
``hypotheses`` (N, K) tf.string and ``scores`` (N, K) float32, the ``K = beam_size`` best
hypotheses of the beam search, best first, with their length-penalized log-probabilities
(the first is ``serving_default``'s translation); and ``translator.json``, which records the
decoding settings, the signatures and the vocabulary size. Exports written before
``translator.json`` existed have ``beam_size.txt`` instead (the width of ``serving_default``);
`load_translator` reads both. Exports written before ``translate_nbest`` existed load and
translate as before; only asking them for n-best lists is an error.
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
    "HYPOTHESES_KEY",
    "INFO_FILE",
    "INPUT_KEY",
    "NBEST",
    "NotATranslatorError",
    "OUTPUT_KEY",
    "SCORES_KEY",
    "SERVING",
    "Translator",
    "export_translator",
    "load_translator",
    "make_translate_fn",
    "nbest_size",
    "read_info",
]

SERVING = "serving_default"  # beam search with the exported `beam_size`
GREEDY = "greedy"  # greedy search
NBEST = "translate_nbest"  # the `beam_size` best hypotheses of SERVING's search, with scores
INPUT_KEY = "text"  # signature input: tf.string (N,)
OUTPUT_KEY = "translation"  # signature output: tf.string (N,)
HYPOTHESES_KEY = "hypotheses"  # NBEST output: tf.string (N, K), best first
SCORES_KEY = "scores"  # NBEST output: float32 (N, K), descending
INFO_FILE = "translator.json"
LEGACY_BEAM_FILE = "beam_size.txt"  # what exports had before INFO_FILE
FORMAT_VERSION = 2  # 2: with the NBEST signature
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
                      max_source_length: int | None = None, jit_compile: bool = False,
                      nbest: bool = False) -> Callable[[tf.Tensor], tf.Tensor]:
    """``text (N,) tf.string -> (N,) tf.string``, tokenization and decoding in one graph.

    Sources longer than ``max_source_length`` tokens (default: what the model's position
    encoding allows after ``decoding.extra_length`` decoding steps) are truncated, so any input
    translates; an empty string translates to (usually) an empty string.

    With ``jit_compile`` the search loop is XLA-compiled (tokenization stays outside XLA);
    sources are padded to a multiple of 16 tokens so that few shapes compile. Padding changes
    nothing: it is masked, and each sentence decodes at most its own source length (eos
    included) + ``extra_length`` tokens, so a sentence translates the same alone and in any
    batch. On a CPU, XLA does not pay for the tiny model: each batch shape compiles anew
    (seconds each), and the compiled search is not faster (``benchmarks/nmt_decode.py``).

    Args:
        model: a ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        decoding: beam search for ``beam_size > 1``, else greedy search.
        max_source_length: longest source kept, eos included.
        jit_compile: XLA-compile the search loop.
        nbest: return the ``K = decoding.beam_size`` best hypotheses instead: ``text (N,) ->
            (hypotheses (N, K) tf.string, scores (N, K) float32)``, best first
            (`nlp.decoding.search` with ``nbest``).
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
        return search(model, source, decoding, nbest=nbest)

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
        if not nbest:
            return tokenizer.detokenize(run_search(source))
        ids, scores = run_search(source)  # (N, K, L), (N, K)
        shape = tf.shape(ids)
        texts = tokenizer.detokenize(tf.reshape(ids, [shape[0] * shape[1], shape[2]]))
        return tf.reshape(texts, shape[:2]), scores

    return translate


def _serving(translate):
    def serve(text):
        return {OUTPUT_KEY: translate(text)}

    return serve


def _serving_nbest(translate_nbest):
    def serve(text):
        hypotheses, scores = translate_nbest(text)
        return {HYPOTHESES_KEY: hypotheses, SCORES_KEY: scores}

    return serve


def _info(decoding: DecodingSettings, tokenizer: Tokenizer) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "beam_size": decoding.beam_size,
        "length_penalty": decoding.length_penalty,
        "extra_length": decoding.extra_length,
        "signatures": {SERVING: {"beam_size": decoding.beam_size},
                       GREEDY: {"beam_size": 1},
                       NBEST: {"beam_size": decoding.beam_size,
                               "output_keys": [HYPOTHESES_KEY, SCORES_KEY]}},
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
                      decoding: DecodingSettings, jit_compile: bool = False) -> str:
    """Writes the SavedModel (signatures ``SERVING``, ``GREEDY``, ``NBEST``) and
    ``translator.json``.

    The export is written to a temporary directory beside ``path`` and moved into place at the
    end, so a failed export never leaves a half-written directory in place of a good one.

    Args:
        model: a trained ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        path: output directory (replaced if it exists).
        decoding: how ``SERVING`` and ``NBEST`` decode; ``GREEDY`` uses the same with
            ``beam_size=1``.
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
        text_spec = [tf.TensorSpec([None], tf.string, name=INPUT_KEY)]
        for name, settings in ((SERVING, decoding), (GREEDY, decoding.greedy())):
            translate = make_translate_fn(model, tokenizer, settings, jit_compile=jit_compile)
            archive.add_endpoint(name=name, fn=_serving(translate), input_signature=text_spec)
        translate_nbest = make_translate_fn(model, tokenizer, decoding, jit_compile=jit_compile,
                                            nbest=True)
        archive.add_endpoint(name=NBEST, fn=_serving_nbest(translate_nbest),
                             input_signature=text_spec)
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


def nbest_size(info: dict) -> int | None:
    """``K`` of the export's ``NBEST`` signature as ``info`` (`read_info`) records it, or
    ``None`` for an export written before that signature existed."""
    signatures = info.get("signatures")
    entry = signatures.get(NBEST) if isinstance(signatures, dict) else None
    size = entry.get("beam_size") if isinstance(entry, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _load(path: str):
    """The SavedModel at ``path``, loaded (`NotATranslatorError` if it cannot be)."""
    try:
        return tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as error:
        reason = " ".join(str(error).split())[:200]
        raise NotATranslatorError(path, f"is not a loadable SavedModel: {reason}") from None
    except Exception as error:  # e.g. protobuf's DecodeError for a corrupt saved_model.pb
        if "DecodeError" not in type(error).__name__:
            raise
        raise NotATranslatorError(path, "has a corrupt saved_model.pb") from None


def _signature(path: str, signatures, name: str, input_key: str, output_keys: list[str]):
    """The signature ``name``, checked to take strings ``input_key`` and return ``output_keys``."""
    if name not in signatures:
        raise NotATranslatorError(path, f"has no {name!r} signature (it has "
                                        f"{sorted(signatures)}), so it is no translator export")
    serve = signatures[name]
    inputs = serve.structured_input_signature[1]
    if input_key not in inputs or inputs[input_key].dtype != tf.string:
        raise NotATranslatorError(
            path, f"has no {input_key!r} signature input (its {name!r} takes "
                  f"{sorted(inputs)}), so it is no translator export")
    for output_key in output_keys:
        if output_key not in serve.structured_outputs:
            raise NotATranslatorError(
                path, f"has no {output_key!r} signature output (its {name!r} returns "
                      f"{sorted(serve.structured_outputs)}), so it is no translator export")
    return serve


class Translator:
    """A loaded translator export (`load_translator`).

    Call it as ``translator(text)``: ``text (N,) tf.string -> (N,) tf.string``, with the
    search it was loaded for. ``translator.translate_nbest(text)`` returns the export's n-best
    lists.

    Attributes:
        path: the export directory.
        info: its `read_info`.
        beam_size: the width ``translator(text)`` decodes with (``None``: the default
            signature of an export that does not say).
        nbest_size: ``K`` of ``translate_nbest`` (the exported beam size), or ``None`` for an
            export written before n-best lists existed.
    """

    def __init__(self, path: str, info: dict, beam_size: int | None, saved_model, serve,
                 nbest):
        self.path = path
        self.info = info
        self.beam_size = beam_size
        self.nbest_size = nbest_size(info) if nbest is not None else None
        self._saved_model = saved_model  # keeps the signatures' variables alive
        self._serve = serve
        self._nbest = nbest
        self._input_key = info.get("input_key", INPUT_KEY)
        self._output_key = info.get("output_key", OUTPUT_KEY)

    def __call__(self, text: tf.Tensor) -> tf.Tensor:
        return self._serve(**{self._input_key: text})[self._output_key]

    def translate_nbest(self, text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The ``K = nbest_size`` best hypotheses of every sentence, best first.

        The export's beam search (``SERVING``'s, also when the translator was loaded for
        greedy search); the first hypothesis is ``SERVING``'s translation.

        Args:
            text: ``(N,)`` tf.string.

        Returns:
            ``hypotheses`` ``(N, K)`` tf.string and ``scores`` ``(N, K)`` float32 (the
            length-penalized log-probabilities, descending).

        Raises:
            ValueError: the export has no ``NBEST`` signature (written before n-best lists
                existed: export the model again to get them).
        """
        if self._nbest is None:
            raise ValueError(
                f"{self.path} has no {NBEST!r} signature: it was exported before n-best lists "
                "existed (it translates as before); export the model again "
                "(nlp.export.export_translator) to get them")
        out = self._nbest(**{self._input_key: text})
        return out[HYPOTHESES_KEY], out[SCORES_KEY]


def load_translator(path: str | os.PathLike, beam_size: int | None = None) -> Translator:
    """Loads an exported translator: a `Translator`, ``text (N,) tf.string -> (N,) tf.string``.

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
    saved_model = _load(path)
    signatures = saved_model.signatures
    serve = _signature(path, signatures, name, input_key, [output_key])
    nbest = None
    if nbest_size(info) is not None and NBEST in signatures:
        nbest = _signature(path, signatures, NBEST, input_key, [HYPOTHESES_KEY, SCORES_KEY])
    return Translator(path, info, exported if beam_size is None else beam_size, saved_model,
                      serve, nbest)
