"""translate.py and evaluate_nmt.py on bad input: one ``error:`` line naming what to fix.

Each runs the ``main`` of the script's command (`nlp.commands`) in process through ``run_cli``,
and fails before any model is loaded; the successful runs are in test_nmt_pipeline.py.
"""

import importlib
import io
import sys

import pytest

from nlp.training import evaluate
from tfx_transformer.cli import run_cli

COMMANDS = {"translate.py": "nlp.commands.translate", "evaluate_nmt.py": "nlp.commands.evaluate"}


def _script(name):
    """The command module that ``scripts/NAME`` runs."""
    return importlib.import_module(COMMANDS[name])


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
    """A directory that passes the cheap checks (a saved_model.pb and its info file) but
    holds no real model."""
    import json

    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"not loaded by these tests")
    if detector:
        (path / "classes.json").write_text('{"class_names": ["cat"], "category_ids": null}')
    else:
        (path / "translator.json").write_text(json.dumps({
            "format_version": 2, "beam_size": 3,
            "signatures": {"serving_default": {"beam_size": 3}, "greedy": {"beam_size": 1},
                           "translate_nbest": {"beam_size": 3}}}))
    return str(path)


@pytest.mark.parametrize("value", ["-1", "0"])
def test_batch_size_must_be_positive(translate_py, capsys, value):
    with pytest.raises(SystemExit) as info:  # argparse: usage, then the error line
        run_cli(translate_py.main, ["--model", "m", "--batch-size", value, "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"argument --batch-size: must be a positive integer, got '{value}'" in err
    with pytest.raises(ValueError, match=f"`batch_size` must be a positive integer. Received: "
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


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A stand-in export (no model): ``nbest`` translates to upper case and lists 3 hypotheses,
    the upper-cased text first."""
    import json

    import tensorflow as tf

    spec = tf.TensorSpec([None], tf.string, name="text")
    upper = tf.function(lambda text: {"translation": tf.strings.upper(text)},
                        input_signature=[spec])

    def nbest(text):
        hypotheses = tf.stack([tf.strings.upper(text), text, tf.strings.join([text, "?"])], 1)
        length = tf.cast(tf.strings.length(text), tf.float32)[:, None]
        return {"hypotheses": hypotheses, "scores": -tf.constant([[0.5, 1.25, 2.0]]) - length / 100}

    root = tmp_path_factory.mktemp("stand_in")
    signatures = {"serving_default": upper, "greedy": upper,
                  "translate_nbest": tf.function(nbest, input_signature=[spec])}
    tf.saved_model.save(tf.Module(), str(root / "nbest"), signatures=signatures)
    listed = {"serving_default": {"beam_size": 3}, "greedy": {"beam_size": 1},
              "translate_nbest": {"beam_size": 3, "output_keys": ["hypotheses", "scores"]}}
    (root / "nbest" / "translator.json").write_text(json.dumps({
        "format_version": 2, "beam_size": 3, "signatures": listed, "input_key": "text",
        "output_key": "translation"}))
    return root


def test_nbest_prints_k_numbered_lines_per_sentence_in_input_order(translate_py, stand_in,
                                                                   capsys):
    texts = ["a longer sentence", "ab", "", "medium one"]
    # Batches of 2 in length order: the lists come back in input order all the same.
    code = run_cli(translate_py.main, ["--model", str(stand_in / "nbest"), "--nbest", "2",
                                       "--batch-size", "2", *texts])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 * len(texts)
    want = []
    for number, text in enumerate(texts, start=1):
        want.append(f"{number}\t{-0.5 - len(text) / 100:.4f}\t{text.upper()}")
        want.append(f"{number}\t{-1.25 - len(text) / 100:.4f}\t{text}")
    assert lines == want
    assert lines[2] == "2\t-0.5200\tAB"
    assert run_cli(translate_py.main, ["--model", str(stand_in / "nbest"), *texts]) == 0
    # The first of each list is the translation printed without --nbest.
    assert capsys.readouterr().out.splitlines() == [line.split("\t")[2] for line in lines[::2]]


def test_nbest_reads_stdin_and_prints_the_whole_beam(translate_py, stand_in, capsys,
                                                     monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"eins\nzwei\n")))
    assert run_cli(translate_py.main, ["--model", str(stand_in / "nbest"), "--nbest", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "1\t-0.5400\tEINS", "1\t-1.2900\teins", "1\t-2.0400\teins?",
        "2\t-0.5400\tZWEI", "2\t-1.2900\tzwei", "2\t-2.0400\tzwei?"]


@pytest.mark.parametrize("extra, message", [
    (["--nbest", "4"], "error: --nbest 4: this export keeps 3 hypotheses per sentence (its "
                       "beam size); give --nbest 1 to 3"),
    (["--nbest", "2", "--beam-size", "1"],
     "error: --nbest 2: n-best lists come from the export's beam search (beam size 3); leave "
     "out --beam-size 1"),
])
def test_nbest_the_export_cannot_give(translate_py, stand_in, capsys, monkeypatch, extra,
                                      message):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff not read\n")))
    line, out = _error(capsys, run_cli(translate_py.main,
                                       ["--model", str(stand_in / "nbest"), *extra]))
    assert line == message and out == ""  # and stdin was not read: its bad line is no error


@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_nbest_must_be_a_positive_integer(translate_py, capsys, value):
    with pytest.raises(SystemExit) as info:  # argparse: usage, then the error line
        run_cli(translate_py.main, ["--model", "m", "--nbest", value, "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    expected = "expected a int" if value == "x" else "must be a positive integer"
    assert f"argument --nbest: {expected}, got '{value}'" in err
