"""translate.py and evaluate_nmt.py on bad input: one ``error:`` line naming what to fix.

Each runs the script's ``main`` in process through ``run_cli``, and fails before any model is
loaded; the successful runs are in test_nmt_pipeline.py.
"""

import importlib.util
import io
import sys
from pathlib import Path

import pytest

from nlp import evaluate
from tfx_transformer.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _script(name):
    spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def translate_py():
    return _script("translate.py")


@pytest.fixture(scope="module")
def evaluate_py():
    return _script("evaluate_nmt.py")


def _error(capsys, code):
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0], out


def _fake_export(path, detector=False):
    """A directory that passes the cheap checks (a saved_model.pb) but holds no real model."""
    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"not loaded by these tests")
    if detector:
        (path / "classes.json").write_text('{"class_names": ["cat"], "category_ids": null}')
    return str(path)


@pytest.mark.parametrize("value", ["-1", "0"])
def test_batch_size_must_be_positive(translate_py, capsys, value):
    with pytest.raises(SystemExit) as info:  # argparse: usage, then the error line
        run_cli(translate_py.main, ["--model", "m", "--batch-size", value, "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"argument --batch-size: must be > 0, got '{value}'" in err
    with pytest.raises(ValueError, match=f"`batch_size` must be an integer >= 1. Received: "
                                         f"batch_size={value}"):
        evaluate.translate_all(lambda texts: texts, ["a"], int(value))


@pytest.mark.parametrize("script", ["translate.py", "evaluate_nmt.py"])
def test_model_that_is_a_detector_export(tmp_path, capsys, script):
    model = _fake_export(tmp_path / "detr_export", detector=True)
    extra = ["hi"] if script == "translate.py" else ["--data", "embedded"]
    line, out = _error(capsys, run_cli(_script(script).main, ["--model", model, *extra]))
    assert line == (f"error: --model {model} is a detector export (has classes.json), not a "
                    "translator: use scripts/detect.py")
    assert out == ""


@pytest.mark.parametrize("script", ["translate.py", "evaluate_nmt.py"])
def test_model_that_is_no_export(tmp_path, capsys, script):
    (tmp_path / "work").mkdir()
    extra = ["hi"] if script == "translate.py" else ["--data", "embedded"]
    model = str(tmp_path / "work")
    line, _ = _error(capsys, run_cli(_script(script).main, ["--model", model, *extra]))
    assert line.startswith(f"error: --model {model} has no saved_model.pb, so it is no export")


def test_non_utf8_stdin_names_the_line_and_translates_nothing(translate_py, tmp_path, capsys,
                                                              monkeypatch):
    model = _fake_export(tmp_path / "export")
    stdin = io.TextIOWrapper(io.BytesIO(b"I have three apples.\nOK\n\xff\xfe bad\nlast\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    line, out = _error(capsys, run_cli(translate_py.main, ["--model", model]))
    assert line.startswith("error: stdin:3: line is not valid UTF-8 (invalid start byte at byte 1)")
    assert line.endswith("nothing was translated.")
    assert out == ""


def test_stdin_lines_are_read_without_line_ends(translate_py):
    stream = io.TextIOWrapper(io.BytesIO("\ufeffeins\r\nzwei\n\ndrei".encode("utf-8")))
    assert translate_py.read_lines(stream) == ["eins", "zwei", "", "drei"]
    assert translate_py.read_lines(io.StringIO("a\nb\n")) == ["a", "b"]


def test_undecodable_text_argument(translate_py, tmp_path, capsys):
    model = _fake_export(tmp_path / "export")
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    line, out = _error(capsys, run_cli(translate_py.main, ["--model", model, "fine", bad]))
    assert line.startswith("error: TEXT argument 2 is not valid UTF-8")
    assert out == ""


@pytest.mark.parametrize("content, reason", [
    (None, "is a directory"), (b"", "is empty (0 bytes)"), (b"a\tb\nno tab\n", ":2: expected"),
])
def test_evaluate_data_errors_name_the_file(evaluate_py, tmp_path, capsys, content, reason):
    model = _fake_export(tmp_path / "export")
    data = tmp_path / "pairs.tsv"
    if content is None:
        data.mkdir()
    else:
        data.write_bytes(content)
    line, _ = _error(capsys, run_cli(evaluate_py.main, ["--model", model, "--data", f"tsv:{data}"]))
    assert str(data) in line and reason in line
