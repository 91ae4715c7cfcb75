"""Two real `MultiWorkerMirroredStrategy` workers on 127.0.0.1 train NMT, then DETR.

Each worker is its own process with its own ``TF_CONFIG`` and work directory; both run
`nlp.train.train_nmt` and `vision.training.train.train_detr` for two steps. They must end with the
same weights (their halves of each global batch differ, so only synchronized steps agree),
the non-chief must get the chief's tokenizer, and only the chief writes (``export/``,
``metrics.json``, ``tokenizer.model``). A rerun of the finished NMT run ends at once on
both. Each process is killed at a deadline, and a worker that fails stops the other one: the
test fails with both logs and never hangs.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_S = 420  # for both workers together; the run takes about two minutes on two cores

WORKER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import keras
    from nlp.config import preset as nmt_preset
    from nlp.train import train_nmt
    from tfx_transformer.training.run import RunOptions
    from vision.config import preset as detr_preset
    from vision.training.train import train_detr

    out = sys.argv[1]

    class KeepWeights(keras.callbacks.Callback):  # the weights fit ends with
        def __init__(self, name):
            super().__init__()
            self.name = name

        def on_train_end(self, logs=None):
            np.savez(os.path.join(out, self.name + ".npz"), *self.model.get_weights())

    run = RunOptions(strategy="multi_worker", max_steps=2, eval_limit=1)
    nmt = nmt_preset("tiny", valid_sentences=0, vocab_size=300, d_model=16, num_heads=2,
                     ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1, beam_size=1,
                     extra_length=2)
    train_nmt("embedded", os.path.join(out, "nmt"), nmt, run, callbacks=[KeepWeights("nmt")])
    detr = detr_preset("tiny", hidden_dim=16, num_heads=2, ffn_dim=32, num_queries=8,
                       num_encoder_layers=1, num_decoder_layers=1, tiny_filters=(8, 16),
                       batch_size=2, image_size=32, max_image_size=32)
    train_detr("embedded", os.path.join(out, "detr"), detr, run,
               callbacks=[KeepWeights("detr")])
    # A rerun of the finished run: every worker reads the chief's run.json and stops at once
    # (alone, the other worker would wait in fit for a chief that never comes).
    print("RERUN", train_nmt("embedded", os.path.join(out, "nmt"), nmt, run), flush=True)
    print("WORKER DONE", flush=True)
    sys.stderr.flush()
    os._exit(0)  # the collective runtime's teardown only costs time here
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


def _run_workers(tmp_path, count: int = 2) -> list[str]:
    """Runs ``count`` workers to the end; returns their logs. Fails on an error or timeout."""
    ports = _free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    procs, logs = [], []
    for index in range(count):
        out = tmp_path / f"worker-{index}"
        out.mkdir()
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "3",
               "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": ""}
        env.pop("TFX_TRANSFORMER_FAULT", None)
        log = open(tmp_path / f"worker-{index}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(out)], cwd=ROOT,
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline, failed = time.monotonic() + DEADLINE_S, None
    try:
        while any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs:  # a worker left alone would wait for its peer for ever
            if p.poll() is None:
                p.kill()
            p.wait()
        for log in logs:
            log.close()
    texts = [(tmp_path / f"worker-{i}.log").read_text() for i in range(count)]
    report = "\n".join(f"--- worker {i} (exit {p.returncode}) ---\n{text[-3000:]}"
                       for i, (p, text) in enumerate(zip(procs, texts)))
    assert all(p.returncode == 0 for p in procs), (
        f"worker {failed} failed" if failed is not None else
        f"the workers did not finish within {DEADLINE_S} s") + "\n" + report
    assert all("WORKER DONE" in text for text in texts), report
    return texts


@pytest.mark.slow
def test_two_workers_train_nmt_and_detr_in_sync_and_only_the_chief_writes(tmp_path):
    chief_log, other_log = _run_workers(tmp_path)
    chief, other = tmp_path / "worker-0", tmp_path / "worker-1"
    for name in ("nmt", "detr"):
        with np.load(chief / f"{name}.npz") as a, np.load(other / f"{name}.npz") as b:
            assert len(a.files) == len(b.files) > 0
            for key in a.files:
                np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{name} weight {key}")
        assert (chief / name / "export").is_dir() and (chief / name / "metrics.json").is_file()
        assert not (other / name / "export").exists(), name
        assert not (other / name / "metrics.json").exists(), name
        steps = json.loads((chief / name / "run.json").read_text())["steps"]
        assert steps == 2, (name, steps)
    assert (chief / "nmt" / "tokenizer.model").is_file()
    assert not (other / "nmt" / "tokenizer.model").exists()
    assert "tokenizer: received from the chief worker" in other_log
    assert "this run finished earlier" in chief_log and "this run finished earlier" in other_log
    assert "RERUN {}" in other_log and "RERUN {'bleu'" in chief_log
    assert "2 replica(s)" in chief_log  # DETR's model line: the global batch is split in two
