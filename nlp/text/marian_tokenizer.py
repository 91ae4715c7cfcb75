"""The tokenizer of OPUS-MT's Marian models, in and out of the graph, equal to transformers'
``MarianTokenizer``.

An OPUS-MT folder tokenizes with two SentencePiece models, ``source.spm`` and ``target.spm``,
whose pieces are mapped to the model's ids through ``vocab.json`` (and, with separate
vocabularies, ``target_vocab.json`` for the target side): the SentencePiece ids are not the
model's. What transformers' ``MarianTokenizer`` does, this does too:

- a source starting with a language code ``>>xx<<`` keeps the code as one token (looked up in
  the vocabulary), and SentencePiece encodes the rest;
- a piece missing from the vocabulary becomes the vocabulary's ``<unk>`` id; a character the
  SentencePiece model does not know keeps its text, which the vocabulary may hold (a shared
  ``vocab.json`` has the pieces of both models);
- ``</s>`` (id 0 in OPUS-MT) ends a sentence; ``<pad>`` (the last id) pads, and starts the
  decoder (``decoder_start_token_id``); there is no bos;
- decoding drops ``</s>``, ``<pad>`` and ``<unk>`` wherever they are
  (``skip_special_tokens=True``), joins the pieces, turns ``▁`` into spaces and strips the
  ends.

In the graph, TF-Text's ``FastSentencepieceTokenizer`` splits the text, as the Python
``sentencepiece`` that transformers uses does; TF-Text's ``SentencepieceTokenizer`` breaks ties
between equally scored splits otherwise ("..." as ".." "." instead of "." ".."), so it only
gives the text of the unknown characters, which the fast one does not. The
lookups are ``tf.lookup.StaticHashTable``s inside the graph, so an exported translator
takes raw strings and needs only ``tensorflow`` and ``tensorflow_text``. `save` writes the
files (those of the OPUS-MT folder, under their names) and `from_directory` reads them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Sequence

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

__all__ = ["MARIAN_FILES", "MarianTokenizer"]

# The files of an OPUS-MT folder that make its tokenizer (target_vocab.json: separate
# vocabularies only).
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
TARGET_VOCAB = "target_vocab.json"
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
_CODE = re.compile(r">>.*?<<", re.DOTALL)  # a language code at the start of a source
_CODE_RE2 = r"^>>(?s:.*?)<<"  # the same for tf.strings (RE2)
_SPACE = "\u2581"  # SentencePiece's word boundary


def _read_vocab(path: str) -> dict[str, int]:
    try:
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON vocabulary ({error})") from None
    if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in vocab.items()):
        raise ValueError(f"{path}: a vocabulary must be a JSON object of piece -> integer id")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise ValueError(f"{path}: the ids must be 0 ... {len(ids) - 1}, each once")
    for piece in (EOS, UNK, PAD):
        if piece not in vocab:
            raise ValueError(f"{path}: the vocabulary has no {piece!r}")
    return vocab


def _processor(proto: bytes, path: str) -> spm.SentencePieceProcessor:
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except RuntimeError as error:
        raise ValueError(f"{path}: not a SentencePiece model ({error})") from None
    return processor


class MarianTokenizer(tf.Module):
    """Two SentencePiece models and the vocabularies that map their pieces to model ids.

    Args:
        source_proto, target_proto: the serialized SentencePiece models (``source.spm``,
            ``target.spm``).
        vocab: ``vocab.json``: piece → id, of the source (and target, when shared).
        target_vocab: ``target_vocab.json`` with separate vocabularies, else None.
        name: name of the module.
    """

    def __init__(self, source_proto: bytes, target_proto: bytes, vocab: dict[str, int],
                 target_vocab: dict[str, int] | None = None, name: str | None = None):
        super().__init__(name=name)
        self._source_proto, self._target_proto = source_proto, target_proto
        self._source = _processor(source_proto, "source.spm")
        self._target = _processor(target_proto, "target.spm")
        self.vocab = dict(vocab)
        self.target_vocab = None if target_vocab is None else dict(target_vocab)
        target = self.target_vocab or self.vocab
        self._pieces = [""] * len(target)  # target id -> piece
        for piece, i in target.items():
            self._pieces[i] = piece
        self._source_table = self._table(self.vocab)
        self._target_table = self._source_table if target_vocab is None \
            else self._table(target)
        self._piece_table = tf.constant(self._pieces)
        # SentencePiece id -> model id (unk for pieces the vocabulary lacks), and piece ->
        # SentencePiece id, of each side.
        self._spm = {}
        for side, processor, vocab_of_side in (("source", self._source, self.vocab),
                                               ("target", self._target, target)):
            pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
            ids = [vocab_of_side.get(p, vocab_of_side[UNK]) for p in pieces]
            ids[processor.unk_id()] = vocab_of_side[UNK]
            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant(pieces), tf.range(len(pieces), dtype=tf.int32))
            self._spm[side] = (tf.constant(ids, tf.int32),
                               tf.lookup.StaticHashTable(init, default_value=processor.unk_id()),
                               processor.unk_id())

    @staticmethod
    def _table(vocab: dict[str, int]) -> tf.lookup.StaticHashTable:
        init = tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(vocab)), tf.constant(list(vocab.values()), tf.int32))
        return tf.lookup.StaticHashTable(init, default_value=vocab[UNK])

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> MarianTokenizer:
        """Reads ``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json``).

        Raises:
            ValueError: a file is missing or unreadable; the message names it.
        """
        directory = os.fspath(directory)
        paths = {name: os.path.join(directory, name) for name in MARIAN_FILES}
        for name, path in paths.items():
            if not os.path.isfile(path):
                raise ValueError(f"{directory} has no {name}")
        with open(paths["source.spm"], "rb") as f:
            source = f.read()
        with open(paths["target.spm"], "rb") as f:
            target = f.read()
        _processor(source, paths["source.spm"])
        _processor(target, paths["target.spm"])
        target_path = os.path.join(directory, TARGET_VOCAB)
        target_vocab = _read_vocab(target_path) if os.path.isfile(target_path) else None
        return cls(source, target, _read_vocab(paths["vocab.json"]), target_vocab)

    def save(self, directory: str | os.PathLike) -> list[str]:
        """Writes the tokenizer's files into ``directory``; returns their names."""
        directory = os.fspath(directory)
        names = []
        for name, data in (("source.spm", self._source_proto),
                           ("target.spm", self._target_proto)):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
            names.append(name)
        for name, vocab in (("vocab.json", self.vocab), (TARGET_VOCAB, self.target_vocab)):
            if vocab is not None:
                with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                    json.dump(vocab, f, ensure_ascii=False, indent=2)
                names.append(name)
        return names

    @property
    def separate_vocabs(self) -> bool:
        return self.target_vocab is not None

    @property
    def tables(self) -> tuple:
        """The lookup tables an export must track."""
        tables = [self._source_table, self._spm["source"][1], self._spm["target"][1]]
        if self._target_table is not self._source_table:
            tables.append(self._target_table)
        return tuple(tables)

    @property
    def vocab_size(self) -> int:
        """Source ids."""
        return len(self.vocab)

    @property
    def target_vocab_size(self) -> int:
        return len(self.target_vocab or self.vocab)

    @property
    def pad_id(self) -> int:
        """The target side's pad id (also the decoder start)."""
        return (self.target_vocab or self.vocab)[PAD]

    @property
    def source_pad_id(self) -> int:
        return self.vocab[PAD]

    @property
    def unk_id(self) -> int:
        return (self.target_vocab or self.vocab)[UNK]

    @property
    def bos_id(self) -> int:
        """The decoder's first input: the pad id, as Marian's ``decoder_start_token_id``."""
        return self.pad_id

    @property
    def eos_id(self) -> int:
        return (self.target_vocab or self.vocab)[EOS]

    @property
    def source_eos_id(self) -> int:
        return self.vocab[EOS]

    # In the graph.

    def _ids_of(self, side: str, texts: tf.Tensor) -> tf.RaggedTensor:
        """``(B,)`` strings → ragged ``(B, None)`` model ids of ``side``'s pieces."""
        proto = self._source_proto if side == "source" else self._target_proto
        table = self._source_table if side == "source" else self._target_table
        to_model, piece_ids, unk = self._spm[side]
        # New TF-Text tokenizers per call, as `nlp.text.tokenizer.Tokenizer` explains.
        split = tf.cast(tf_text.FastSentencepieceTokenizer(proto).tokenize(texts), tf.int32)
        ids = tf.ragged.map_flat_values(lambda i: tf.gather(to_model, i), split)
        # An unknown character keeps its text, which the vocabulary may hold: the k-th
        # unknown piece of the fast split is the k-th of the string split, whose text is
        # known (both find the same unknown runs; they differ only in breaking ties).
        pieces = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.string).tokenize(texts)
        unknown = tf.ragged.boolean_mask(
            pieces, tf.ragged.map_flat_values(piece_ids.lookup, pieces) == unk).flat_values
        where = tf.where(split.flat_values == unk)
        flat = tf.cond(
            tf.equal(tf.shape(where)[0], tf.shape(unknown)[0]),
            lambda: tf.tensor_scatter_nd_update(ids.flat_values, where,
                                                table.lookup(unknown)),
            lambda: ids.flat_values)
        return ids.with_flat_values(flat).with_row_splits_dtype(tf.int64)

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Sources ``(B,)`` tf.string → ragged ``(B, None)`` int32 model ids, no eos."""
        texts = tf.convert_to_tensor(texts, tf.string)
        rest = tf.strings.regex_replace(texts, _CODE_RE2, "", replace_global=False)
        code_length = tf.strings.length(texts) - tf.strings.length(rest)
        has_code = code_length > 0
        codes = tf.strings.substr(texts, tf.zeros_like(code_length), code_length)
        codes = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(codes, has_code),
                                                 tf.cast(has_code, tf.int64))
        codes = tf.ragged.map_flat_values(self._source_table.lookup, codes)
        codes = codes.with_row_splits_dtype(tf.int64)
        return tf.concat([codes, self._ids_of("source", rest)], axis=1)

    def tokenize_target(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Targets ``(B,)`` tf.string → ragged ``(B, None)`` int32 target ids, no eos."""
        return self._ids_of("target", tf.convert_to_tensor(texts, tf.string))

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Target ids ``(B, N)`` → ``(B,)`` strings, without eos, pad and unk."""
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=self.pad_id)
        ids = tf.cast(ids, tf.int32)
        keep = (ids != self.eos_id) & (ids != self.pad_id) & (ids != self.unk_id)
        pieces = tf.ragged.boolean_mask(tf.gather(self._piece_table, ids), keep)
        text = tf.strings.reduce_join(pieces, axis=1)
        return tf.strings.strip(tf.strings.regex_replace(text, _SPACE, " "))

    # In Python.

    def encode(self, text: str) -> list[int]:
        """One source string → model ids (no eos), as `tokenize`."""
        code, rest = [], text
        if text.startswith(">>"):
            found = _CODE.match(text)
            if found:
                code, rest = [found.group(0)], text[found.end():]
        unk = self.vocab[UNK]
        return [self.vocab.get(p, unk) for p in code + self._source.encode(rest, out_type=str)]

    def encode_target(self, text: str) -> list[int]:
        """One target string → target ids (no eos)."""
        vocab = self.target_vocab or self.vocab
        unk = vocab[UNK]
        return [vocab.get(p, unk) for p in self._target.encode(text, out_type=str)]

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids → string, as `detokenize`."""
        pieces = [self._pieces[int(i)] for i in ids
                  if int(i) not in (self.eos_id, self.pad_id, self.unk_id)]
        return "".join(pieces).replace(_SPACE, " ").strip(" \t\n\r\f\v")

    def id_to_piece(self, token_id: int) -> str:
        """The target piece of an id (for attention plots)."""
        return self._pieces[int(token_id)]
