"""``serve.py``'s refusals: one ``error:`` line naming the flag, exit code 2, nothing started."""

import socket

import pytest

from tfx_transformer.commands.serve import main

pytestmark = pytest.mark.xdist_group("serving")


def _refused(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_nothing_to_serve(capsys):
    assert "give --translator DIR and/or --detector DIR" in _refused(capsys)


def test_an_export_of_the_other_kind_is_named(capsys, nmt_export, detr_export):
    translator, detector = str(nmt_export[2]), str(detr_export[1])
    error = _refused(capsys, "--translator", detector)
    assert error.startswith(f"error: --translator {detector} is a detector export")
    error = _refused(capsys, "--detector", translator)
    assert error.startswith("error: --detector No exported detector") or \
        "classes.json is missing" in error
    assert translator in error


def test_a_missing_directory_and_a_clash_of_names(capsys, tmp_path, nmt_export, detr_export):
    assert f"--translator {tmp_path / 'none'} does not exist" in _refused(
        capsys, "--translator", str(tmp_path / "none"))
    assert "--name-translator and --name-detector are both 'm'" in _refused(
        capsys, "--translator", str(nmt_export[2]), "--detector", str(detr_export[1]),
        "--name-translator", "m", "--name-detector", "m")
    assert "--name-detector must be letters" in _refused(
        capsys, "--detector", str(detr_export[1]), "--name-detector", "a/b")


def test_a_port_in_use(capsys, nmt_export):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"--port {port} on 127.0.0.1 is not free" in _refused(
            capsys, "--translator", str(nmt_export[2]), "--port", str(port))


@pytest.mark.parametrize("flag, value, message", [
    ("--replicas", "0", "--replicas: must be an integer >= 1"),
    ("--batch-wait-ms", "-1", "--batch-wait-ms must be >= 0"),
    ("--port", "70000", "--port must be at most 65535"),
])
def test_bad_numbers(capsys, nmt_export, flag, value, message):
    argv = ["--translator", str(nmt_export[2]), flag, value]
    if flag == "--replicas":  # argparse's own refusal: usage, then the error
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "argument --replicas: must be" in capsys.readouterr().err
        return
    assert message in _refused(capsys, *argv)
