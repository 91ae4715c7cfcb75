"""Tests of training the SentencePiece vocabulary (`nlp.text.vocabulary`): the placeholder rule,
the share of byte pieces and placeholders, the options a model was trained with, and bad
arguments and files named."""

import io
import os
import sys

import pytest
import tensorflow as tf

from nlp.data.embedded import generate_pairs
from nlp.text.special_ids import SPECIAL_PIECES
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import mine_placeholders, train_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_samples import SENTENCES, vocabulary  # noqa: E402


def test_mine_placeholders_rule():
    texts = [
        "Delete %(name)s? %s of %d, %1$s, 100%%, %5.2f and %-10s",
        "%(name)s löschen? %s von %d, %1$s, 100%%, %5.2f und %-10s",
        "{} {0} {name} {name!r} {order.code} {0:>8} {{name}} {a b} {",
        "{} {0} {name} {name!r} {order.code} {0:>8} {{name}}",
        "$(user) ${var} $HOME $ (x) <b>bold</b> <br/> <a href='x'> a < b > c",
        "$(user) ${var} $HOME <b>fett</b> <br/> <s>alt</s> <s></s>",
        "50% of 50 % off %z 10%. %(x) s once: %x {once} <i>",
        "%s %s",
    ]
    expected = [
        "%s",  # 4 times, then twice each, in string order
        "$(user)", "${var}", "%%", "%(name)s", "%-10s", "%1$s", "%5.2f", "%d",
        "</b>", "<b>", "<br/>",
        "{0:>8}", "{0}", "{name!r}", "{name}", "{order.code}", "{{name}}", "{}",
    ]
    assert mine_placeholders(texts) == expected
    assert mine_placeholders(reversed(texts)) == expected
    assert mine_placeholders(texts, limit=3) == expected[:3]
    assert mine_placeholders(texts, limit=0) == []
    once = {"%x", "{once}", "<i>"}
    assert set(mine_placeholders(texts, min_count=1)) == set(expected) | once
    assert not set(SPECIAL_PIECES) & set(mine_placeholders(texts, min_count=1))  # "<s>", "</s>"


def _characters(texts):
    """Ids a text needs without byte fallback: the special ids and one per character."""
    return len(SPECIAL_PIECES) + len(set("".join(texts)) - {" "}) + 1


def test_byte_pieces_only_when_they_take_at_most_an_eighth_of_the_free_ids(tmp_path):
    texts = [text for pair in generate_pairs(60, seed=2) for text in pair] + ["%s %s"]
    smallest = _characters(texts) + 8 * 256
    small = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "a.model", smallest - 1))
    assert "<0x41>" not in vocabulary(small) and "%s" in vocabulary(small)
    assert small.unk_id in small.encode("😀")
    large = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "b.model", smallest))
    assert {"<0x00>", "<0xFF>", "%s"} <= vocabulary(large)
    assert large.decode(large.encode("😀 %s")) == "😀 %s"


def test_extras_that_do_not_fit_fall_back_to_the_plain_vocabulary(tmp_path, monkeypatch):
    import nlp.text.vocabulary

    monkeypatch.setattr(nlp.text.vocabulary, "_copy_options",
                        lambda sentences, size: (True, ["%s"]))
    texts = ["Ich habe zwölf Äpfel.", "I have twelve apples."]
    needed = _characters(texts)
    tokenizer = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "x.model", needed))
    assert "<0x41>" not in vocabulary(tokenizer) and "%s" not in vocabulary(tokenizer)
    assert tokenizer.decode(tokenizer.encode(texts[0])) == texts[0]
    with pytest.raises(ValueError, match=f"at least {needed} "):
        train_tokenizer(texts, tmp_path / "y.model", needed - 1)


def test_placeholders_take_at_most_an_eighth_of_the_learned_ids(tmp_path):
    # {p0} occurs 61 times, {p1} 60 times, ... {p59} twice.
    texts = [f"Wert {{p{k}}} Nummer" for k in range(60) for _ in range(61 - k)]
    vocab_size = _characters(texts) + 8 * 35 + 7  # no room for byte pieces
    limit = (vocab_size - _characters(texts)) // 8
    assert limit == 35
    tokenizer = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "x.model", vocab_size))
    kept = {p for p in vocabulary(tokenizer) if p.startswith("{p")}
    assert kept == {f"{{p{k}}}" for k in range(limit)}
    for k in (0, limit - 1, limit, 59):
        text = f"Wert {{p{k}}} Nummer"
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_model_of_the_previous_options_still_loads(tmp_path):
    import sentencepiece as spm

    # nmt_nfkc normalization, no byte fallback, no digit splitting, no placeholders.
    texts = [text for pair in generate_pairs(100, seed=3) for text in pair] + SENTENCES
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=300,
        hard_vocab_limit=False, model_type="unigram", character_coverage=1.0,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, num_threads=1, minloglevel=2)
    path = tmp_path / "old" / "tokenizer.model"
    path.parent.mkdir()
    path.write_bytes(model.getvalue())
    tokenizer = Tokenizer.from_file(path)
    assert tokenizer.vocab_size == 300
    for text in SENTENCES:
        ids = tokenizer.encode(text)
        assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == text
    assert tokenizer.tokenize(tf.constant(SENTENCES)).to_list() == [
        tokenizer.encode(text) for text in SENTENCES]
    assert tokenizer.unk_id in tokenizer.encode("😀")  # no byte pieces: unk
    assert tokenizer.decode(tokenizer.encode("Speichern…")) == "Speichern..."


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=3"):
        train_tokenizer(["a b c"], tmp_path / "x.model", vocab_size=3)
    with pytest.raises(ValueError, match="non-empty"):
        train_tokenizer(["", "  "], tmp_path / "x.model")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        Tokenizer(b"not a model")
    with pytest.raises(TypeError, match="model_proto"):
        Tokenizer("a string")
    with pytest.raises(ValueError, match="missing.model"):
        Tokenizer.from_file(tmp_path / "missing.model")


def test_too_small_vocab_size_names_the_smallest_that_works(tmp_path):
    texts = ["Ich habe zwölf Äpfel.", "I have twelve apples."]
    with pytest.raises(ValueError) as info:
        train_tokenizer(texts, tmp_path / "x.model", vocab_size=10)
    message = str(info.value)
    assert "`vocab_size` (--vocab-size) must be at least" in message
    assert message.endswith("Received: vocab_size=10")
    needed = int(message.split("at least ")[1].split()[0])
    assert needed > 10
    assert not (tmp_path / "x.model").exists()
    with pytest.raises(ValueError, match=f"at least {needed} "):  # the bound is exact
        train_tokenizer(texts, tmp_path / "x.model", vocab_size=needed - 1)
    path = train_tokenizer(texts, tmp_path / "x.model", vocab_size=needed)
    assert Tokenizer.from_file(path).vocab_size >= needed - 1


@pytest.mark.parametrize("content, reason", [
    (b"", "is empty (0 bytes)"),
    (b"\x00\x01 not a model", "not a valid SentencePiece model"),
    (None, "is a directory"),
])
def test_unreadable_tokenizer_file_names_its_path(tmp_path, content, reason):
    path = tmp_path / "work" / "tokenizer.model"
    if content is None:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir()
        path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        Tokenizer.from_file(path)
    assert str(path) in str(info.value) and reason in str(info.value)


def test_tokenizer_with_other_special_ids_names_its_path(tmp_path):
    import sentencepiece as spm

    path = tmp_path / "other.model"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 3), model_prefix=
                                   str(tmp_path / "other"), vocab_size=60, hard_vocab_limit=False,
                                   minloglevel=2)
    with pytest.raises(ValueError) as info:
        Tokenizer.from_file(path)
    assert str(path) in str(info.value) and "special ids" in str(info.value)
