"""Tests of translation data sources and batching (`nlp.data.sources`, `nlp.data.batching`)."""

import collections
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from nlp.data import batching, sources
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import train_tokenizer


@pytest.fixture(scope="module")
def pairs():
    return sources.load_pairs("embedded", "train", limit=300)


@pytest.fixture(scope="module")
def tokenizer(pairs, tmp_path_factory):
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    return Tokenizer.from_file(train_tokenizer([t for p in pairs for t in p], path, 600))


def _write(path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def test_unknown_scheme_names_it_and_the_accepted_ones():
    with pytest.raises(ValueError, match=r"'csv'.*embedded.*tsv:PATH.*tfds:NAME"):
        sources.parse_data_spec("csv:/tmp/x.csv")
    with pytest.raises(ValueError, match=r"`--data` must be 'tsv:PATH'.*Received: --data 'tsv:'"):
        sources.load_pairs("tsv:")
    spec = sources.parse_data_spec("tfds:wmt14_translate/de-en")
    assert spec == ("tfds", ("wmt14_translate/de-en",)) and spec.parts[0] == "wmt14_translate/de-en"
    assert sources.evaluation_split("tsv:x.tsv") == "all"
    assert sources.evaluation_split("embedded") == "valid"
    with pytest.raises(ValueError, match="split=.*'test'"):
        sources.load_pairs("embedded", "test")
    with pytest.raises(ValueError, match="limit=-2"):
        sources.load_pairs("embedded", limit=-2)
    with pytest.raises(ValueError, match="no dataset 'no_such_dataset_xyz'"):
        sources.load_dataset("tfds:no_such_dataset_xyz")


@pytest.mark.parametrize(
    "line, reason",
    [(b"no tab here", "no tab"), (b"\tonly target", "empty source"), (b"\xff\xfe\tx", "UTF-8")],
)
def test_malformed_tsv_line_names_file_and_line(tmp_path, line, reason):
    path = _write(tmp_path / "pairs.tsv", b"a\tb\n\nc\td\n" + line + b"\ne\tf\n")
    with pytest.raises(ValueError, match=reason) as info:
        sources.load_pairs(f"tsv:{path}")
    assert f"{path}:4:" in str(info.value)


def test_missing_tsv_file(tmp_path):
    with pytest.raises(ValueError, match="nothere.tsv"):
        sources.load_pairs(f"tsv:{tmp_path / 'nothere.tsv'}")


@pytest.mark.parametrize("content, reason", [
    (None, "is a directory"), (b"", "is empty (0 bytes)"), (b"\n  \r\n\n", "has only blank lines"),
])
def test_tsv_that_holds_no_pair_names_the_file(tmp_path, content, reason):
    path = tmp_path / "pairs.tsv"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        sources.load_pairs(f"tsv:{path}", "all")
    assert f"TSV file {path} {reason}" in str(info.value)
    assert "not found" not in str(info.value)


def test_tsv_split_is_deterministic_and_disjoint(tmp_path):
    lines = [f"sentence {i}\tSatz {i}" for i in range(200)] + ["sentence 7\tSatz sieben"]
    path = _write(tmp_path / "p.tsv", ("\ufeff" + "\r\n".join(lines) + "\n").encode("utf-8"))
    spec = f"tsv:{path}"
    train = sources.load_pairs(spec, "train", valid_fraction=0.1)
    valid = sources.load_pairs(spec, "valid", valid_fraction=0.1)
    assert len(valid) in (20, 21) and len(train) + len(valid) == 201
    assert not {s for s, _ in train} & {s for s, _ in valid}
    assert train[0] in (("sentence 0", "Satz 0"), ("sentence 1", "Satz 1"))
    # Same split from a shuffled copy of the file: it depends on the sentences only.
    shuffled = _write(tmp_path / "q.tsv", "\n".join(reversed(lines)).encode("utf-8"))
    assert set(sources.load_pairs(f"tsv:{shuffled}", "valid", valid_fraction=0.1)) == set(valid)
    assert len(sources.load_pairs(spec, "all")) == 201
    ds = sources.load_dataset(spec, "valid", valid_fraction=0.1)
    assert [(s.decode(), t.decode()) for s, t in ds.as_numpy_iterator()] == valid
    with pytest.raises(ValueError, match="valid_fraction=1.5"):
        sources.split_pairs(train, valid_fraction=1.5)


def test_embedded_source_splits(pairs):
    valid = sources.load_pairs("embedded", "valid", limit=20)
    assert len(pairs) == 300 and len(valid) == 20
    assert not {s for s, _ in pairs} & {s for s, _ in valid}
    assert sources.load_pairs("embedded", "all", limit=5) == pairs[:5]


def test_tfds_source_under_mock_data(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TFDS's info folders go here
    with tfds.testing.mock_data(num_examples=6):
        train = sources.load_pairs("tfds:ted_hrlr_translate/pt_to_en", "train")
        valid = sources.load_dataset("tfds:ted_hrlr_translate/pt_to_en", "valid", limit=4)
        valid = list(valid.as_numpy_iterator())
        supervised = tfds.load("ted_hrlr_translate/pt_to_en", split="train", as_supervised=True)
        expected = [(pt.decode(), en.decode()) for pt, en in supervised.as_numpy_iterator()]
    assert train == expected  # (source, target) = (pt, en), the supervised keys
    assert len(train) == 6 and len(valid) == 4
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in train)
    assert all(isinstance(s, bytes) and isinstance(t, bytes) for s, t in valid)


def _collect(batches):
    return [(x["source"].numpy(), x["target_in"].numpy(), y.numpy()) for x, y in batches]


def test_batches_respect_token_budget_and_shift_targets(pairs, tokenizer):
    batches, stats = batching.make_batches(
        sources.load_dataset("embedded", limit=300), tokenizer, batch_tokens=120, max_length=64
    )
    assert batches.element_spec[0]["source"].dtype == tf.int32
    collected = _collect(batches)
    assert stats.result() == {"kept": 300, "dropped": 0}
    decoded = []
    for source, target_in, target_out in collected:
        width = max(source.shape[1], target_in.shape[1])
        assert source.shape[0] * width <= 120 or source.shape[0] == 1
        assert target_in.shape == target_out.shape
        np.testing.assert_array_equal(target_in[:, 0], tokenizer.bos_id)
        for s_row, in_row, out_row in zip(source, target_in, target_out):
            m = int((s_row != 0).sum())
            assert s_row[m - 1] == tokenizer.eos_id and np.all(s_row[m:] == 0)
            n = int((out_row != 0).sum())
            assert out_row[n - 1] == tokenizer.eos_id and np.all(out_row[n:] == 0)
            np.testing.assert_array_equal(in_row[1:n], out_row[: n - 1])
            assert np.all(in_row[n:] == 0)
            decoded.append(tokenizer.decode(s_row[: m - 1].tolist()))
    assert collections.Counter(decoded) == collections.Counter(s for s, _ in pairs)


def test_over_long_examples_are_dropped_and_counted(pairs, tokenizer):
    max_length = 14
    expected_dropped = sum(
        len(tokenizer.encode(s)) + 1 > max_length or len(tokenizer.encode(t)) + 1 > max_length
        for s, t in pairs
    )
    assert 0 < expected_dropped < len(pairs)
    batches, stats = batching.make_batches(
        sources.load_dataset("embedded", limit=300), tokenizer, batch_tokens=64,
        max_length=max_length,
    )
    collected = _collect(batches)
    assert stats.result() == {"kept": 300 - expected_dropped, "dropped": expected_dropped}
    assert sum(s.shape[0] for s, _, _ in collected) == 300 - expected_dropped
    assert max(max(s.shape[1], t.shape[1]) for s, t, _ in collected) <= max_length
    _collect(batches)  # a second epoch counts again
    assert stats.result()["dropped"] == 2 * expected_dropped
    stats.reset()
    assert stats.result() == {"kept": 0, "dropped": 0}


def test_batches_are_deterministic_by_seed(tokenizer):
    def batches(seed, **kwargs):
        batches, _ = batching.make_batches(
            sources.load_dataset("embedded", limit=120), tokenizer, 200, 64, seed=seed, **kwargs
        )
        return _collect(batches)

    def source_ids(seed):
        return [s.tolist() for s, _, _ in batches(seed)]

    assert source_ids(1) == source_ids(1)
    assert source_ids(1) != source_ids(2)
    # Padded to the bucket width: source and targets share it, one width per bucket.
    bucket_widths = {bound - 1 for bound in batching.bucket_boundaries(64)}
    shapes = [(s.shape[1], t.shape[1]) for s, t, _ in batches(1, pad_to_bucket_boundary=True)]
    assert all(s == t and s in bucket_widths for s, t in shapes)


def test_make_batches_bad_arguments(tokenizer):
    ds = sources.load_dataset("embedded", limit=2)
    with pytest.raises(ValueError, match="batch_tokens=0"):
        batching.make_batches(ds, tokenizer, batch_tokens=0)
    with pytest.raises(ValueError, match="max_length=1"):
        batching.make_batches(ds, tokenizer, max_length=1)
