"""What keeps the workers of a ``multi_worker`` run together: one state, one stop decision,
and no worker left waiting for a peer that is gone.

- `WorkerAgreement` (a callback, last in the list): when `fit` begins, every worker takes the
  chief's weights and optimizer state (the chief's are restored from its backup; the other
  workers keep none), so a resumed or ``--restart``-ed run starts all of them from one state
  (the trainer passes every worker the chief's first epoch, `run.read_run_state`). Each
  epoch ends with the chief's stop decision (its ``Patience``, ``MaxSteps``, a user's
  ``EarlyStopping``) sent to every worker, so that all stop after the same epoch:
  a worker that went on alone would wait in the next step's all-reduce for ever.
- `PeerWatch`: a thread that checks, every second, that the TensorFlow servers of the peers
  it watches still accept connections. A non-chief worker watches the chief from the
  strategy's creation to the end of each run; the chief watches the other workers until the
  first training step (a worker that failed before training would leave it waiting). A peer
  seen up and then unreachable 3 times in a row ends this process: one ``error:`` line naming
  the peer, exit code 1.
- `leave_together`: every worker past `fit` before the chief goes on (to export, evaluate and
  end its process); a non-chief then stops watching it. Without it, a non-chief still in
  `fit`'s last callbacks when the chief's process ends would take the chief for lost.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any

import keras

from tfx_transformer.training.distribute import from_replica_0, is_chief, tf_config

__all__ = ["PeerWatch", "WorkerAgreement", "WorkerLostError", "chief_address", "leave_together",
           "lost_message", "peer_watch", "set_from_chief", "start_peer_watch", "watched"]

POLL_SECONDS = 1.0
MISSES = 3  # consecutive failed connections that make a peer gone


class WorkerLostError(RuntimeError):
    """A peer of a ``multi_worker`` run went away (scripts: one ``error:`` line, exit 1)."""


def chief_address(config: dict | None = None) -> tuple[str, str]:
    """``(name, "host:port")`` of the chief in ``TF_CONFIG``: ``chief 0``, else ``worker 0``."""
    cluster = (config or tf_config()).get("cluster") or {}
    kind = "chief" if cluster.get("chief") else "worker"
    return f"{kind} 0", cluster[kind][0]


def _peers(config: dict) -> dict[str, str]:
    """Every other task of the cluster: ``{"worker 1": "host:port", ...}``."""
    task = config.get("task") or {}
    me = (task.get("type"), int(task.get("index", 0)))
    return {f"{kind} {index}": address
            for kind, addresses in (config.get("cluster") or {}).items()
            for index, address in enumerate(addresses) if (kind, index) != me}


def _reachable(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class PeerWatch:
    """Ends this process when a watched peer's server goes away (module docstring).

    ``watch(names)`` sets the peers to watch (names of `_peers`, e.g. ``{"worker 0"}``);
    ``watch(())`` stops watching. A peer counts as gone only after it was seen up.
    """

    def __init__(self, config: dict, poll_seconds: float = POLL_SECONDS, misses: int = MISSES,
                 exit=os._exit):
        self.peers, self.poll_seconds, self.misses, self._exit = (
            _peers(config), poll_seconds, misses, exit)
        self._watched: set[str] = set()
        self._seen: set[str] = set()
        self._missed: dict[str, int] = {}
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfx-peer-watch", daemon=True)
        self._thread.start()

    def watch(self, names) -> None:
        with self._lock:
            self._watched = set(names) & set(self.peers)
            self._missed = {}

    def close(self) -> None:
        self._stop.set()

    def gone(self) -> str | None:
        """The first watched peer that is unreachable now (checked at once), or None."""
        with self._lock:
            watched = sorted(self._watched & self._seen)
        return next((name for name in watched if not _reachable(self.peers[name])), None)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            with self._lock:
                watched = sorted(self._watched)
            for name in watched:
                up = _reachable(self.peers[name])
                with self._lock:
                    if name not in self._watched:
                        continue
                    if up:
                        self._seen.add(name)
                        self._missed[name] = 0
                    elif name in self._seen:
                        self._missed[name] = self._missed.get(name, 0) + 1
                        if self._missed[name] >= self.misses:
                            self._fail(name)
                            return

    def _fail(self, name: str) -> None:
        sys.stdout.flush()
        sys.stderr.write(f"error: {lost_message(name, self.peers[name])}\n")
        sys.stderr.flush()
        self._exit(1)


def lost_message(name: str, address: str) -> str:
    role = "the chief" if name == chief_address()[0] else name
    return (f"{role} ({name} at {address}) stopped or cannot be reached: this worker cannot "
            "go on without it and stops too; see that worker's log, then start every worker "
            "again with the same command (the run resumes from the chief's last backup)")


_watch: dict[str, PeerWatch] = {}


def peer_watch() -> PeerWatch | None:
    """This process's `PeerWatch` (started with the ``multi_worker`` strategy), or None."""
    return _watch.get("watch")


def start_peer_watch(config: dict) -> PeerWatch:
    """Starts this process's `PeerWatch`; a non-chief watches the chief from now on."""
    if "watch" not in _watch:
        _watch["watch"] = PeerWatch(config)
    watch = _watch["watch"]
    watch.watch(set() if is_chief() else {chief_address(config)[0]})
    return watch


def watched(run):
    """``run()`` of one `Trainer` run with this process's `PeerWatch` on (a non-chief watches
    the chief) and off after; a collective that failed while a peer is unreachable raises
    `WorkerLostError` naming it."""
    import tensorflow as tf

    watch = peer_watch()
    chief = set() if is_chief() else {chief_address()[0]}
    watch.watch(chief)
    try:
        return run()
    except tf.errors.OpError as error:
        gone = watch.gone() or (None if is_chief() else next(iter(chief)))
        if gone is None or not isinstance(error, (
                tf.errors.UnavailableError, tf.errors.CancelledError,
                tf.errors.AbortedError, tf.errors.DeadlineExceededError)):
            raise
        raise WorkerLostError(lost_message(gone, watch.peers[gone])) from None
    finally:
        watch.watch(())


def leave_together(strategy: Any) -> None:
    """Every worker's end of training (a collective: each returns once all have called it);
    a non-chief stops watching the chief then (module docstring)."""
    import numpy as np

    from_replica_0(np.zeros([1], np.int32), strategy)
    watch = peer_watch()
    if watch is not None and not is_chief():
        watch.watch(())


class WorkerAgreement(keras.callbacks.Callback):
    """Every worker starts `fit` from the chief's state and stops after the chief's epoch
    (module docstring). Put it last: it runs after the callbacks that restore the backup and
    decide to stop. A no-op with one worker.

    Args:
        strategy: the run's `MultiWorkerMirroredStrategy`.
        on_first_step: called once, after the first training step (the trainer stops the
            chief's watch of the other workers there).
    """

    def __init__(self, strategy: Any, on_first_step=None):
        super().__init__()
        self.strategy, self.on_first_step = strategy, on_first_step

    def on_train_begin(self, logs=None):
        model = self.model
        variables = list(model.weights) + list(getattr(model.optimizer, "variables", []))
        set_from_chief(variables, self.strategy)

    def on_train_batch_end(self, batch, logs=None):
        if self.on_first_step is not None:
            self.on_first_step()
            self.on_first_step = None

    def on_epoch_end(self, epoch, logs=None):
        import numpy as np

        stop = from_replica_0(np.array([int(bool(self.model.stop_training))], np.int32),
                              self.strategy)
        self.model.stop_training = bool(stop[0])


def set_from_chief(variables: list, strategy: Any) -> None:
    """Assigns the chief's value of each variable on every worker: one collective per dtype
    (values flattened into one vector; dtypes collectives lack travel as int64)."""
    import numpy as np

    groups: dict[str, list] = {}
    for variable in variables:
        groups.setdefault(keras.backend.standardize_dtype(variable.dtype), []).append(variable)
    for dtype, group in groups.items():
        values = [np.asarray(keras.ops.convert_to_numpy(v)) for v in group]
        wire = dtype if dtype in ("float32", "float64", "int32", "int64") else "int64"
        if wire == "int64" and dtype.startswith(("float", "bfloat")):
            wire = "float32"
        flat = np.concatenate([v.reshape(-1).astype(wire) for v in values]) if values else \
            np.zeros([0], wire)
        received = from_replica_0(flat, strategy)
        offset = 0
        for variable, value in zip(group, values):
            size = value.size
            variable.assign(received[offset:offset + size].reshape(value.shape).astype(dtype))
            offset += size
