"""Training a SentencePiece vocabulary made for copying, and the placeholders it keeps whole.

`train_tokenizer` writes a SentencePiece model file trained on raw text, with the special ids
of `nlp.text.special_ids`; `nlp.text.tokenizer.Tokenizer` loads it.

The vocabulary is trained for copying: names, numbers and placeholders of software messages
("Datei %(name)s gelöscht", "{count} Einträge…") pass through unchanged. Text is not
normalized (no NFKC: "…", non-breaking spaces and full-width forms stay as they are), digits
are pieces of their own, the placeholders found in the training text are whole pieces, and,
in a vocabulary with room for them, characters never seen in training fall back to UTF-8
byte pieces instead of unk (see `train_tokenizer` and `mine_placeholders`).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from typing import Iterable

import sentencepiece as spm

from nlp.text.special_ids import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID

__all__ = ["PLACEHOLDER_PATTERN", "mine_placeholders", "train_tokenizer"]

# A placeholder of a software message: printf style ("%s", "%d", "%5.2f", "%(name)s", "%1$s",
# "%%"), brace style ("{}", "{0}", "{name}", "{name!r}", "{order.code}", "{0:>8}", "{{name}}"),
# shell style ("$(user)", "${var}") or an HTML tag without attributes ("<b>", "</b>", "<br/>").
# None holds whitespace; "% o" in "50% of" is not one (no space flag).
PLACEHOLDER_PATTERN = re.compile(r"""
      %%
    | %(?:\d+\$|\([A-Za-z_]\w*\))?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?
      [diouxXeEfFgGcrsaAp]
    | \{\{[A-Za-z_][\w.]*\}\}
    | \{(?:[A-Za-z_]\w*|\d+)?(?:\.[A-Za-z_]\w*|\[\w+\])*(?:![rsa])?(?::[^{}\s]*)?\}
    | \$\([A-Za-z_]\w*\)
    | \$\{[A-Za-z_]\w*\}
    | </?[A-Za-z][A-Za-z0-9]*/?>
""", re.VERBOSE)
_PLACEHOLDER_MIN_COUNT = 2
_NUM_BYTE_PIECES = 256  # byte fallback: one piece per byte value, <0x00> ... <0xFF>
_PLACEHOLDER_SHARE = 8  # placeholders take at most 1/8 of the ids left for learned pieces
_BYTE_SHARE = 8  # the byte pieces take at most 1/8 of the ids left after the characters


def mine_placeholders(
    texts: Iterable[str], limit: int | None = None, *, min_count: int = _PLACEHOLDER_MIN_COUNT
) -> list[str]:
    """The placeholders of `texts` (matches of `PLACEHOLDER_PATTERN`), most frequent first.

    A placeholder is kept when it occurs at least `min_count` times in all of `texts` (with the
    default 2, one in the source and one in the target of a pair is enough) and is not one of
    `SPECIAL_PIECES` (an HTML "<s>" is not the bos piece). Ties in frequency are ordered by the
    string, so the result does not depend on the order of `texts`.

    Args:
        texts: Sentences.
        limit: Keep at most this many (the most frequent); None keeps all.
        min_count: Fewest occurrences of a kept placeholder.

    Returns:
        The placeholders, each once.
    """
    counts: dict[str, int] = {}
    find = PLACEHOLDER_PATTERN.findall
    for text in texts:
        for found in find(text):
            counts[found] = counts.get(found, 0) + 1
    kept = sorted((p for p, n in counts.items() if n >= min_count and p not in SPECIAL_PIECES),
                  key=lambda p: (-counts[p], p))
    return kept if limit is None else kept[:max(0, limit)]


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | os.PathLike,
    vocab_size: int = 8000,
    *,
    max_sentences: int = 2_000_000,
    model_type: str = "unigram",
) -> str:
    """Trains a SentencePiece model on `texts` and writes it to `model_path`.

    `vocab_size` is an upper bound: on a small corpus that cannot fill it, the vocabulary is
    clamped to what the text supports (SentencePiece's `hard_vocab_limit=false`). Every character
    of the text is covered (`character_coverage=1.0`), so umlauts and "ß" never map to unk.

    The model is made to copy text exactly:

    - No normalization but one rule (U+FEFF, the byte-order mark, is dropped; a rule table
      that is not empty also keeps SentencePiece from logging "precompiled_charsmap is empty"
      each time the model loads): the default NFKC rules would
      decode "…" as "...", a non-breaking space as a space, "ｆｕｌｌ" as "full" and "½" as
      "1⁄2". Whitespace is still tidied: runs of spaces become one, and leading and trailing
      spaces are dropped.
    - Digits are always pieces of their own (`split_digits=True`): "2021" is "2" "0" "2" "1".
    - Byte fallback (`byte_fallback=True`): a character that is not in the vocabulary is encoded
      as the pieces of its UTF-8 bytes and decoded back to itself, never to unk. The 256 byte
      pieces are added only when they take at most an eighth of the ids left after the special
      ids and one id per distinct character, that is for `vocab_size >= 2053 + C`, `C` the
      number of distinct characters of the text other than the space; smaller vocabularies
      train without them and keep unk for unseen characters (in a vocabulary of 2,000 the
      byte pieces made software messages 5 % longer and translated them worse).
    - Placeholders are whole pieces (SentencePiece's `user_defined_symbols`, which are never
      split and never merged with their neighbours): the `mine_placeholders` of the training
      sentences, the most frequent first, at most an eighth of the ids left after the special
      ids, the characters and the byte pieces (if any). Placeholders that are not mined still
      round-trip, in several pieces.

    Args:
        texts: Training sentences, source and target together (one shared vocabulary).
        model_path: Where to write the model file (e.g. `DIR/tokenizer.model`).
        vocab_size: Largest vocabulary size, special tokens included.
        max_sentences: Only the first `max_sentences` non-empty texts are used.
        model_type: SentencePiece model type: "unigram" or "bpe".

    Returns:
        `model_path` as a string.

    Raises:
        ValueError: If `vocab_size`, `max_sentences` or `model_type` is invalid, or `texts`
            holds no non-empty sentence.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 5:
        raise ValueError(
            f"`vocab_size` must be an integer >= 5. Received: vocab_size={vocab_size!r}"
        )
    if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
        raise ValueError(
            f"`max_sentences` must be a positive integer. Received: max_sentences={max_sentences!r}"
        )
    if model_type not in ("unigram", "bpe"):
        raise ValueError(
            f"`model_type` must be 'unigram' or 'bpe'. Received: model_type={model_type!r}"
        )
    sentences = []
    for text in texts:
        text = text.strip()
        if text:
            sentences.append(text)
            if len(sentences) >= max_sentences:
                break
    if not sentences:
        raise ValueError("`texts` must contain at least one non-empty sentence. Received none.")
    byte_fallback, placeholders = _copy_options(sentences, vocab_size)
    options = dict(
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type=model_type,
        character_coverage=1.0,
        split_digits=True,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    try:
        model = _train(sentences, **options, byte_fallback=byte_fallback,
                       user_defined_symbols=placeholders)
    except RuntimeError as error:
        if not (byte_fallback or placeholders):
            raise _training_error(error, vocab_size) from None
        # `_copy_options` counts the characters high, never low, so the extras fit; should they
        # not, the vocabulary is trained without them, and a failure then names the size the
        # text needs.
        try:
            model = _train(sentences, **options)
        except RuntimeError as plain_error:
            raise _training_error(plain_error, vocab_size) from None
    model = _record_request(model, vocab_size)
    model_path = os.fspath(model_path)
    directory = os.path.dirname(model_path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(model_path, "wb") as f:
        f.write(model)
    return model_path


# The normalization rules (SentencePiece's TSV: source code points, tab, target code points):
# drop the byte-order mark, leave every other character as it is.
NORMALIZATION_RULES = "FEFF\t\n"


def _record_request(model: bytes, vocab_size: int) -> bytes:
    """``model`` with ``trainer_spec.vocab_size`` set to the size asked for.

    With ``hard_vocab_limit=False`` SentencePiece shrinks the vocabulary of a small corpus and
    records the size it got there; the pieces already say that, so the field keeps what was
    asked, which a rerun of the same command compares with its ``--vocab-size``.
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    proto.trainer_spec.vocab_size = vocab_size
    return proto.SerializeToString()


def _train(sentences: list[str], **options) -> bytes:
    """The serialized SentencePiece model trained on `sentences` with `options`."""
    model = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="tfx-tokenizer-") as tmp:
        rules = os.path.join(tmp, "rules.tsv")
        with open(rules, "w", encoding="utf-8") as f:
            f.write(NORMALIZATION_RULES)
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                       normalization_rule_tsv=rules, **options)
    return model.getvalue()


def _copy_options(sentences: list[str], vocab_size: int) -> tuple[bool, list[str]]:
    """`(byte_fallback, placeholders)` for `sentences` and `vocab_size` (see `train_tokenizer`).

    The characters are counted as SentencePiece counts them without normalization (every space
    is the one piece "▁", which every sentence holds), or higher: it leaves out the characters
    that occur only inside user-defined symbols.
    """
    characters = set()
    for sentence in sentences:
        characters.update(sentence)
    characters.discard(" ")
    free = vocab_size - len(SPECIAL_PIECES) - (len(characters) + 1)
    byte_fallback = free >= _BYTE_SHARE * _NUM_BYTE_PIECES
    limit = (free - (_NUM_BYTE_PIECES if byte_fallback else 0)) // _PLACEHOLDER_SHARE
    return byte_fallback, (mine_placeholders(sentences, limit) if limit > 0 else [])


def _training_error(error: RuntimeError, vocab_size: int) -> ValueError:
    """SentencePiece's training error as a ValueError that says which `vocab_size` works."""
    text = " ".join(str(error).split())
    # "Vocabulary size is smaller than required_chars. 10 vs 29. Increase vocab_size ..."
    found = re.search(r"smaller than required_chars\. *(\d+) vs (\d+)", text)
    if found:
        needed = int(found.group(2))
        return ValueError(
            f"`vocab_size` (--vocab-size) must be at least {needed} for this text: the "
            f"{len(SPECIAL_PIECES)} special ids and one id per distinct character "
            f"({needed - len(SPECIAL_PIECES)}). Received: vocab_size={vocab_size}"
        )
    return ValueError(f"SentencePiece could not train a tokenizer with vocab_size={vocab_size}: "
                      f"{text[:300]}")
