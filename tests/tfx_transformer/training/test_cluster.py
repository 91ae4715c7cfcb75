"""tfx_transformer.training.cluster in one process: the chief's state and stop decision on
every worker (the collective replaced by what the chief sent), the peer watch on a real
socket, and the data seed of a resumed run. Real workers: tests/test_multi_worker.py."""

import io
import json
import socket
import threading
import time

import keras
import numpy as np
import pytest

from tfx_transformer.training import cluster
from tfx_transformer.training.cluster import PeerWatch, WorkerAgreement
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import Trainer


def _model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 1)), epochs=seed + 1, verbose=0)  # optimizer state
    return model


def _values(model):
    return [np.array(v) for v in [*model.weights, *model.optimizer.variables]]


def test_every_worker_starts_from_the_chiefs_state_and_stops_after_its_epoch(monkeypatch):
    sent = []  # what the chief's side of each collective carries, in order
    monkeypatch.setattr(cluster, "from_replica_0", lambda local, strategy: (
        sent.append(np.array(local)), local)[1])
    chief = _model(1)
    agreement = WorkerAgreement(strategy=None)
    agreement.set_model(chief)
    agreement.on_train_begin()
    chief.stop_training = True  # its Patience stopped it
    agreement.on_epoch_end(0)
    want = _values(chief)

    received = iter(sent)

    def from_chief(local, strategy):  # every worker passes arrays of the chief's shapes
        chiefs = next(received)
        assert local.shape == chiefs.shape and local.dtype == chiefs.dtype
        return chiefs

    monkeypatch.setattr(cluster, "from_replica_0", from_chief)
    other = _model(2)  # other weights, other optimizer state (another iteration count)
    assert any(not np.array_equal(a, b) for a, b in zip(_values(other), want))
    agreement = WorkerAgreement(strategy=None)
    agreement.set_model(other)
    agreement.on_train_begin()
    for got, expected in zip(_values(other), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not other.stop_training
    agreement.on_epoch_end(0)
    assert other.stop_training is True


def _serve():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def accept():  # until the socket is closed
        try:
            while True:
                server.accept()[0].close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return server


def test_a_chief_seen_up_then_gone_ends_the_worker_with_one_named_line(monkeypatch):
    chief, never = _serve(), socket.socket()
    never.bind(("127.0.0.1", 0))  # bound, never listening: a worker that never came up
    config = {"cluster": {"worker": [f"127.0.0.1:{chief.getsockname()[1]}",
                                     "127.0.0.1:1", f"127.0.0.1:{never.getsockname()[1]}"]},
              "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    stderr, exits = io.StringIO(), []
    monkeypatch.setattr(cluster.sys, "stderr", stderr)
    watch = PeerWatch(config, poll_seconds=0.05, misses=3, exit=exits.append)
    watch.watch({"worker 0", "worker 2"})
    time.sleep(0.5)
    assert exits == [] and watch.gone() is None  # worker 2 was never seen up: not "gone"
    chief.close()
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.close()
    assert exits == [1]
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: the chief (worker 0 at {config['cluster']['worker'][0]}) stopped")


def test_a_watch_that_is_off_reports_nothing(monkeypatch):
    chief = _serve()
    config = {"cluster": {"worker": [f"127.0.0.1:{chief.getsockname()[1]}", "127.0.0.1:1"]},
              "task": {"type": "worker", "index": 1}}
    exits = []
    watch = PeerWatch(config, poll_seconds=0.05, misses=2, exit=exits.append)
    watch.watch({"worker 0"})
    time.sleep(0.3)
    watch.watch(())  # the run ended: the chief may go
    chief.close()
    time.sleep(0.5)
    watch.close()
    assert exits == []


@pytest.mark.parametrize("epochs", [0, 2])
def test_a_resumed_run_shuffles_with_another_seed_for_each_start_epoch(tmp_path, epochs):
    trainer = Trainer(tmp_path, RunOptions(seed=5))
    if epochs:
        (tmp_path / "backup").mkdir()
        (tmp_path / "backup" / "training_metadata.json").write_text(
            json.dumps({"epoch": epochs, "batch": -1}))
    trainer._read_state()
    assert trainer.resume_epoch == epochs
    seeds = {trainer.data_seed}
    if epochs:
        assert trainer.data_seed != 5
        trainer.resume_epoch = epochs + 1
        seeds.add(trainer.data_seed)
        assert len(seeds) == 2 and 5 not in seeds
    else:
        assert trainer.data_seed == 5  # a new run: --seed itself
