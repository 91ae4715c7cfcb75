"""Tests of the SentencePiece tokenizer (`nlp.tokenizer`)."""

import pytest
import tensorflow as tf

from nlp.data.embedded import generate_pairs
from nlp.tokenizer import Tokenizer, train_tokenizer

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


def test_special_ids(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    pieces = [tokenizer.id_to_piece(i) for i in range(4)]
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]


def test_vocab_is_clamped_for_tiny_data(tokenizer):
    assert 50 < tokenizer.vocab_size < 8000


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
