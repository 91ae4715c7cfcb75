"""The exported translator: a SavedModel that maps raw strings to translated strings.

The tokenizer (tensorflow-text SentencePiece) and beam search are inside the graph, so the
SavedModel runs in a process that has only ``tensorflow`` and ``tensorflow_text``::

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    translator = tf.saved_model.load("DIR/export")
    out = translator.signatures["serving_default"](text=tf.constant(["I have three apples."]))
    print(out["translation"].numpy()[0].decode())
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf

from nlp.decoding import beam_search, greedy_search
from nlp.tokenizer import Tokenizer

__all__ = ["make_translate_fn", "export_translator"]


SOURCE_LENGTH_MULTIPLE = 16  # with XLA, sources are padded to this so few shapes compile


def make_translate_fn(model, tokenizer: Tokenizer, beam_size: int = 4, alpha: float = 0.6,
                      extra_length: int = 50, max_source_length: int | None = None,
                      jit_compile: bool = True):
    """``text (N,) tf.string -> (N,) tf.string``, tokenization and decoding in one graph.

    Sources longer than ``max_source_length`` tokens (default: what the model's position
    encoding allows after ``extra_length`` decoding steps) are truncated, so any input
    translates; an empty string translates to (usually) an empty string.

    With ``jit_compile`` the search loop is XLA-compiled (tokenization stays outside XLA);
    sources are padded to a multiple of 16 tokens so that few shapes compile. Padding is
    masked, so it changes nothing but the decoding length limit (``S + extra_length``).
    """
    if max_source_length is None:
        max_source_length = model.max_positions - extra_length - SOURCE_LENGTH_MULTIPLE

    def search(source):
        if beam_size > 1:
            return beam_search(model, source, beam_size=beam_size, alpha=alpha,
                               extra_length=extra_length)
        return greedy_search(model, source, extra_length=extra_length)

    if jit_compile:
        search = tf.function(search, jit_compile=True, reduce_retracing=True)

    def translate(text):
        ids = tokenizer.tokenize(text)  # ragged (N, None)
        ids = ids[:, : max_source_length - 1]
        eos = tf.fill([tf.shape(text)[0], 1], tokenizer.eos_id)
        source = tf.concat([ids, eos], axis=1).to_tensor(default_value=tokenizer.pad_id)
        if jit_compile:
            length = tf.shape(source)[1]
            padded = -(-length // SOURCE_LENGTH_MULTIPLE) * SOURCE_LENGTH_MULTIPLE
            source = tf.pad(source, [[0, 0], [0, padded - length]])
        return tokenizer.detokenize(search(source))

    return translate


def _serving(translate):
    def serve(text):
        return {"translation": translate(text)}

    return serve


def export_translator(model, tokenizer: Tokenizer, path: str | os.PathLike, beam_size: int = 4,
                      alpha: float = 0.6, extra_length: int = 50,
                      jit_compile: bool = True) -> str:
    """Writes the SavedModel: signature ``serving_default`` (``text`` → ``translation``, beam
    search of width ``beam_size``) and ``greedy`` (the same with greedy decoding).

    Args:
        model: a trained ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        path: output directory (replaced if it exists).
        beam_size: beam width (1 = greedy).
        alpha: GNMT length-penalty exponent.
        extra_length: decode at most source length + this many tokens.
        jit_compile: XLA-compile the search loop (see ``make_translate_fn``).

    Returns:
        ``path`` as a string.
    """
    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, width in (("serving_default", beam_size), ("greedy", 1)):
        translate = make_translate_fn(model, tokenizer, width, alpha, extra_length,
                                      jit_compile=jit_compile)
        archive.add_endpoint(
            name=name,
            fn=_serving(translate),
            input_signature=[tf.TensorSpec([None], tf.string, name="text")],
        )
    archive.write_out(str(path), verbose=False)
    with open(os.path.join(path, "beam_size.txt"), "w") as f:
        f.write(f"{beam_size}\n")
    return str(path)
