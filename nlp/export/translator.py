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
decoding settings, the signatures and the vocabulary size (and an NLLB model's language pair,
``source_lang`` and ``target_lang``: the tokenizer adds the source language, the search forces
the target language, so clients send plain text).

This module writes exports; `nlp.export.load` reads them (`load_translator`, `Translator`,
`read_info`) and defines the signature and file names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import tensorflow as tf

from nlp.export.load import (
    FORMAT_VERSION,
    GREEDY,
    HYPOTHESES_KEY,
    INFO_FILE,
    INPUT_KEY,
    NBEST,
    OUTPUT_KEY,
    SCORES_KEY,
    SERVING,
)
from nlp.search.decoding import DecodingSettings, search
from nlp.text.nllb_tokenizer import language_pair
from nlp.text.tokenizer import Tokenizer
from tfx_transformer.saved_model import write_saved_model
from tfx_transformer.training.workdir import write_export_dir

__all__ = ["SOURCE_LENGTH_MULTIPLE", "export_translator", "make_translate_fn", "trace_translate_fn"]

SOURCE_LENGTH_MULTIPLE = 16  # with XLA, sources are padded to this so few shapes compile
_TEXT_SPEC = tf.TensorSpec([None], tf.string, name=INPUT_KEY)  # every signature's input


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
    (seconds each), and the compiled search is not faster (``experiments/nmt_decode.py``).

    Args:
        model: a ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        decoding: beam search for ``beam_size > 1``, else greedy search.
        max_source_length: longest source kept, eos included.
        jit_compile: XLA-compile the search loop.
        nbest: return the ``K = decoding.beam_size`` best hypotheses instead: ``text (N,) ->
            (hypotheses (N, K) tf.string, scores (N, K) float32)``, best first
            (`nlp.search.decoding.search` with ``nbest``).
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

    def run_search(source):  # XLA: finished sentences stay in the batch (static shapes)
        return search(model, source, decoding, nbest=nbest,
                      drop_finished=False if jit_compile else None)

    if jit_compile:
        run_search = tf.function(run_search, jit_compile=True, reduce_retracing=True)

    def translate(text):
        ids = tokenizer.tokenize(text)  # ragged (N, None)
        ids = ids[:, : max_source_length - 1]
        eos = tf.fill([tf.shape(text)[0], 1], tokenizer.source_eos_id)
        source = tf.concat([ids, eos], axis=1).to_tensor(default_value=tokenizer.source_pad_id)
        if jit_compile:
            length = tf.shape(source)[1]
            padded = -(-length // SOURCE_LENGTH_MULTIPLE) * SOURCE_LENGTH_MULTIPLE
            source = tf.pad(source, [[0, 0], [0, padded - length]],
                            constant_values=tokenizer.source_pad_id)
        if not nbest:
            return tokenizer.detokenize(run_search(source))
        ids, scores = run_search(source)  # (N, K, L), (N, K)
        shape = tf.shape(ids)
        texts = tokenizer.detokenize(tf.reshape(ids, [shape[0] * shape[1], shape[2]]))
        return tf.reshape(texts, shape[:2]), scores

    return translate


def trace_translate_fn(model, tokenizer: Tokenizer, decoding: DecodingSettings,
                       jit_compile: bool = False):
    """`make_translate_fn` as a `tf.function` of any batch of texts (``text (N,) tf.string``).

    It is traced once, at its first call, whatever the batch sizes that follow; a plain
    `tf.function` traces the whole search again for each new one. `export_translator` saves
    one given to it as the serving signature instead of tracing the same search again, so a
    run that evaluates with it and exports it traces its search once.
    """
    return tf.function(make_translate_fn(model, tokenizer, decoding, jit_compile=jit_compile),
                       input_signature=[_TEXT_SPEC], autograph=False)


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
        "convention": decoding.convention,
        "renormalize": decoding.renormalize,
        "forced_bos_id": decoding.forced_bos_id,
        "signatures": {SERVING: {"beam_size": decoding.beam_size},
                       GREEDY: {"beam_size": 1},
                       NBEST: {"beam_size": decoding.beam_size,
                               "output_keys": [HYPOTHESES_KEY, SCORES_KEY]}},
        "input_key": INPUT_KEY,
        "output_key": OUTPUT_KEY,
        "vocab_size": tokenizer.vocab_size,
        "target_vocab_size": tokenizer.target_vocab_size,
        **language_pair(tokenizer),
    }


def export_translator(model, tokenizer: Tokenizer, path: str | os.PathLike,
                      decoding: DecodingSettings, jit_compile: bool = False,
                      translate=None) -> str:
    """Writes the SavedModel (signatures ``SERVING``, ``GREEDY``, ``NBEST``) and
    ``translator.json``.

    The export is written to a temporary directory beside ``path`` and moved into place at the
    end (`tfx_transformer.training.workdir.write_export_dir`), so a failed export leaves
    the previous one as it was.

    Args:
        model: a trained ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        path: output directory (replaced if it exists).
        decoding: how ``SERVING`` and ``NBEST`` decode; ``GREEDY`` uses the same with
            ``beam_size=1``.
        jit_compile: XLA-compile the search loop (see ``make_translate_fn``).
        translate: ``trace_translate_fn(model, tokenizer, decoding, jit_compile)`` when the
            caller has one (it is saved as ``SERVING``); None: traced here.

    Returns:
        ``path`` as a string.
    """
    _check_decoding(decoding)

    def write(directory):
        text_spec = [_TEXT_SPEC]
        serve = _serving(translate if translate is not None else make_translate_fn(
            model, tokenizer, decoding, jit_compile=jit_compile))
        # With a beam of one, the two signatures are one function, traced once.
        greedy = serve if decoding.greedy() == decoding else _serving(
            make_translate_fn(model, tokenizer, decoding.greedy(), jit_compile=jit_compile))
        endpoints = [(SERVING, serve, text_spec), (GREEDY, greedy, text_spec)]
        translate_nbest = make_translate_fn(model, tokenizer, decoding, jit_compile=jit_compile,
                                            nbest=True)
        endpoints.append((NBEST, _serving_nbest(translate_nbest), text_spec))
        # The vocabulary lookups of a Marian tokenizer are resources the model does not hold.
        write_saved_model(directory, model, endpoints, resources=tokenizer.tables)
        with open(os.path.join(directory, INFO_FILE), "w", encoding="utf-8") as f:
            json.dump(_info(decoding, tokenizer), f, indent=2)

    return write_export_dir(path, write)
