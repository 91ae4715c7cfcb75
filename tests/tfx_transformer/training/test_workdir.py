"""Tests for tfx_transformer.training.workdir: the work directory and metrics.json."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.training.workdir import (
    Workdir,
    read_metrics,
    read_state,
    to_json,
    write_metrics,
    write_state,
)


def test_write_metrics_merges_and_converts(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    write_metrics(tmp_path, {"a": 1, "eval": {"bleu": 20.5}})
    merged = write_metrics(Workdir(tmp_path), {
        "b": np.float32(0.5), "eval": {"chrf": np.float64(40.0)}, "n": np.int64(7),
        "arr": np.arange(3), "nan": float("nan"), "t": tf.constant(2.0)})
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk == merged == read_metrics(tmp_path) == {
        "a": 1, "b": 0.5, "eval": {"bleu": 20.5, "chrf": 40.0}, "n": 7, "arr": [0, 1, 2],
        "nan": None, "t": 2.0}
    assert type(on_disk["n"]) is int
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "logs", "metrics.json", "notes.txt"]
    (tmp_path / "metrics.json").write_text("{broken")
    with pytest.raises(ValueError, match="metrics.json is not valid JSON"):
        write_metrics(tmp_path, {"c": 1})
    assert (tmp_path / "metrics.json").read_text() == "{broken"  # never overwritten


def test_read_metrics_of_a_new_directory_is_empty(tmp_path):
    assert read_metrics(tmp_path / "nothing") == {}


class _PathLike(os.PathLike):
    def __fspath__(self):
        return "/x/y"


def test_to_json():
    assert to_json({1: (np.int32(2), [np.float16(0.5)]), "p": _PathLike()}) == {
        "1": [2, [0.5]], "p": "/x/y"}
    assert to_json(float("-inf")) is None and to_json(np.array([np.nan, 1.0])) == [None, 1.0]
    with pytest.raises(TypeError, match="Received: object"):
        to_json({"bad": object()})


def test_workdir_keeps_existing_files(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "old.weights.h5").write_text("x")
    (tmp_path / "tokenizer.model").write_text("y")
    workdir = Workdir(tmp_path)
    assert (tmp_path / "checkpoints" / "old.weights.h5").read_text() == "x"
    assert (tmp_path / "tokenizer.model").read_text() == "y"
    assert workdir.logs.is_dir() and workdir.checkpoints == tmp_path / "checkpoints"
    assert workdir.metrics == tmp_path / "metrics.json"
    assert (workdir.export, workdir.backup) == (tmp_path / "export", tmp_path / "backup")
    assert workdir.latest_checkpoint() is None  # old.weights.h5 is not an epoch checkpoint
    for epoch in (2, 10, 9):
        (tmp_path / "checkpoints" / f"epoch-{epoch:03d}.weights.h5").write_text("")
    assert workdir.latest_checkpoint().name == "epoch-010.weights.h5"
    Workdir(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir" / "checkpoints").is_dir()
    with pytest.raises(ValueError, match="tokenizer.model"):
        Workdir(tmp_path / "tokenizer.model")


def test_metrics_json_must_hold_an_object(tmp_path):
    for text, message in (("[]", "must hold a JSON object, not list"),
                          ("3", "not int"), ("\xff", "not valid JSON")):
        (tmp_path / "metrics.json").write_text(text, encoding="latin-1")
        with pytest.raises(ValueError, match=message) as info:
            write_metrics(tmp_path, {"a": 1})
        assert str(tmp_path / "metrics.json") in str(info.value)
        assert (tmp_path / "metrics.json").read_text(encoding="latin-1") == text


def test_run_state_is_merged_and_checked(tmp_path):
    assert read_state(tmp_path) == {}
    write_state(tmp_path, phase="training", request={"epochs": 3})
    assert write_state(tmp_path, phase="trained", steps=np.int64(6)) == read_state(tmp_path) == {
        "phase": "trained", "request": {"epochs": 3}, "steps": 6}
    assert sorted(os.listdir(tmp_path)) == ["run.json"]  # no temporary file left
    (tmp_path / "run.json").write_text('{"phase": "half"}')
    with pytest.raises(ValueError, match="unknown phase 'half'"):
        read_state(tmp_path)
