"""The subprocess worker protocol of the benchmarks: a peer that must not share a process with
TensorFlow (transformers' modeling code, torch, a runtime with its own thread pools) runs in a
child process, started once and asked many times, so that the parent can alternate it with ours.

Parent side: ``Worker(argv)`` starts the child and waits for its first result (the child is
ready: its imports and builds are done; ``wait=False`` leaves that to ``wait_ready()``),
``ask(command, payload)`` writes one line ``COMMAND JSON`` and returns the child's answer,
``close()`` ends it. ``run_once(argv)`` runs a child to its end and returns its one result.

Child side: ``serve(handlers, ready)`` announces ``ready`` and answers each line with the
handler of its command; ``emit(obj)`` is the one result of a ``run_once`` child.

On the wire every answer is one line ``RESULT JSON`` on stdout (anything else a library prints
there is skipped); a handler that raises answers ``ERROR message`` and the parent raises
`WorkerError` with the message and the tail of the child's log. stderr goes to a log file.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import traceback
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable


class WorkerError(RuntimeError):
    """A child process failed: its message and the tail of its log."""


def child_env(**extra: str) -> dict:
    """The environment of a child: this checkout importable, TensorFlow's C++ log quiet."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "benchmarks")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                  else []))
    env.update(extra)
    return env


def _tail(log: pathlib.Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def read_answer(stream, log: pathlib.Path | None = None) -> dict:
    """The next ``RESULT`` line of ``stream`` as a dict; `WorkerError` on ``ERROR`` or EOF."""
    for line in stream:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        if line.startswith("ERROR "):
            raise WorkerError(line[len("ERROR "):].strip() + "\n" + (_tail(log) if log else ""))
    raise WorkerError("the worker ended without an answer\n" + (_tail(log) if log else ""))


class Worker:
    """A child process that answers commands, one line each (see the module's docstring)."""

    def __init__(self, argv: list[str], log: pathlib.Path | None = None,
                 env: dict | None = None, cwd: pathlib.Path = ROOT, wait: bool = True):
        if log is None:
            log = pathlib.Path(tempfile.mkstemp(prefix="worker-", suffix=".log")[1])
        self.log = pathlib.Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env or child_env(), text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err)
        self.ready = None
        if wait:  # else the caller does other work while the child sets up, then waits
            self.wait_ready()

    def wait_ready(self) -> dict:
        """The child's first answer (its setup is done), read once."""
        if self.ready is None:
            try:
                self.ready = read_answer(self.proc.stdout, self.log)
            except BaseException:
                self.kill()
                raise
        return self.ready

    def ask(self, command: str, payload=None) -> dict:
        self.wait_ready()
        line = command if payload is None else f"{command} {json.dumps(payload)}"
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerError("the worker has ended\n" + _tail(self.log)) from None
        return read_answer(self.proc.stdout, self.log)

    def close(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close() if exc[0] is None else self.kill()


def run_once(argv: list[str], log: pathlib.Path | None = None, env: dict | None = None,
             cwd: pathlib.Path = ROOT, timeout: float | None = None) -> dict:
    """Runs a child to its end and returns its ``RESULT``; `WorkerError` if it fails."""
    proc = subprocess.run(argv, cwd=cwd, env=env or child_env(), capture_output=True,
                          text=True, timeout=timeout)
    if log is not None:
        pathlib.Path(log).write_text(proc.stderr)
    if proc.returncode:
        raise WorkerError(f"{' '.join(map(str, argv))} exited with {proc.returncode}\n"
                          + proc.stderr[-3000:])
    return read_answer(proc.stdout.splitlines())


# ---------------------------------------------------------------------------------- the child

def emit(obj) -> None:
    """Writes one answer (``RESULT JSON``) on stdout."""
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(handlers: dict[str, Callable], ready=None) -> None:
    """Answers ``COMMAND [JSON]`` lines from stdin with ``handlers[COMMAND](payload)`` until
    ``quit`` or the end of stdin. ``ready`` is the first answer (after the child's setup)."""
    emit(ready if ready is not None else {"ready": True})
    for line in sys.stdin:
        command, _, payload = line.strip().partition(" ")
        if command == "quit":
            break
        if not command:
            continue
        try:
            if command not in handlers:
                raise KeyError(f"unknown command {command!r} (known: {sorted(handlers)})")
            answer = handlers[command](json.loads(payload) if payload else None)
        except Exception as error:  # the parent raises it, with the log
            traceback.print_exc()
            sys.stderr.flush()
            sys.stdout.write(f"ERROR {type(error).__name__}: {error}\n".replace("\n", " ") + "\n")
            sys.stdout.flush()
            continue
        emit(answer)
