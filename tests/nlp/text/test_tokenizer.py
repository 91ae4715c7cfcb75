"""Tests of the SentencePiece vocabulary and tokenizer (`nlp.text.vocabulary`,
`nlp.text.tokenizer`)."""

import io
import re

import pytest
import tensorflow as tf

from nlp.data.embedded import generate_pairs
from nlp.text.special_ids import SPECIAL_PIECES
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import PLACEHOLDER_PATTERN, mine_placeholders, train_tokenizer

SENTENCES = [
    "Ich habe einundzwanzig Äpfel.",
    "Die Straße ist schön.",
    "I have twenty-one apples.",
    "The meeting is on March 3, 2021.",
]


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


def _vocabulary(tokenizer):
    return {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}


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
    vocabulary = _vocabulary(copy_tokenizer)
    for placeholder in mined:
        assert placeholder in vocabulary, placeholder
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
        assert not set(text) - {" "} <= set("".join(_vocabulary(copy_tokenizer)))
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
    assert "<0x41>" not in _vocabulary(small) and "%s" in _vocabulary(small)
    assert small.unk_id in small.encode("😀")
    large = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "b.model", smallest))
    assert {"<0x00>", "<0xFF>", "%s"} <= _vocabulary(large)
    assert large.decode(large.encode("😀 %s")) == "😀 %s"


def test_extras_that_do_not_fit_fall_back_to_the_plain_vocabulary(tmp_path, monkeypatch):
    import nlp.text.vocabulary

    monkeypatch.setattr(nlp.text.vocabulary, "_copy_options",
                        lambda sentences, size: (True, ["%s"]))
    texts = ["Ich habe zwölf Äpfel.", "I have twelve apples."]
    needed = _characters(texts)
    tokenizer = Tokenizer.from_file(train_tokenizer(texts, tmp_path / "x.model", needed))
    assert "<0x41>" not in _vocabulary(tokenizer) and "%s" not in _vocabulary(tokenizer)
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
    kept = {p for p in _vocabulary(tokenizer) if p.startswith("{p")}
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
