"""Loading an exported translator: `load_translator`, `Translator` and `read_info`.

What `nlp.export.translator.export_translator` writes (``DIR/export``): a SavedModel with the
signatures ``serving_default`` (`SERVING`, beam search), ``greedy`` (`GREEDY`) and
``translate_nbest`` (`NBEST`), and ``translator.json`` (`INFO_FILE`). The names of the signatures,
their inputs and outputs are defined here, for the writer and the readers alike. This module needs
only ``tensorflow`` and ``tensorflow_text`` (no Keras model is built).

Example:
    >>> translator = load_translator("runs/nmt/export")
    >>> translator(tf.constant(["I have three apples."])).numpy()
    >>> hypotheses, scores = translator.translate_nbest(tf.constant(["Good morning."]))
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

__all__ = [
    "DETECTOR_FILE",
    "FORMAT_VERSION",
    "GREEDY",
    "HYPOTHESES_KEY",
    "INFO_FILE",
    "INPUT_KEY",
    "NBEST",
    "NotATranslatorError",
    "describe_export",
    "OUTPUT_KEY",
    "SCORES_KEY",
    "SERVING",
    "Translator",
    "check_export_dir",
    "load_translator",
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
FORMAT_VERSION = 2  # 2: with the NBEST signature
DETECTOR_FILE = "classes.json"  # what a detector export has (vision.export.load.CLASSES_FILE)


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


def check_export_dir(path: str) -> None:
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


def describe_export(path: str | os.PathLike) -> dict:
    """What the server's page shows of a translator export (``beam_size``, and an NLLB
    model's built-in ``source_lang`` and ``target_lang``), read without loading it (the
    ``translator`` entry of `tfx_transformer.applications.EXPORTS`)."""
    info = read_info(path)
    return {"beam_size": info["beam_size"],
            **{key: info[key] for key in ("source_lang", "target_lang") if key in info}}


def read_info(path: str | os.PathLike) -> dict:
    """The export's ``translator.json`` as a dict.

    Raises:
        NotATranslatorError: ``path`` is missing, a file, a detector export, no SavedModel, or
            has no ``translator.json``.
        ValueError: its ``translator.json`` is not valid JSON, or lacks an integer
            ``beam_size`` or the ``NBEST`` signature's size.
    """
    path = os.fspath(path)
    check_export_dir(path)
    info_file = os.path.join(path, INFO_FILE)
    if not os.path.isfile(info_file):
        raise NotATranslatorError(path, f"has no {INFO_FILE}, so it is no translator export "
                                        "(expected DIR/export of a trained translator)")
    try:
        with open(info_file, encoding="utf-8") as f:
            info = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{info_file} is not valid JSON: {error}") from None
    if not isinstance(info, dict) or not _is_size(info.get("beam_size")):
        raise ValueError(f"{info_file} must hold a JSON object with an integer "
                         f"'beam_size' >= 1. Received: {json.dumps(info)[:80]}")
    if _nbest_entry(info) is None:
        raise ValueError(f"{info_file} must list the {NBEST!r} signature with an integer "
                         f"'beam_size' >= 1 under 'signatures'. Received: "
                         f"signatures={json.dumps(info.get('signatures'))[:80]}")
    return info


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _nbest_entry(info: dict) -> int | None:
    signatures = info.get("signatures")
    entry = signatures.get(NBEST) if isinstance(signatures, dict) else None
    size = entry.get("beam_size") if isinstance(entry, dict) else None
    return size if _is_size(size) else None


def nbest_size(info: dict) -> int:
    """``K`` of the export's ``NBEST`` signature as ``info`` (`read_info`) records it.

    Raises:
        ValueError: ``info`` records no such size (it is no `read_info` of an export).
    """
    size = _nbest_entry(info)
    if size is None:
        raise ValueError(f"`info` records no {NBEST!r} signature size under 'signatures'. "
                         f"Received: signatures={info.get('signatures')!r}")
    return size


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
        beam_size: the width ``translator(text)`` decodes with.
        nbest_size: ``K`` of ``translate_nbest`` (the exported beam size).
    """

    def __init__(self, path: str, info: dict, beam_size: int, saved_model, serve, nbest):
        self.path = path
        self.info = info
        self.beam_size = beam_size
        self.nbest_size = nbest_size(info)
        self._saved_model = saved_model  # keeps the signatures' variables alive
        self._serve = serve
        self._nbest = nbest

    def __call__(self, text: tf.Tensor) -> tf.Tensor:
        return self._serve(**{INPUT_KEY: text})[OUTPUT_KEY]

    def translate_nbest(self, text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The ``K = nbest_size`` best hypotheses of every sentence, best first.

        The export's beam search (``SERVING``'s, also when the translator was loaded for
        greedy search); the first hypothesis is ``SERVING``'s translation.

        Args:
            text: ``(N,)`` tf.string.

        Returns:
            ``hypotheses`` ``(N, K)`` tf.string and ``scores`` ``(N, K)`` float32 (the
            length-penalized log-probabilities, descending).
        """
        out = self._nbest(**{INPUT_KEY: text})
        return out[HYPOTHESES_KEY], out[SCORES_KEY]


def load_translator(path: str | os.PathLike, beam_size: int | None = None) -> Translator:
    """Loads an exported translator: a `Translator`, ``text (N,) tf.string -> (N,) tf.string``.

    Args:
        path: the export directory.
        beam_size: ``None`` or the exported width: ``SERVING`` (beam search); 1: ``GREEDY``.

    Raises:
        NotATranslatorError: ``path`` is no translator export (missing, a detector export, a
            SavedModel without the ``text`` → ``translation`` and n-best signatures...); names
            what it is.
        ValueError: it does not decode with ``beam_size``, or its info file is unreadable.
    """
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    if beam_size is not None and not _is_size(beam_size):
        raise ValueError(f"`beam_size` must be an integer >= 1. Received: beam_size={beam_size!r}")
    path = os.fspath(path)
    info = read_info(path)
    exported = info["beam_size"]
    if beam_size not in (None, 1, exported):
        raise ValueError(f"beam_size={beam_size}: this export decodes with beam_size={exported} "
                         f"({SERVING}) or 1 ({GREEDY}).")
    name = GREEDY if beam_size == 1 and exported != 1 else SERVING
    saved_model = _load(path)
    signatures = saved_model.signatures
    serve = _signature(path, signatures, name, INPUT_KEY, [OUTPUT_KEY])
    nbest = _signature(path, signatures, NBEST, INPUT_KEY, [HYPOTHESES_KEY, SCORES_KEY])
    return Translator(path, info, exported if beam_size is None else beam_size, saved_model,
                      serve, nbest)
