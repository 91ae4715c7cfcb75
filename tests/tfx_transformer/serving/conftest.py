"""The server the serving tests share: ``scripts/serve.py`` run as a user runs it.

`serving` starts it once on 127.0.0.1 (a free port, ``--max-queue 16``, the default flags
otherwise) with the
session's two test exports, records what the API answered while the models loaded, and stops
it with SIGTERM at the end (`Server.stop`; the last test checks that stop itself).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# Per model: a flood of 112 requests overflows it (test_abuse.py), the 12 concurrent requests of
# a test do not (Ray Serve counts a request as queued until a replica is chosen for it).
MAX_QUEUE = 16
START_TIMEOUT = 240  # seconds: Ray's start and two TensorFlow loads on a busy 2-core machine
# Seconds between the status and predict probes while the models load (5 or 6 pairs on an idle
# 2-core host): a pair every 0.1 s, some 70 requests through Ray's proxy, cost ~2 s of CPU.
PROBE_INTERVAL = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """A running ``serve.py``: `get`/`post` answer ``(HTTP status, JSON body)``."""

    def __init__(self, args: list[str], port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        self.early: list[tuple[str, int, dict]] = []  # (what, status, body) before "ready:"
        env = {**os.environ, "PYTHONPATH": ROOT}
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--port", str(port),
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=ROOT)
        self.stderr: list[str] = []
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines),
                         daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self.stderr),
                         daemon=True).start()
        self.returncode = None

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def _has(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines)

    def wait_ready(self, probe_model: str) -> None:
        """Waits for ``ready:``, asking ``probe_model``'s status and a predict meanwhile: at
        once when the server listens, then every `PROBE_INTERVAL` seconds while it loads."""
        deadline = time.monotonic() + START_TIMEOUT
        next_probe = 0.0
        while not self._has("ready:"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("serve.py did not get ready:\n" + "\n".join(
                    self.lines + self.stderr[-30:]))
            if self._has("listening on") and time.monotonic() >= next_probe:
                self.early.append(("status", *self.get(f"/v1/models/{probe_model}")))
                self.early.append(("predict", *self.post(f"/v1/models/{probe_model}:predict",
                                                         {"instances": ["Hello."]})))
                next_probe = time.monotonic() + PROBE_INTERVAL
            time.sleep(0.1)

    def request(self, path: str, data: bytes | None = None, method: str | None = None,
                timeout: float = 120) -> tuple[int, dict]:
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            self.headers = dict(error.headers)
            return error.code, json.loads(error.read())

    def get(self, path: str) -> tuple[int, dict]:
        return self.request(path)

    def post(self, path: str, body) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request(path, data, "POST")

    def stop(self, timeout: float = 90) -> tuple[int, list[psutil.Process]]:
        """SIGTERM, then waits; ``(exit code, the descendants still alive afterwards)``."""
        if self.returncode is not None:
            return self.returncode, []
        try:
            descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        self.process.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.returncode = self.process.wait()
        deadline = time.monotonic() + 20
        alive = descendants
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.2)
        for process in alive:  # never leave a process behind the test run
            process.kill()
        return self.returncode, alive


@pytest.fixture(scope="session")
def serving(nmt_export, detr_export):
    """The running server with the test translator (``translator``) and detector
    (``detector``): a `Server`, with ``translator_path`` and ``detector_path``."""
    translator, detector = nmt_export[2], detr_export[1]
    server = Server(["--translator", str(translator), "--detector", str(detector),
                     "--max-queue", str(MAX_QUEUE)], free_port())
    server.translator_path, server.detector_path = str(translator), str(detector)
    server.max_queue = MAX_QUEUE
    try:
        server.wait_ready("translator")
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(items):
    """The test that stops the shared server runs after every other test that uses it."""
    last = [item for item in items
            if item.name == "test_sigterm_stops_the_server_and_every_process_it_started"]
    items[:] = [item for item in items if item not in last] + last
