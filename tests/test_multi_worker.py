"""Real `MultiWorkerMirroredStrategy` workers on 127.0.0.1, in one flow of two phases.

Phase 1: two workers train DETR, rerun the finished run, then run the user's command
(``train_nmt.py``'s ``main``, in the same process) whose chief kills itself mid-run. Each
worker is its own process with its own ``TF_CONFIG``, work directories and temp folder. They
must end the DETR run with the same weights (their halves of each global batch differ, so only
synchronized steps agree), only the chief writes (``export/``, ``metrics.json``), nothing is
left in a temp folder, and a rerun of the finished run ends at once on both. When the chief is
killed, the other worker (which got the chief's tokenizer) ends with one ``error:`` line within
60 s. Phase 2: the same command (``scripts/train_nmt.py``, with ``--patience``) on both resumes
from the chief's backup, in sync, and both stop after the same epoch on the chief's held-out
BLEU, which only the chief computes (patience counts the epochs of the killed process too).
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
    from nlp.commands.train import main as train_nmt_command
    import numpy as np
    import keras
    from tfx_transformer.training.run import RunOptions
    from vision.config import preset as detr_preset
    from vision.training.train import train_detr

    out, command = sys.argv[1], json.loads(sys.argv[2])

    class KeepWeights(keras.callbacks.Callback):  # the weights fit ends with
        def on_train_end(self, logs=None):
            np.savez(os.path.join(out, "detr.npz"), *self.model.get_weights())

    run = RunOptions(strategy="multi_worker", max_steps=2, eval_limit=1)
    detr = detr_preset("tiny", hidden_dim=16, num_heads=2, ffn_dim=32, num_queries=8,
                       num_encoder_layers=1, num_decoder_layers=1, tiny_filters=(8, 16),
                       batch_size=2, image_size=32, max_image_size=32)
    train_detr("embedded", os.path.join(out, "detr"), detr, run, callbacks=[KeepWeights()])
    # A rerun of the finished run: every worker reads the chief's run.json and stops at once
    # (alone, the other worker would wait in fit for a chief that never comes).
    print("RERUN", train_detr("embedded", os.path.join(out, "detr"), detr, run), flush=True)
    # Nothing outlives the runs outside their work directories (autograph's files go at the
    # interpreter's exit, which this process never reaches; phase 2 checks them).
    temp = os.environ["TMPDIR"]
    print("TEMP LEFT", [name for name in os.listdir(temp)
                        if not name.startswith("__autograph_generated_file")], flush=True)
    print("RUNS DONE", flush=True)
    # The user's command; the chief SIGKILLs itself just before epoch 2's first step (the
    # testing hook), the other worker's watch of the chief ends this process.
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        os.environ["TFX_TRANSFORMER_FAULT"] = "epoch:2"
    code = train_nmt_command(command)
    print("COMMAND EXIT", code, flush=True)
    sys.stderr.flush()
    os._exit(code)  # the collective runtime's teardown only costs time here
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
    chief_log, other_log = (_read(tmp_path, "run", i, "out") + _read(tmp_path, "run", i, "err")
                            for i in range(2))
    for log in (chief_log, other_log):
        assert "RUNS DONE" in log and "TEMP LEFT []" in log, report

    # The run: the same weights on both workers, only the chief writes.
    chief, other = tmp_path / "worker-0", tmp_path / "worker-1"
    with np.load(chief / "detr.npz") as a, np.load(other / "detr.npz") as b:
        assert len(a.files) == len(b.files) > 0
        for key in a.files:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7,
                                       err_msg=f"weight {key}")
    assert (chief / "detr" / "export").is_dir() and (chief / "detr" / "metrics.json").is_file()
    assert not [p for p in (other / "detr").rglob("*") if p.is_file() and p.name != ".lock"]
    assert json.loads((chief / "detr" / "run.json").read_text())["steps"] == 2
    assert "this run finished earlier" in chief_log and "this run finished earlier" in other_log
    assert "RERUN {}" in other_log and "RERUN {'" in chief_log, report
    assert "2 replica(s)" in chief_log  # DETR's model line: the global batch is split in two

    # The command: the chief killed itself, the other worker ended with one error line.
    assert procs[0].returncode == -signal.SIGKILL, report
    assert procs[1].returncode not in (0, -signal.SIGKILL) and waited < KILL_WITHIN_S, report
    err = _read(tmp_path, "run", 1, "err")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the chief (worker 0 at 127.0.0.1:" in errors[0], report
    assert "Traceback" not in err, report
    assert "tokenizer: received from the chief worker" in other_log, report
    assert json.loads((tmp_path / "work-0" / "backup" / "training_metadata.json").read_text(
        ))["epoch"] == 1

    # Phase 2, the same command on both (scripts/train_nmt.py): the chief resumes from its
    # backup (epoch 2), the other worker from the chief's state; a disagreement, or a stop
    # decided by one worker alone, would leave one waiting for the other.
    ports = _free_ports(2)
    procs = [_start(tmp_path, "resumed", [ROOT + "/scripts/train_nmt.py",
                                          *_command(tmp_path, tsv, i)], i, ports)
             for i in range(2)]
    report = _finish(tmp_path, "resumed", procs, time.monotonic() + DEADLINE_S)
    assert [p.returncode for p in procs] == [0, 0], report
    work = tmp_path / "work-0"
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
    # Only the chief writes: its export and tokenizer; the other worker's directory is empty.
    assert (work / "export" / "saved_model.pb").is_file() and (work / "tokenizer.model").is_file()
    assert not [p for p in (tmp_path / "work-1").rglob("*")
                if p.is_file() and p.name != ".lock"], report
    for index in range(2):
        assert not list((tmp_path / f"resumed-temp-{index}").iterdir()), index
