"""Every script fed bad input: exit code 2, one `error:` line naming what to fix, nothing lost.

Each case runs the ``main`` of the script's command in this process as the script does, with
`keras.Model.fit` trapped (a case that gets to training fails at once); a few run again from
the shell, TensorFlow's start-up logging not suppressed. Checked: exit code 2; stderr is one
``error:`` line (after argparse's usage) matching every pattern; no traceback; no file under the
case's folder or the fixtures changed. Run: pytest tests/scripts/test_cli_battery.py
"""

import io
import os
import subprocess
import sys
from unittest import mock

import keras
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_cases import CASES, HELD, ROOT, Stopped, check, prepare, run_command, snapshot  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_named_error(case, fx, tmp_path, monkeypatch, capsys):
    argv = prepare(case, tmp_path, fx)
    monkeypatch.setattr(keras.Model, "fit", mock.Mock(side_effect=Stopped("training started")))
    monkeypatch.chdir(tmp_path)
    for name in ("TF_CONFIG", "TFX_TRANSFORMER_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    if case.stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(case.stdin), "utf-8"))
    before = snapshot(tmp_path, fx)
    try:
        code = run_command(argv[0], argv[1:], seconds=60)
    finally:
        while HELD:
            os.close(HELD.pop())
    err = capsys.readouterr().err
    problems = check(case, code, err, before, snapshot(tmp_path, fx))
    assert not problems, f"{case.command}: {problems}\nstderr:\n{err[-2000:]}"



def test_the_battery_covers_every_script():
    assert {case.command.split()[0] for case in CASES} == {f"{name}.py" for name in (
        "train_nmt", "translate", "evaluate_nmt", "train_detr", "detect", "evaluate_detr",
        "quickstart")}
    assert len(CASES) >= 45 and len({case.id for case in CASES}) == len(CASES)
    assert sorted(case.command.split()[0] for case in SHELL) == [
        "train_detr.py", "train_nmt.py", "translate.py"]


# Run again from the shell, the real entry points, one case per script (started together:
# each pays TensorFlow's import): a train_nmt.py data error found after the tokenizer is trained
# (what C++ code writes to file descriptor 2 reaches the shell, not `capsys`), a DETR data
# error, and a bad line of stdin. The shell adds TensorFlow's quiet start and the exit status of
# the script, the same for every case of a script; the cases themselves, argparse errors among
# them, all run above through the same `main`.
SHELL = [case for case in CASES if case.id in (
    "nmt-all-filtered", "detr-coco-missing", "translate-stdin-utf8")]


@pytest.fixture(scope="module")
def shell_runs(fx, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in (
        "TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG", "TFX_TRANSFORMER_DEBUG", "TFX_TRANSFORMER_VERBOSE")}
    runs = {}
    for case in SHELL:
        root = tmp_path_factory.mktemp(case.id)
        argv = prepare(case, root, fx)
        before = snapshot(root, fx)
        process = subprocess.Popen([sys.executable, ROOT / "scripts" / argv[0], *argv[1:]],
                                   cwd=root, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process.stdin.write(case.stdin or b"")
        process.stdin.close()
        process.stdin = None  # so that communicate() does not touch it
        runs[case.id] = (root, before, process)
    yield runs
    for _, _, process in runs.values():
        process.kill()  # a no-op for those that ended


@pytest.mark.xdist_group("cli_shell")  # one worker starts the processes of `shell_runs`
@pytest.mark.parametrize("case", SHELL, ids=[case.id for case in SHELL])
def test_bad_input_from_the_shell(case, fx, shell_runs):
    root, before, process = shell_runs[case.id]
    try:
        err, code = process.communicate(timeout=120)[1], process.returncode
    except subprocess.TimeoutExpired:
        process.kill()
        err, code = process.communicate()[1], "still running after 120 s"
    err = err.decode("utf-8", "replace")
    problems = check(case, code, err, before, snapshot(root, fx))
    assert not problems, f"{case.command}: {problems}\nstderr:\n{err[-2000:]}"
