"""Real `MultiWorkerMirroredStrategy` workers on 127.0.0.1: the user's translation command,
killed and resumed, in two phases.

Phase 1: two workers run ``train_nmt.py``'s command (its ``main``, in the same process, each
with its own ``TF_CONFIG``, work directory and temp folder); the chief kills itself just before
epoch 2. The workers must end epoch 1 with the same weights (their halves of each global batch
differ, so only synchronized steps agree), the non-chief must get the chief's tokenizer, and
when the chief is killed the other worker ends with one ``error:`` line within 60 s. Phase 2:
the same command on both resumes from the chief's backup, in sync; both stop after the same
epoch on ``--patience`` over the chief's held-out BLEU, which only the chief computes (epoch 1,
of the killed process, counts); then the same command again ends at once on both (the chief's
run.json says the run is finished). Only the chief writes, nothing is left in a temp folder.
Each process is killed at a deadline, and a worker that fails stops the other one: the test
fails with both logs and never hangs.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 480  # for both workers of one phase; phase 1 takes about a minute on two cores
KILL_WITHIN_S = 60

WORKER = textwrap.dedent("""
    import json, os, sys
    # First, as in scripts/train_nmt.py: oneDNN asked for and TensorFlow's quiet start.
    from nlp.commands import train as command
    import numpy as np
    import keras

    out, argv = sys.argv[1], json.loads(sys.argv[2])

    class KeepWeights(keras.callbacks.Callback):  # the weights of every epoch's end
        def on_epoch_end(self, epoch, logs=None):
            np.savez(os.path.join(out, f"epoch-{epoch + 1}.npz"), *self.model.get_weights())

    train_nmt = command.train_nmt  # the command's training, with KeepWeights added

    def train_nmt_keeping_weights(*args, callbacks=(), **kwargs):
        return train_nmt(*args, callbacks=[*callbacks, KeepWeights()], **kwargs)

    command.train_nmt = train_nmt_keeping_weights
    # The chief SIGKILLs itself just before epoch 2's first step (the testing hook), the
    # other worker's watch of the chief ends this process.
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        os.environ["TFX_TRANSFORMER_FAULT"] = "epoch:2"
    code = command.main(argv)
    print("COMMAND EXIT", code, flush=True)
    sys.stderr.flush()
    os._exit(code)  # the collective runtime's teardown only costs time here
""")
# Phase 2: what scripts/train_nmt.py runs, twice (the second time on the finished run).
RESUMED = textwrap.dedent("""
    import json, sys
    from nlp.commands.train import main

    argv = json.loads(sys.argv[1])
    code = main(argv)
    print("FIRST EXIT", code, flush=True)
    if code == 0:
        code = main(argv)
    sys.exit(code)
""")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _pairs(tmp_path):
    from nlp.data.embedded import generate_pairs

    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in generate_pairs(60)), encoding="utf-8")
    return tsv


def _start(tmp_path, name, argv, index, ports):
    """Worker ``index`` of ``len(ports)`` running ``argv``, its own temp folder
    (``tmp_path/NAME-temp-INDEX``); stdout and stderr go to ``NAME-INDEX.out`` / ``.err``."""
    config = {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
              "task": {"type": "worker", "index": index}}
    temp = tmp_path / f"{name}-temp-{index}"
    temp.mkdir()
    env = {**os.environ, "TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(temp)}
    env.pop("TFX_TRANSFORMER_FAULT", None)
    with open(tmp_path / f"{name}-{index}.out", "w") as out, \
            open(tmp_path / f"{name}-{index}.err", "w") as err:
        return subprocess.Popen([sys.executable, *map(str, argv)], cwd=ROOT, env=env,
                                stdout=out, stderr=err)


def _finish(tmp_path, name, procs, deadline, stop_on_failure=True):
    """Waits for ``procs`` until ``deadline`` (time.monotonic), or until one fails; kills the
    others then (a worker left alone would wait for its peer for ever). Returns a report."""
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if stop_on_failure and any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return "\n".join(
        f"--- {name} worker {i} (exit {p.returncode}) ---\n"
        f"{_read(tmp_path, name, i, 'out')[-2500:]}\n{_read(tmp_path, name, i, 'err')[-2500:]}"
        for i, p in enumerate(procs))


def _read(tmp_path, name, index, kind):
    return (tmp_path / f"{name}-{index}.{kind}").read_text()


def _command(tmp_path, tsv, index):
    """train_nmt.py's arguments as worker ``index``'s user types them."""
    return ["--data", f"tsv:{tsv}", "--preset", "tiny", "--workdir",
            str(tmp_path / f"work-{index}"), "--strategy", "multi_worker", "--epochs", "4",
            "--patience", "1", "--vocab-size", "120", "--batch-tokens", "400", "--beam", "1",
            "--valid-fraction", "0.1"]


def _run_phase_1(tmp_path, tsv):
    """The two WORKER processes: until the chief kills itself in the command, then until the
    other one ends (at most KILL_WITHIN_S later). Returns (processes, seconds the other one
    took to end after the chief, report)."""
    ports, procs = _free_ports(2), []
    for index in range(2):
        (tmp_path / f"worker-{index}").mkdir()
        argv = ["-c", WORKER, tmp_path / f"worker-{index}",
                json.dumps(_command(tmp_path, tsv, index))]
        procs.append(_start(tmp_path, "run", argv, index, ports))
    deadline = time.monotonic() + DEADLINE_S
    while procs[0].poll() is None and procs[1].poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if procs[0].poll() is None:  # past the deadline, or the other worker ended first: failed
        report = _finish(tmp_path, "run", procs, time.monotonic())
        pytest.fail("the chief did not end first\n" + report)
    killed_at = time.monotonic()
    report = _finish(tmp_path, "run", procs, killed_at + KILL_WITHIN_S, stop_on_failure=False)
    return procs, time.monotonic() - killed_at, report


@pytest.mark.slow
def test_two_workers_in_sync_only_the_chief_writes_a_killed_chief_ends_both_and_resumes(
        tmp_path):
    tsv = _pairs(tmp_path)
    procs, waited, report = _run_phase_1(tmp_path, tsv)
    other_log = _read(tmp_path, "run", 1, "out") + _read(tmp_path, "run", 1, "err")

    # Epoch 1: the same weights on both workers.
    chief, other = tmp_path / "worker-0", tmp_path / "worker-1"
    with np.load(chief / "epoch-1.npz") as a, np.load(other / "epoch-1.npz") as b:
        assert len(a.files) == len(b.files) > 0, report
        for key in a.files:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7,
                                       err_msg=f"weight {key}")
    assert not (chief / "epoch-2.npz").exists() and not (other / "epoch-2.npz").exists()
    assert "tokenizer: received from the chief worker" in other_log, report

    # The chief killed itself, the other worker ended with one error line.
    assert procs[0].returncode == -signal.SIGKILL, report
    assert procs[1].returncode not in (0, -signal.SIGKILL) and waited < KILL_WITHIN_S, report
    err = _read(tmp_path, "run", 1, "err")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the chief (worker 0 at 127.0.0.1:" in errors[0], report
    assert "Traceback" not in err, report
    work = tmp_path / "work-0"
    assert json.loads((work / "backup" / "training_metadata.json").read_text())["epoch"] == 1

    # Phase 2, the same command on both: the chief resumes from its backup (epoch 2), the
    # other worker from the chief's state; a disagreement, or a stop decided by one worker
    # alone, would leave one waiting for the other.
    ports = _free_ports(2)
    procs = [_start(tmp_path, "resumed", ["-c", RESUMED, json.dumps(_command(tmp_path, tsv, i))],
                    i, ports) for i in range(2)]
    report = _finish(tmp_path, "resumed", procs, time.monotonic() + DEADLINE_S)
    assert [p.returncode for p in procs] == [0, 0], report
    logs = [_read(tmp_path, "resumed", i, "out") + _read(tmp_path, "resumed", i, "err")
            for i in range(2)]
    metrics = json.loads((work / "metrics.json").read_text())
    epochs = [e["epoch"] for e in metrics["history"]]
    # Patience 1 on the chief's BLEU, which the other worker never computes: both stopped
    # after the same epoch. (val_bleu of a model this small stays flat, so patience stops
    # it; epoch 1's score, from the killed process, counts.)
    assert epochs == list(range(1, len(epochs) + 1)) and all("val_bleu" in e
                                                            for e in metrics["history"])
    stopped = metrics["train"]["stopped_by"]
    assert "did not improve for 1 epochs" in stopped and 2 <= len(epochs) < 4, report
    state = json.loads((work / "run.json").read_text())
    assert state["phase"] == "finished"
    assert state["steps"] == len(epochs) * metrics["data"]["train_batches"], state
    # The second run of the command: every worker read the chief's run.json and stopped at
    # once (alone, the other worker would wait in fit for a chief that never comes). The
    # chief reports the held-out scores of both runs, the other worker none.
    for log in logs:
        assert "FIRST EXIT 0" in log and "this run finished earlier" in log, report
    assert logs[0].count("held-out: bleu") == 2 and "held-out:" not in logs[1], report
    # Only the chief writes: its export and tokenizer; the other worker's directory is empty.
    assert (work / "export" / "saved_model.pb").is_file() and (work / "tokenizer.model").is_file()
    assert not [p for p in (tmp_path / "work-1").rglob("*")
                if p.is_file() and p.name != ".lock"], report
    for index in range(2):
        assert not list((tmp_path / f"resumed-temp-{index}").iterdir()), index
