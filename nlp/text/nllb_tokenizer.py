"""The tokenizer of NLLB-200 (M2M100) models, in and out of the graph, with transformers'
``NllbTokenizer`` ids.

An NLLB model has one SentencePiece BPE model (``sentencepiece.bpe.model``) whose ids are
shifted into fairseq's dictionary: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, then the
SentencePiece piece of id ``k >= 3`` at ``k + 1`` (SentencePiece's own unknown id 0 becomes
3); after the pieces come the language codes (``eng_Latn``, ``deu_Latn``...) and ``<mask>``,
each an added token of a known id (`NllbTokenizer` takes them as ``added``). What
transformers' ``NllbTokenizer`` does (its default, not ``legacy_behaviour``), this does too:

- a source is ``[source language] + pieces + [</s>]``, a target ``[target language] + pieces
  + [</s>]`` (`tokenize` and `tokenize_target` leave out the ``</s>``, which the export and
  the data pipeline append);
- a text whose normalized form ends in whitespace gets one more piece, ``▁``: transformers
  keeps the trailing space (its pre-tokenizer turns it into a word of its own), where
  SentencePiece strips it. Which characters normalize to whitespace, or to nothing, is read
  from the SentencePiece model's own normalizer when the tokenizer is built;
- decoding drops the special ids, the language codes and ``<mask>`` (and ids past the
  vocabulary: the model's embedding may have a few rows more), joins the pieces, turns ``▁``
  into spaces and drops the first space (transformers' Metaspace decoder).

Known differences: a combining mark after a character that NFKC changes (fullwidth or
mathematical letters) is normalized by SentencePiece together with that character and by
transformers' tokenizers library character by character, so the two may split such text
differently (this follows SentencePiece); and a special token's text inside a source
(``"</s>"``, ``"eng_Latn"``) becomes that token in transformers, pieces here.

In the graph, TF-Text's ``SentencepieceTokenizer`` runs the SentencePiece model (a BPE model,
which TF-Text's fast tokenizer does not take), and the id maps are constants, so an exported
translator takes raw strings and needs only ``tensorflow`` and ``tensorflow_text``. `save`
writes ``sentencepiece.bpe.model`` and ``nllb_tokenizer.json`` (the added tokens and the two
languages); `from_directory` reads them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Sequence

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

__all__ = ["INFO_FILE", "NLLB_FILES", "SPM_FILE", "SPECIAL_TOKENS", "NllbTokenizer",
           "language_pair"]

SPM_FILE = "sentencepiece.bpe.model"
INFO_FILE = "nllb_tokenizer.json"
NLLB_FILES = (SPM_FILE, INFO_FILE)
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's ids 0, 1, 2, 3
MASK = "<mask>"
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
_SPACE = "\u2581"  # SentencePiece's word boundary
# Characters scanned for what the normalizer makes of them: the first three planes and the
# tags / variation selectors of plane 14.
_SCANNED = [*range(0xD800), *range(0xE000, 0x30000), *range(0xE0000, 0xE1000)]


def _processor(proto: bytes, what: str) -> spm.SentencePieceProcessor:
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except RuntimeError as error:
        raise ValueError(f"{what}: not a SentencePiece model ({error})") from None
    ids = (processor.unk_id(), processor.bos_id(), processor.eos_id())
    if ids != (0, 1, 2):
        raise ValueError(f"{what}: NLLB's SentencePiece model has <unk> 0, <s> 1, </s> 2; this "
                         f"one has unk/bos/eos ids {ids}")
    return processor


def _character_class(chars: list[str]) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in chars)


def _trailing_space_pattern(processor: spm.SentencePieceProcessor) -> str:
    """An RE2 pattern of the texts whose normalized form ends in whitespace: a character the
    normalizer turns into a space, then only characters it removes."""
    chars = [chr(c) for c in _SCANNED]
    normalized = processor.normalize([f"a{c}b" for c in chars])
    space = [c for c, n in zip(chars, normalized) if n == f"{_SPACE}a{_SPACE}b"]
    removed = [c for c, n in zip(chars, normalized) if n == f"{_SPACE}ab"]
    tail = f"[{_character_class(removed)}]*" if removed else ""
    return f"(?s).*[{_character_class(space)}]{tail}"


class NllbTokenizer(tf.Module):
    """NLLB's SentencePiece model, its fairseq ids, its language codes and a language pair.

    Args:
        proto: the serialized SentencePiece model (``sentencepiece.bpe.model``).
        added: id → token of the tokens after the SentencePiece pieces: the language codes
            and ``<mask>``.
        source_lang, target_lang: the language codes that start every source and every
            translation.
        vocab_size: the model's number of ids (its embedding may have rows after the last
            token); None: the tokenizer's.
        name: name of the module.

    Raises:
        ValueError: an added token's id that falls among the pieces or is repeated, or a
            language not among the added tokens.
    """

    def __init__(self, proto: bytes, added: dict[int, str], source_lang: str, target_lang: str,
                 vocab_size: int | None = None, name: str | None = None):
        super().__init__(name=name)
        self._proto = proto
        self._processor = _processor(proto, SPM_FILE)
        pieces = self._processor.get_piece_size()
        self.num_pieces = pieces  # ids 4 ... pieces are SentencePiece's pieces 3 ... pieces-1
        added = {int(i): str(t) for i, t in added.items()}
        for i, token in sorted(added.items()):
            if i <= pieces:
                raise ValueError(f"added token {token!r} has id {i}, which is a SentencePiece "
                                 f"piece's (ids 4 ... {pieces})")
        if len(set(added.values())) != len(added):
            raise ValueError(f"added tokens repeat: {sorted(added.values())}")
        self.added = dict(sorted(added.items()))
        self.languages = [t for t in self.added.values() if t != MASK]
        ids = {t: i for i, t in self.added.items()}
        for argument, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
            if lang not in ids or lang == MASK:
                raise ValueError(f"`{argument}` must be one of the tokenizer's "
                                 f"{len(self.languages)} language codes (e.g. "
                                 f"{', '.join(self.languages[:4])}). Received: {lang!r}")
        self.source_lang, self.target_lang = source_lang, target_lang
        self.source_lang_id, self.target_lang_id = ids[source_lang], ids[target_lang]
        size = max([pieces, *self.added]) + 1
        if vocab_size is not None and vocab_size < size:
            raise ValueError(f"`vocab_size` must be at least the tokenizer's {size} ids. "
                             f"Received: vocab_size={vocab_size}")
        self._vocab_size = size if vocab_size is None else int(vocab_size)
        self._pieces = [self._processor.id_to_piece(i) for i in range(3, pieces)]
        piece_ids = {p: i + 4 for i, p in enumerate(self._pieces)}
        self.space_id = piece_ids.get(_SPACE, UNK_ID)
        # SentencePiece id -> model id: unk 0 -> 3, <s> 1 -> 0, </s> 2 -> 2, k -> k + 1.
        self._to_model = tf.constant([UNK_ID, BOS_ID, EOS_ID, *range(4, pieces + 1)], tf.int32)
        self._piece_table = tf.constant(self._pieces or [""])
        self._trailing = _trailing_space_pattern(self._processor)
        self._trailing_python = re.compile(_python_pattern(self._trailing))

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> NllbTokenizer:
        """Reads ``sentencepiece.bpe.model`` and ``nllb_tokenizer.json`` (what `save` wrote).

        Raises:
            ValueError: a file is missing or unreadable; the message names it.
        """
        directory = os.fspath(directory)
        paths = {name: os.path.join(directory, name) for name in NLLB_FILES}
        for name, path in paths.items():
            if not os.path.isfile(path):
                raise ValueError(f"{directory} has no {name}")
        with open(paths[SPM_FILE], "rb") as f:
            proto = f.read()
        try:
            with open(paths[INFO_FILE], encoding="utf-8") as f:
                info = json.load(f)
            added = {int(i): t for i, t in info["added_tokens"].items()}
            return cls(proto, added, info["source_lang"], info["target_lang"],
                       info.get("vocab_size"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                AttributeError) as error:
            raise ValueError(f"{paths[INFO_FILE]}: not an NLLB tokenizer's description "
                             f"({type(error).__name__}: {error})") from None
        except ValueError as error:
            raise ValueError(f"{paths[INFO_FILE]}: {error}") from None

    def save(self, directory: str | os.PathLike) -> list[str]:
        """Writes the tokenizer's files into ``directory``; returns their names."""
        directory = os.fspath(directory)
        with open(os.path.join(directory, SPM_FILE), "wb") as f:
            f.write(self._proto)
        info = {"source_lang": self.source_lang, "target_lang": self.target_lang,
                "vocab_size": self._vocab_size,
                "added_tokens": {str(i): t for i, t in self.added.items()}}
        with open(os.path.join(directory, INFO_FILE), "w", encoding="utf-8") as f:
            json.dump(info, f, ensure_ascii=False, indent=2)
        return list(NLLB_FILES)

    def tokens(self) -> list[str]:
        """Every id's token, in id order (``madeupwordN`` for rows that have none, as
        fairseq names them)."""
        tokens = [*SPECIAL_TOKENS, *self._pieces]
        for i in range(len(tokens), self._vocab_size):
            tokens.append(self.added.get(i, f"madeupword{i - len(SPECIAL_TOKENS)}"))
        return tokens

    @property
    def tables(self) -> tuple:
        """The lookup tables an export must track: none (the maps are constants)."""
        return ()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def target_vocab_size(self) -> int:
        return self._vocab_size

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def source_pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        """The decoder's first input: ``</s>``, as NLLB's ``decoder_start_token_id``."""
        return EOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def source_eos_id(self) -> int:
        return EOS_ID

    # In the graph.

    def _ids(self, texts: tf.Tensor, language: int) -> tf.RaggedTensor:
        """``(B,)`` strings → ragged ``(B, None)`` int32: the language, the pieces, and ``▁``
        where the text ends in whitespace."""
        texts = tf.convert_to_tensor(texts, tf.string)
        # A new TF-Text tokenizer per call, as `nlp.text.tokenizer.Tokenizer` explains.
        split = tf_text.SentencepieceTokenizer(model=self._proto, out_type=tf.int32)
        ids = tf.ragged.map_flat_values(lambda i: tf.gather(self._to_model, i),
                                        split.tokenize(texts)).with_row_splits_dtype(tf.int64)
        trailing = tf.cast(tf.strings.regex_full_match(texts, self._trailing), tf.int64)
        space = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(trailing)], tf.constant(self.space_id, tf.int32)), trailing)
        lang = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.shape(texts)[0]], tf.constant(language, tf.int32)),
            tf.ones_like(trailing))
        return tf.concat([lang, ids, space], axis=1)

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Sources ``(B,)`` tf.string → ragged ``(B, None)`` int32: the source language and
        the pieces, no ``</s>``."""
        return self._ids(texts, self.source_lang_id)

    def tokenize_target(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Targets ``(B,)`` tf.string → ragged ``(B, None)`` int32: the target language and
        the pieces, no ``</s>``."""
        return self._ids(texts, self.target_lang_id)

    def detokenize(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Ids ``(B, N)`` → ``(B,)`` strings, without special tokens and language codes."""
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(ids, tf.int32)
        keep = (ids >= 4) & (ids <= self.num_pieces)
        pieces = tf.gather(self._piece_table, tf.ragged.boolean_mask(ids, keep) - 4)
        text = tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=1), _SPACE, " ")
        return tf.strings.regex_replace(text, "^ ", "", replace_global=False)

    # In Python.

    def _encode(self, text: str, language: int) -> list[int]:
        ids = [language] + [_model_id(i) for i in self._processor.encode(text)]
        if self._trailing_python.fullmatch(text):
            ids.append(self.space_id)
        return ids

    def encode(self, text: str) -> list[int]:
        """One source string → ids (no ``</s>``), as `tokenize`."""
        return self._encode(text, self.source_lang_id)

    def encode_target(self, text: str) -> list[int]:
        """One target string → ids (no ``</s>``), as `tokenize_target`."""
        return self._encode(text, self.target_lang_id)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids → string, as `detokenize`."""
        text = "".join(self._pieces[int(i) - 4] for i in ids if 4 <= int(i) <= self.num_pieces)
        text = text.replace(_SPACE, " ")
        return text[1:] if text.startswith(" ") else text

    def id_to_piece(self, token_id: int) -> str:
        """The token of an id (for attention plots)."""
        i = int(token_id)
        if i < len(SPECIAL_TOKENS):
            return SPECIAL_TOKENS[i]
        if i <= self.num_pieces:
            return self._pieces[i - len(SPECIAL_TOKENS)]
        return self.added.get(i, f"madeupword{i - len(SPECIAL_TOKENS)}")


def language_pair(tokenizer) -> dict:
    """``{"source_lang", "target_lang"}`` of an `NllbTokenizer` (built into its model's
    files and export, so clients send plain text); ``{}`` for another tokenizer."""
    if not isinstance(tokenizer, NllbTokenizer):
        return {}
    return {"source_lang": tokenizer.source_lang, "target_lang": tokenizer.target_lang}


def _model_id(spm_id: int) -> int:
    return (UNK_ID, BOS_ID, EOS_ID)[spm_id] if spm_id < 3 else spm_id + 1


def _python_pattern(pattern: str) -> str:
    """An RE2 pattern of `_trailing_space_pattern` for Python's ``re``."""
    return re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", pattern)
