"""SentencePiece tokenizer shared by source and target, usable in and out of the graph.

`Tokenizer` wraps the serialized model proto that `train_tokenizer` (`nlp.text.vocabulary`) writes:
in the graph through `tensorflow_text.SentencepieceTokenizer` (tf.data pipelines,
`tf.function`, SavedModel export — the proto bytes are embedded in the traced graph), and in
Python through `sentencepiece.SentencePieceProcessor`. Its special ids are those of
`nlp.text.special_ids`; the data pipeline and the export read them from a `Tokenizer`.

Example:

>>> path = train_tokenizer(["Ich habe zwölf Äpfel.", "I have twelve apples."], "/tmp/sp.model")
>>> tokenizer = Tokenizer.from_file(path)
>>> tokenizer.decode(tokenizer.encode("I have twelve apples."))
'I have twelve apples.'
"""

from __future__ import annotations

import os
from typing import Sequence

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from nlp.text.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["TOKENIZER_FILE", "Tokenizer", "load_tokenizer"]

TOKENIZER_FILE = "tokenizer.model"  # a trained run's tokenizer, in its work directory


class Tokenizer(tf.Module):
    """A SentencePiece tokenizer that works in Python, in tf.data and in exported graphs.

    In-graph calls (`tokenize`, `detokenize`) put the SentencePiece op, with the model proto as
    an attribute, into the graph being traced: a tf.data pipeline or a `tf.function` of a
    `tf.Module` exported with `tf.saved_model.save` carries the model with it, and the
    SavedModel runs where only `tensorflow` and `tensorflow_text` are installed.

    Args:
        model_proto: The serialized SentencePiece model (the bytes of a `.model` file).
        name: Name of the module.
    """

    def __init__(self, model_proto: bytes, name: str | None = None):
        super().__init__(name=name)
        if not isinstance(model_proto, bytes) or not model_proto:
            raise TypeError(
                "`model_proto` must be the non-empty bytes of a SentencePiece model. "
                f"Received: type={type(model_proto).__name__}"
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except RuntimeError as error:
            raise ValueError(f"`model_proto` is not a valid SentencePiece model: {error}") from None
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        found = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        if found != expected:
            raise ValueError(
                f"`model_proto` must use the special ids {expected}. Received: {found}"
            )
        self._model_proto = model_proto
        self._processor = processor

    def _sentencepiece(self) -> tf_text.SentencepieceTokenizer:
        # A new TF-Text tokenizer per call, never one kept from __init__: its model resource is
        # owned by the op's kernel, and an eager kernel dies whenever TensorFlow clears its
        # caches (`tf.random.set_seed`, `keras.utils.set_random_seed`), which would leave a kept
        # tokenizer pointing at a deleted resource. Built in a graph (tf.data, tf.function,
        # SavedModel signature), the op and its model proto are part of that graph and live with
        # it; built eagerly, the kernel comes from the eager cache while it lasts.
        return tf_text.SentencepieceTokenizer(model=self._model_proto, out_type=tf.int32)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads a tokenizer from a SentencePiece `.model` file.

        Raises:
            ValueError: If `path` does not exist, is a directory, is empty or is not a
                SentencePiece model with the special ids; the message names `path`.
        """
        path = os.fspath(path)
        if os.path.isdir(path):
            raise ValueError(f"Tokenizer model {path} is a directory, not a SentencePiece "
                             ".model file.")
        if not os.path.isfile(path):
            raise ValueError(f"Tokenizer model file not found. Received: path={path!r}")
        with open(path, "rb") as f:
            proto = f.read()
        if not proto:
            raise ValueError(f"Tokenizer model {path} is empty (0 bytes), not a SentencePiece "
                             "model.")
        try:
            return cls(proto)
        except ValueError as error:
            raise ValueError(f"Tokenizer model {path}: {error}") from None

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model."""
        return self._model_proto

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._processor.get_piece_size()

    @property
    def target_vocab_size(self) -> int:
        """The same as ``vocab_size``: one vocabulary for both sides."""
        return self.vocab_size

    @property
    def tables(self) -> tuple:
        """The lookup tables an export must track: none."""
        return ()

    def save(self, directory: str | os.PathLike) -> list[str]:
        """Writes ``tokenizer.model`` into ``directory``; returns its name."""
        with open(os.path.join(os.fspath(directory), TOKENIZER_FILE), "wb") as f:
            f.write(self._model_proto)
        return [TOKENIZER_FILE]

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def source_pad_id(self) -> int:
        return PAD_ID

    @property
    def source_eos_id(self) -> int:
        return EOS_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor | tf.Tensor:
        """Tokenizes strings in the graph (no bos/eos added).

        Args:
            texts: tf.string, shape `()` or `(B,)`.

        Returns:
            int32 ids: a `(n,)` Tensor for a scalar input, else a `(B, None)` RaggedTensor.
        """
        return self._sentencepiece().tokenize(texts)

    def tokenize_target(self, texts: tf.Tensor) -> tf.RaggedTensor | tf.Tensor:
        """`tokenize`: sources and targets share the vocabulary."""
        return self.tokenize(texts)

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Turns ids back into strings in the graph; pad, bos and eos ids are dropped.

        Args:
            ids: int ids, a Tensor or RaggedTensor of shape `(n,)` or `(B, n)`.

        Returns:
            tf.string of shape `()` for `(n,)` ids, `(B,)` for `(B, n)` ids.
        """
        return self._sentencepiece().detokenize(tf.cast(ids, tf.int32))

    def encode(self, text: str) -> list[int]:
        """Tokenizes one Python string into ids (no bos/eos added)."""
        return self._processor.encode(text)

    def encode_target(self, text: str) -> list[int]:
        """`encode`: sources and targets share the vocabulary."""
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Turns ids into a Python string; pad, bos and eos ids are dropped."""
        return self._processor.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id (for attention plots)."""
        return self._processor.id_to_piece(int(token_id))


def load_tokenizer(directory: str | os.PathLike):
    """The tokenizer of a model directory: ``tokenizer.model`` (`Tokenizer`), an OPUS-MT
    folder's ``source.spm``, ``target.spm`` and ``vocab.json``
    (`nlp.text.marian_tokenizer.MarianTokenizer`), or a converted NLLB model's
    ``sentencepiece.bpe.model`` and ``nllb_tokenizer.json``
    (`nlp.text.nllb_tokenizer.NllbTokenizer`).

    Raises:
        ValueError: ``directory`` holds none; the message names what is missing.
    """
    from nlp.text.marian_tokenizer import MARIAN_FILES, MarianTokenizer
    from nlp.text.nllb_tokenizer import INFO_FILE as NLLB_INFO
    from nlp.text.nllb_tokenizer import NllbTokenizer

    directory = os.fspath(directory)
    path = os.path.join(directory, TOKENIZER_FILE)
    if os.path.isfile(path):
        return Tokenizer.from_file(path)
    if os.path.exists(os.path.join(directory, NLLB_INFO)):
        return NllbTokenizer.from_directory(directory)
    if any(os.path.exists(os.path.join(directory, name)) for name in MARIAN_FILES):
        return MarianTokenizer.from_directory(directory)
    raise ValueError(f"{directory} has no tokenizer: neither {TOKENIZER_FILE} nor "
                     f"{', '.join(MARIAN_FILES)} nor {NLLB_INFO}")
