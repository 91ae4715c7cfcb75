"""Tests of the SentencePiece vocabulary and tokenizer (`nlp.text.vocabulary`,
`nlp.text.tokenizer`)."""

import os
import re
import sys

import pytest
import tensorflow as tf

from nlp.data.embedded import generate_pairs
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import PLACEHOLDER_PATTERN, mine_placeholders, train_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_samples import SENTENCES, vocabulary  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    pairs = generate_pairs(400, seed=0)
    texts = [text for pair in pairs for text in pair] + SENTENCES
    path = tmp_path_factory.mktemp("sp") / "sub" / "tokenizer.model"
    return train_tokenizer(texts, path, vocab_size=8000)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return Tokenizer.from_file(model_path)


# Software messages with a placeholder of each style, English and German.
MESSAGES = [
    ("File %s was deleted.", "Datei %s wurde gelöscht."),
    ("%d files selected", "%d Dateien ausgewählt"),
    ("Hello %(name)s, welcome back!", "Hallo %(name)s, willkommen zurück!"),
    ("Copy %1$s to the archive", "%1$s ins Archiv kopieren"),
    ("100%% complete", "100%% abgeschlossen"),
    ("{} new messages", "{} neue Nachrichten"),
    ("Page {0} of the report", "Seite {0} des Berichts"),
    ("Delete {name}?", "{name} löschen?"),
    ("Invalid value: {name!r}", "Ungültiger Wert: {name!r}"),
    ("Logged in as $(user)", "Angemeldet als $(user)"),
    ("Folder ${var} not found", "Ordner ${var} nicht gefunden"),
    ("<b>Warning:</b> unsaved changes", "<b>Warnung:</b> ungespeicherte Änderungen"),
    ("Saving…", "Speichern…"),
]


PLACEHOLDERS = ["%s", "%d", "%(name)s", "%1$s", "%%", "{}", "{0}", "{name}", "{name!r}",
                "$(user)", "${var}", "<b>", "</b>"]


def _pieces(tokenizer, ids):
    return [tokenizer.id_to_piece(i) for i in ids]


@pytest.fixture(scope="module")
def copy_texts():
    pairs = generate_pairs(200, seed=1) + MESSAGES * 3
    return [text for pair in pairs for text in pair]


@pytest.fixture(scope="module")
def copy_tokenizer(copy_texts, tmp_path_factory):
    path = tmp_path_factory.mktemp("sp_copy") / "tokenizer.model"
    return Tokenizer.from_file(train_tokenizer(copy_texts, path, vocab_size=8000))


def test_special_ids(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    pieces = [tokenizer.id_to_piece(i) for i in range(4)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]


def test_vocab_is_clamped_for_tiny_data(tokenizer, model_path):
    assert 50 < tokenizer.vocab_size < 8000
    # The file keeps the size asked for, so that the same command reuses it on a rerun.
    from sentencepiece import sentencepiece_model_pb2

    from nlp.training.train import build_tokenizer

    proto = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.model_proto)
    assert proto.trainer_spec.vocab_size == 8000 and len(proto.pieces) == tokenizer.vocab_size
    again = build_tokenizer(str(model_path), [], 8000, log=lambda *a: None)
    assert again.model_proto == tokenizer.model_proto
    with pytest.raises(ValueError, match="trained with --vocab-size 8000, not 9000"):
        build_tokenizer(str(model_path), [], 9000, log=lambda *a: None)


def test_python_round_trip_without_unknowns(tokenizer):
    for text in SENTENCES + ["Heute ist Mittwoch, 3. März 2021."]:
        ids = tokenizer.encode(text)
        assert tokenizer.unk_id not in ids, text
        assert min(ids) > tokenizer.eos_id
        assert tokenizer.decode(ids) == text


def test_in_graph_tokenize_equals_python_encode(tokenizer):
    ragged = tokenizer.tokenize(tf.constant(SENTENCES))
    assert ragged.dtype == tf.int32
    assert ragged.to_list() == [tokenizer.encode(text) for text in SENTENCES]
    scalar = tokenizer.tokenize(tf.constant(SENTENCES[0]))
    assert scalar.numpy().tolist() == tokenizer.encode(SENTENCES[0])


def test_survives_tensorflow_cache_clearing(tokenizer):
    # The TF-Text model resource belongs to an op kernel; set_seed clears the eager kernels.
    expected = [tokenizer.encode(text) for text in SENTENCES]
    assert tokenizer.tokenize(tf.constant(SENTENCES)).to_list() == expected
    dataset = tf.data.Dataset.from_tensor_slices(SENTENCES).map(tokenizer.tokenize)
    tf.random.set_seed(1)
    assert tokenizer.tokenize(tf.constant(SENTENCES)).to_list() == expected
    assert [x.tolist() for x in dataset.as_numpy_iterator()] == expected


def test_detokenize_drops_special_ids(tokenizer):
    rows = [[2] + tokenizer.encode(text) + [3] for text in SENTENCES[:2]]
    width = max(len(row) for row in rows)
    dense = tf.constant([row + [0] * (width - len(row)) for row in rows])
    texts = tokenizer.detokenize(dense).numpy()
    assert [t.decode("utf-8") for t in texts] == SENTENCES[:2]
    assert tokenizer.decode(rows[0] + [0, 0]) == SENTENCES[0]


def test_works_in_tf_data_and_tf_function(tokenizer):
    ds = tf.data.Dataset.from_tensor_slices(SENTENCES).batch(3).map(tokenizer.tokenize).unbatch()
    assert [x.tolist() for x in ds.as_numpy_iterator()] == [tokenizer.encode(s) for s in SENTENCES]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return tokenizer.detokenize(tokenizer.tokenize(texts))

    assert [t.decode("utf-8") for t in round_trip(tf.constant(SENTENCES)).numpy()] == SENTENCES


class _Exported(tf.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def __call__(self, texts):
        ids = self.tokenizer.tokenize(texts)
        return {"ids": ids.to_tensor(), "text": self.tokenizer.detokenize(ids)}


def test_saved_model_embeds_the_tokenizer(tokenizer, model_path, tmp_path):
    export_dir = str(tmp_path / "export")
    tf.saved_model.save(_Exported(Tokenizer.from_file(model_path)), export_dir)
    loaded = tf.saved_model.load(export_dir)
    out = loaded(tf.constant(SENTENCES[:2]))
    expected = tokenizer.tokenize(tf.constant(SENTENCES[:2])).to_tensor()
    assert out["ids"].numpy().tolist() == expected.numpy().tolist()
    assert [t.decode("utf-8") for t in out["text"].numpy()] == SENTENCES[:2]


def test_mined_placeholders_are_single_pieces(copy_tokenizer, copy_texts):
    mined = mine_placeholders(copy_texts)
    assert sorted(mined) == sorted(PLACEHOLDERS)
    pieces = vocabulary(copy_tokenizer)
    for placeholder in mined:
        assert placeholder in pieces, placeholder
        assert placeholder in _pieces(copy_tokenizer, copy_tokenizer.encode(placeholder))
    for english, german in MESSAGES:
        for text in (english, german):
            pieces = _pieces(copy_tokenizer, copy_tokenizer.encode(text))
            assert [p for p in pieces if p in mined] == PLACEHOLDER_PATTERN.findall(text), text


def test_placeholders_survive_in_new_messages(copy_tokenizer):
    texts = [
        "Mit %(name)s teilen: %s von %d, %1$s und 50%% mehr",
        "Share {name} with {0}, {} and {name!r}",
        "Run as $(user) in ${var}: <b>done</b>",
        "Datei{name}%s$(user)ohne Leerzeichen",
    ]
    for text in texts:
        ids = copy_tokenizer.encode(text)
        assert copy_tokenizer.decode(ids) == text
        assert copy_tokenizer.unk_id not in ids
        pieces = _pieces(copy_tokenizer, ids)
        for placeholder in PLACEHOLDER_PATTERN.findall(text):
            assert placeholder in pieces, (placeholder, pieces)
    ragged = copy_tokenizer.tokenize(tf.constant(texts))
    assert ragged.to_list() == [copy_tokenizer.encode(text) for text in texts]
    assert [t.decode("utf-8") for t in copy_tokenizer.detokenize(ragged).numpy()] == texts


def test_digits_are_single_pieces(copy_tokenizer):
    text = "Order 20250917 of March 3, 2021 costs 1234.50 € (99 %)"
    ids = copy_tokenizer.encode(text)
    assert copy_tokenizer.decode(ids) == text
    pieces = [p for p in _pieces(copy_tokenizer, ids) if not re.fullmatch("<0x[0-9A-F]{2}>", p)]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert "".join(digit_pieces) == "".join(c for c in text if c.isdigit())
    assert all(len(p) == 1 for p in digit_pieces), digit_pieces


def test_unseen_characters_round_trip_through_bytes(copy_tokenizer):
    texts = ["Ω≈ç√ 漢字 😀 ✓", "Fehler 😀 in {name}: Ωmega"]
    for text in texts:
        assert not set(text) - {" "} <= set("".join(vocabulary(copy_tokenizer)))
        ids = copy_tokenizer.encode(text)
        assert copy_tokenizer.unk_id not in ids
        assert "<0xF0>" in _pieces(copy_tokenizer, ids)  # the first byte of 😀
        assert copy_tokenizer.decode(ids) == text
    ragged = copy_tokenizer.tokenize(tf.constant(texts))
    assert copy_tokenizer.unk_id not in ragged.flat_values.numpy().tolist()
    assert [t.decode("utf-8") for t in copy_tokenizer.detokenize(ragged).numpy()] == texts


def test_text_is_not_normalized(copy_tokenizer):
    # NFKC would give "Speichern...", a plain space, "full" and "1⁄2".
    texts = ["Speichern…", "10\u00a0%", "ｆｕｌｌ width", "½ Liter", "ﬁle", "Ä vs A\u0308"]
    for text in texts:
        assert copy_tokenizer.decode(copy_tokenizer.encode(text)) == text
    ragged = copy_tokenizer.tokenize(tf.constant(texts))
    assert [t.decode("utf-8") for t in copy_tokenizer.detokenize(ragged).numpy()] == texts
    assert copy_tokenizer.decode(copy_tokenizer.encode("  a   b ")) == "a b"  # spaces are tidied
