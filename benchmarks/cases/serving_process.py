"""Servers as subprocesses for the ``serving`` case: a free port, start until ``ready:``, stop
with SIGTERM and check that every descendant exited, and the memory and idle CPU of process
trees. (An HTTP server is not a `workers` child: it answers on its port, not on stdout; it
gets `workers.child_env`'s environment.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import workers

from cases.serving_peer import HOST


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tree_rss(pid: int) -> dict:
    """Summed RSS (MiB) of process ``pid`` and its descendants, and how many they are."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return {"rss_mib": 0.0, "processes": 0}
    total, count = 0, 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
            count += 1
        except psutil.NoSuchProcess:
            pass
    return {"rss_mib": total / 2**20, "processes": count}


class Server:
    """A server subprocess: `launch` starts it, its output goes to ``log``, `wait_ready` waits
    for its ``ready:`` line, `stop` ends it and every process it started."""

    def __init__(self, name: str, argv: list[str], log: Path, port: int):
        self.name, self.argv, self.log, self.port = name, argv, log, port
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._lines: list[str] = []
        self._started = 0.0

    def _read(self) -> None:
        with open(self.log, "w", encoding="utf-8") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self._lines.append(line.rstrip("\n"))
                if line.startswith("ready:"):
                    self._ready.set()
        self._ready.set()  # the output ended: the process is exiting

    def tail(self, n: int = 15) -> str:
        return "\n".join("    " + line for line in self._lines[-n:])

    def launch(self) -> None:
        """Starts the process (`wait_ready` then waits for its ``ready:`` line)."""
        env = workers.child_env(TF_CPP_MIN_LOG_LEVEL="3")
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self._started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, cwd=workers.ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def wait_ready(self, timeout: float) -> float:
        """The seconds from `launch` to ``ready:``; RuntimeError if none within ``timeout``."""
        left = timeout - (time.perf_counter() - self._started)
        if not self._ready.wait(max(left, 0.0)) or self.proc.poll() is not None:
            state = (f"exited with {self.proc.poll()}" if self.proc.poll() is not None
                     else f"printed no ready: line in {timeout:.0f} s")
            raise RuntimeError(f"{self.name} server {state} (log {self.log}):\n{self.tail()}")
        return time.perf_counter() - self._started

    def stop(self, timeout: float = 60.0) -> dict:
        """SIGTERM, then waits for the process and all its descendants; SIGKILL for those left
        after ``timeout`` (reported)."""
        import psutil

        if self.proc is None:
            return {"rc": None}
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        start = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
            killed = False
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc, killed = self.proc.wait(), True
        left = timeout - (time.perf_counter() - start)
        _, alive = psutil.wait_procs(descendants, timeout=max(left, 5.0))
        leftover = []
        for proc in alive:
            try:
                leftover.append(f"{proc.pid} {proc.name()}")
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return {"rc": rc, "killed": killed, "seconds": round(time.perf_counter() - start, 1),
                "descendants": len(descendants), "leftover": leftover}


def idle_cpu(pids: list[int], seconds: float = 5.0) -> list[float]:
    """CPU time used by each process of ``pids`` and its descendants over the same ``seconds``
    while all are idle, in % of one core."""
    import psutil

    def cpu(pid: int) -> dict[int, float]:
        try:
            root = psutil.Process(pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        times = {}
        for proc in procs:
            try:
                t = proc.cpu_times()
                times[proc.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return times

    before = [cpu(pid) for pid in pids]
    time.sleep(seconds)
    after = [cpu(pid) for pid in pids]
    return [100 * sum(t - b.get(p, 0.0) for p, t in a.items()) / seconds
            for b, a in zip(before, after)]
