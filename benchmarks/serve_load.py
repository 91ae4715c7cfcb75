"""Load test of the REST server (``scripts/serve.py``) on loopback, against a hand-rolled peer.

    python benchmarks/serve_load.py [--translator DIR] [--detector DIR] [--levels 1,8,32]
        [--requests 32] [--seconds 8] [--repeats 3] [--server-args '...'] [--json OUT]

Starts each server as a subprocess on a free port of 127.0.0.1, waits for its ``ready:`` line,
loads it, then stops it with SIGTERM and checks that it and every process it started exited
(those left are killed and reported). The servers:

* ``ours``: ``scripts/serve.py --translator DIR --detector DIR --port P`` (dynamic batching
  with the server's default batch size and wait; ``--server-args`` adds flags);
* ``peer``: the obvious hand-rolled way, this file run as ``--peer-server``: one
  ``tf.saved_model.load`` per export, called from the handler of a single-threaded
  ``http.server.HTTPServer`` (one request at a time, one instance per call, HTTP/1.0: one
  connection per request), on the same paths and JSON (``{"instances": [...]}`` in,
  ``{"predictions": [...]}`` out); its listen backlog is 128 instead of ``HTTPServer``'s 5, so
  that 32 waiting clients queue in the kernel instead of retrying their connections;
* ``unbatched``: ``ours`` with ``--max-batch-size 1``, at the largest level only: the speed-up
  of dynamic batching is ``ours / unbatched`` there.

``ours`` and ``peer`` run at the same time (the one idle while the other is loaded) and take
turns: each level is ``--repeats`` rounds per server, in the order ours, peer, peer, ours, ...;
``unbatched`` runs alone afterwards. A round: N concurrent asyncio clients (aiohttp), each
sending one request after the other, one instance per request, until ``--requests`` x N
requests have been sent or ``--seconds`` have passed (requests in flight then are waited for).
The translator gets ``POST /v1/models/translator:predict`` with ``{"instances": [SENTENCE]}``
(held-out sentences of ``nlp.data.embedded.generate_pairs``: beam search, the export's
``serving_default``); the detector ``POST /v1/models/detector:predict`` with
``{"signature_name": "serving_bytes", "instances": [{"b64": PNG}]}`` (held-out 128 px images of
``vision.data.shapes``, PNG-encoded, about 31 kB each). Request ``i`` of a round carries item
``i`` of the same list on every server. Before the load, each model of each server gets 3
requests one after the other, then one burst of as many concurrent requests as the largest
level, and each server's CPU use while idle is measured over 5 s.

Printed per server, model and N: requests/s (completed requests over a round's wall time, the
median of the rounds), the p50/p95/p99 latency of all the rounds' completed requests (ms),
errors (non-200 answers, answers without one prediction, and exceptions such as refused
connections and timeouts: there should be none), and the server's memory: the summed RSS of
the server process and all its descendants (``psutil``; for ``ours`` that includes Ray's
processes and replicas, shared pages counted once per process) before and after the level,
and the change in %. Then, per model: ``ratio = ours / peer`` of requests/s at each N (higher
is better for ours), the batching speed-up, whether the servers' answers agree (equal
translations; the largest difference of scores and box coordinates), and each server's memory
over the whole load (after the warm-up against after the last level). The load generator runs
on the same machine and shares its cores. Exits 1 if a request failed or a server did not
start or exit cleanly, 2 without exports.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("translator", "detector")
DEFAULT_EXPORTS = {  # the first that exists is the default
    "translator": (ROOT / "runs" / "quickstart" / "nmt" / "export",
                   Path("/tmp/demo/nmt_after2/export")),
    "detector": (ROOT / "runs" / "quickstart" / "detr" / "export",
                 Path("/tmp/demo/detr_after/export")),
}
TRANSLATOR_POOL, DETECTOR_POOL = 256, 64  # distinct sentences, images
WARMUP_SEQUENTIAL = 3
HOST = "127.0.0.1"


# --- The peer: a single-threaded http.server around tf.saved_model.load ---------------------


def peer_server(translator: str | None, detector: str | None, port: int) -> int:
    """Serves the exports one request at a time until SIGTERM or SIGINT; returns 0."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    def translate(body):
        text = tf.constant([str(s) for s in body["instances"]], tf.string)
        out = translator_fn(text=text)["translation"].numpy()
        return [t.decode("utf-8") for t in out]

    def detect(body):
        if body.get("signature_name", "serving_bytes") != "serving_bytes":
            raise ValueError("only the serving_bytes signature is served")
        data = [base64.b64decode(i["b64"]) for i in body["instances"]]
        out = detector_fn(image_bytes=tf.constant(data, tf.string, shape=[len(data)]))
        out = {k: v.numpy().tolist() for k, v in out.items()}
        return [{k: v[i] for k, v in out.items()} for i in range(len(data))]

    models, keep = {}, []
    if translator:
        keep.append(tf.saved_model.load(translator))
        translator_fn = keep[-1].signatures["serving_default"]
        models["translator"] = translate
    if detector:
        keep.append(tf.saved_model.load(detector))
        detector_fn = keep[-1].signatures["serving_bytes"]
        models["detector"] = detect

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code: int, payload) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            name = self.path.removeprefix("/v1/models/")
            if not self.path.startswith("/v1/models/") or name not in models:
                return self.reply(404, {"error": f"no model at {self.path}"})
            self.reply(200, {"model_version_status": [
                {"version": "1", "state": "AVAILABLE",
                 "status": {"error_code": "OK", "error_message": ""}}]})

        def do_POST(self):  # noqa: N802
            name = self.path.removeprefix("/v1/models/").removesuffix(":predict")
            if not self.path.endswith(":predict") or name not in models:
                return self.reply(404, {"error": f"no model at {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                predictions = models[name](body)
            except Exception as error:  # a bad request: its message, as TF Serving answers
                return self.reply(400, {"error": f"{type(error).__name__}: {error}"})
            self.reply(200, {"predictions": predictions})

        def log_message(self, *args):
            pass

    class Server(HTTPServer):
        request_queue_size = 128

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    server = Server((HOST, port), Handler)
    print(f"listening on http://{HOST}:{port}", flush=True)
    print(f"ready: {', '.join(models)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# --- Servers as subprocesses ----------------------------------------------------------------


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
    """A server subprocess: its output goes to ``log``; `start` waits for its ``ready:`` line."""

    def __init__(self, name: str, argv: list[str], log: Path, port: int):
        self.name, self.argv, self.log, self.port = name, argv, log, port
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._lines: list[str] = []

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

    def start(self, timeout: float) -> float:
        """Starts the server; returns the seconds until ``ready:``; RuntimeError if none."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        start = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            state = (f"exited with {self.proc.poll()}" if self.proc.poll() is not None
                     else f"printed no ready: line in {timeout:.0f} s")
            raise RuntimeError(f"{self.name} server {state} (log {self.log}):\n{self.tail()}")
        return time.perf_counter() - start

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


# --- The load -------------------------------------------------------------------------------


def request_bodies(model: str) -> list[bytes]:
    """The JSON bodies of one model's requests: one instance each, distinct items."""
    if model == "translator":
        from nlp.data.embedded import generate_pairs

        return [json.dumps({"instances": [source]}).encode("utf-8")
                for source, _ in generate_pairs(TRANSLATOR_POOL, split="valid")]
    from PIL import Image

    from vision.data.shapes import ShapesGenerator

    shapes, bodies = ShapesGenerator(split="valid"), []
    for index in range(DETECTOR_POOL):
        png = io.BytesIO()
        Image.fromarray(shapes.example(index)["image"]).save(png, format="PNG")
        b64 = base64.b64encode(png.getvalue()).decode("ascii")
        bodies.append(json.dumps({"signature_name": "serving_bytes",
                                  "instances": [{"b64": b64}]}).encode("utf-8"))
    return bodies


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))


async def load(url: str, bodies: list[bytes], clients: int, total: int, seconds: float,
               timeout: float) -> dict:
    """``clients`` concurrent clients send request 0, 1, ... (``bodies[i % len]``) until
    ``total`` are sent or ``seconds`` have passed."""
    import aiohttp

    latencies: list[float] = []
    errors: Counter = Counter()
    outputs: dict[int, object] = {}
    first_error: list[str] = []
    next_index = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        start = time.perf_counter()
        deadline = start + seconds

        def failed(kind: str, detail: str) -> None:
            errors[kind] += 1
            if not first_error:
                first_error.append(detail)

        async def client():
            nonlocal next_index
            while next_index < total and time.perf_counter() < deadline:
                index, next_index = next_index, next_index + 1
                sent = time.perf_counter()
                try:
                    async with session.post(url, data=bodies[index % len(bodies)],
                                            headers=headers) as response:
                        status, payload = response.status, await response.read()
                except Exception as error:  # refused, reset, timed out...
                    failed(type(error).__name__, f"{type(error).__name__}: {error}")
                    continue
                elapsed = time.perf_counter() - sent
                if status != 200:
                    failed(f"HTTP {status}", f"HTTP {status}: {payload[:300]!r}")
                    continue
                try:
                    predictions = json.loads(payload)["predictions"]
                    if not isinstance(predictions, list) or len(predictions) != 1:
                        raise ValueError("not one prediction")
                except (ValueError, KeyError, TypeError) as error:
                    failed("bad answer", f"bad answer ({error}): {payload[:300]!r}")
                    continue
                latencies.append(elapsed)
                outputs.setdefault(index % len(bodies), predictions[0])

        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    return {"requests": next_index, "completed": len(latencies), "seconds": wall,
            "requests_per_s": len(latencies) / wall, "latencies": latencies,
            "errors": sum(errors.values()), "error_kinds": dict(errors),
            "first_error": first_error[0] if first_error else None, "outputs": outputs}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def url_of(server: Server, model: str) -> str:
    return f"http://{HOST}:{server.port}/v1/models/{model}:predict"


def warm_up(server: Server, model: str, bodies: list[bytes], burst: int, timeout: float):
    """A few requests one after the other, then one burst of ``burst`` concurrent ones;
    RuntimeError if one fails."""
    for clients, items in ((1, bodies), (burst, bodies[WARMUP_SEQUENTIAL:])):
        total = WARMUP_SEQUENTIAL if clients == 1 else burst
        out = asyncio.run(load(url_of(server, model), items, clients, total, timeout, timeout))
        if out["errors"]:
            raise RuntimeError(f"{server.name}: {out['errors']} of the warm-up requests to "
                               f"{model} failed: {out['first_error']}\n{server.tail()}")


def idle_cpu(pid: int, seconds: float = 5.0) -> float:
    """CPU time used by process ``pid`` and its descendants while idle, in % of one core."""
    import psutil

    def cpu() -> dict[int, float]:
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

    before = cpu()
    time.sleep(seconds)
    after = cpu()
    used = sum(t - before.get(p, 0.0) for p, t in after.items())
    return 100 * used / seconds


def run_group(names: list[str], plans: dict, args, bodies: dict[str, list[bytes]],
              logdir: Path, results: dict, failed: list[str]) -> None:
    """Starts the servers ``names`` together, warms them up, loads each model at each level,
    the servers alternating (ABBA) ``--repeats`` times, and stops them; fills ``results``."""
    started: dict[str, Server] = {}
    try:
        for name in names:
            argv, _ = plans[name]
            port = free_port()
            server = Server(name, argv + ["--port", str(port)], logdir / f"{name}.log", port)
            started[name] = server
            results[name] = {"command": " ".join(shlex.quote(a) for a in argv), "models": {}}
            results[name]["start_seconds"] = round(server.start(args.start_timeout), 1)
            print(f"{name}: ready in {results[name]['start_seconds']} s (log {server.log})",
                  flush=True)
        levels = plans[names[0]][1]
        for name, server in started.items():
            for model, items in bodies.items():
                warm_up(server, model, items, max(levels), args.timeout)
                results[name]["models"][model] = {"levels": []}
        for name, server in started.items():
            results[name]["idle_cpu_pct"] = idle_cpu(server.proc.pid)
            results[name]["rss_after_warmup"] = tree_rss(server.proc.pid)
        print("warmed up; CPU used while idle (% of one core): " + ", ".join(
            f"{name} {results[name]['idle_cpu_pct']:.0f} %" for name in started), flush=True)
        print("\n" + HEADER, flush=True)
        for model, items in bodies.items():
            for clients in levels:
                rows = {name: {"clients": clients, "rounds": [],
                               "rss_before": tree_rss(server.proc.pid)}
                        for name, server in started.items()}
                for repeat in range(args.repeats):
                    order = list(started) if repeat % 2 == 0 else list(started)[::-1]
                    for name in order:
                        server = started[name]
                        out = asyncio.run(load(url_of(server, model), items, clients,
                                               args.requests * clients, args.seconds,
                                               args.timeout))
                        rows[name]["rounds"].append(out)
                        if out["errors"] and not out["completed"]:
                            results[name]["models"][model]["levels"].append(
                                finish_row(rows[name], tree_rss(server.proc.pid)))
                            raise RuntimeError(f"{name} server answered none of {model}'s "
                                               f"{out['requests']} requests at N={clients} "
                                               f"({out['error_kinds']}; first: "
                                               f"{out['first_error']}):\n{server.tail()}")
                        if server.proc.poll() is not None:
                            raise RuntimeError(f"{name} server exited with "
                                               f"{server.proc.poll()} under load:\n"
                                               f"{server.tail()}")
                for name, server in started.items():
                    row = finish_row(rows[name], tree_rss(server.proc.pid))
                    results[name]["models"][model]["levels"].append(row)
                    print_row(name, model, row)
        for name, server in started.items():
            results[name]["rss_end"] = tree_rss(server.proc.pid)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        failed.append(str(error).splitlines()[0])
    finally:
        for name, server in started.items():
            exit_ = results[name]["exit"] = server.stop()
            clean = exit_["rc"] == 0 and not exit_.get("killed") and not exit_.get("leftover")
            print(f"{name}: stopped with SIGTERM: exit code {exit_['rc']} in "
                  f"{exit_.get('seconds')} s, {exit_.get('descendants')} descendant processes "
                  f"then, left running: {exit_.get('leftover') or 'none'}"
                  f"{'' if clean else '  <-- NOT CLEAN'}", flush=True)
            if not clean:
                failed.append(f"{name}: did not exit cleanly ({exit_})")


def finish_row(row: dict, rss_after: dict) -> dict:
    """One level of one server: the median requests/s of its rounds, the latency percentiles
    of all their completed requests, their errors and outputs."""
    rounds = row["rounds"]
    latencies = [t for r in rounds for t in r.pop("latencies")]
    outputs: dict = {}
    for r in rounds:
        for index, output in r.pop("outputs").items():
            outputs.setdefault(index, output)
    errors: Counter = Counter()
    for r in rounds:
        errors.update(r["error_kinds"])
    row.update(
        rss_after=rss_after, requests_per_s=statistics.median(r["requests_per_s"] for r in rounds),
        completed=sum(r["completed"] for r in rounds), errors=sum(errors.values()),
        error_kinds=dict(errors), first_error=next(
            (r["first_error"] for r in rounds if r["first_error"]), None),
        p50_ms=_ms(percentile(latencies, 50)), p95_ms=_ms(percentile(latencies, 95)),
        p99_ms=_ms(percentile(latencies, 99)), outputs=outputs)
    return row


HEADER = (f"{'server':<10} {'model':<10} {'N':>3} {'requests':>8} {'req/s':>7} {'p50 ms':>8} "
          f"{'p95 ms':>8} {'p99 ms':>8} {'errors':>6} {'RSS MiB':>17} {'change':>7}")


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def change(before: dict, after: dict) -> float | None:
    if not before["rss_mib"]:
        return None
    return 100 * (after["rss_mib"] - before["rss_mib"]) / before["rss_mib"]


def print_row(name: str, model: str, row: dict) -> None:
    rss = f"{row['rss_before']['rss_mib']:,.0f} -> {row['rss_after']['rss_mib']:,.0f}"
    print(f"{name:<10} {model:<10} {row['clients']:>3} {row['completed']:>8} "
          f"{row['requests_per_s']:>7.2f} {_fmt(row['p50_ms']):>8} {_fmt(row['p95_ms']):>8} "
          f"{_fmt(row['p99_ms']):>8} {row['errors']:>6} {rss:>17} "
          f"{_fmt(change(row['rss_before'], row['rss_after']), '+.1f'):>6}%", flush=True)
    if row["errors"]:
        print(f"    errors: {row['error_kinds']}; first: {row['first_error']}", flush=True)


def agreement(model: str, a: dict, b: dict) -> dict:
    """How far the answers of two servers to the same items differ."""
    common = sorted(set(a) & set(b))
    if model == "translator":
        return {"items": len(common), "equal": sum(a[i] == b[i] for i in common)}
    import numpy as np

    diff = {"items": len(common), "max_score_diff": 0.0, "max_box_diff_px": 0.0,
            "label_mismatches": 0}
    for i in common:
        scores = np.abs(np.subtract(a[i]["scores"], b[i]["scores"]))
        diff["max_score_diff"] = max(diff["max_score_diff"], float(scores.max(initial=0)))
        boxes = np.abs(np.subtract(a[i]["boxes"], b[i]["boxes"]))
        diff["max_box_diff_px"] = max(diff["max_box_diff_px"], float(boxes.max(initial=0)))
        diff["label_mismatches"] += int(np.sum(np.not_equal(a[i]["labels"], b[i]["labels"])))
    return diff


def levels_of(result: dict | None, model: str) -> list[dict]:
    return ((result or {}).get("models", {}).get(model) or {}).get("levels", [])


def outputs_of(result: dict | None, model: str) -> dict:
    merged: dict = {}
    for row in levels_of(result, model):
        for index, output in row["outputs"].items():
            merged.setdefault(index, output)
    return merged


def rps(result: dict | None, model: str, clients: int) -> float | None:
    for row in levels_of(result, model):
        if row["clients"] == clients:
            return row["requests_per_s"]
    return None


def summary(results: dict, models: list[str], levels: list[int]) -> dict:
    """Prints and returns the ratios, the memory and the agreement of the answers."""
    ours, peer, unbatched = (results.get(k) for k in ("ours", "peer", "unbatched"))
    out: dict = {}
    for model in models:
        entry: dict = {}
        print(f"\n{model}:")
        rows = levels_of(ours, model)
        if rows:
            before, after = rows[0]["rss_before"], rows[-1]["rss_after"]
            entry["ours_rss_change_pct"] = change(before, after)
            print(f"  ours, server memory (RSS of {after['processes']} processes): "
                  f"{before['rss_mib']:,.0f} MiB before this model's load, "
                  f"{after['rss_mib']:,.0f} MiB after it: "
                  f"{_fmt(entry['ours_rss_change_pct'], '+.1f')} %")
        for clients in levels:
            a, b = rps(ours, model, clients), rps(peer, model, clients)
            if a is not None and b:
                entry[f"ours_over_peer_N{clients}"] = a / b
                print(f"  N={clients:<3} ours {a:7.2f} req/s, peer {b:7.2f} req/s: "
                      f"ratio = ours / peer = {a / b:.2f} (ours/peer req/s, higher is better)")
        a, b = rps(ours, model, max(levels)), rps(unbatched, model, max(levels))
        if a is not None and b:
            entry["batching_speedup"] = a / b
            print(f"  dynamic batching, N={max(levels)}: {a:.2f} req/s batched, {b:.2f} req/s "
                  f"with --max-batch-size 1: batched / unbatched = {a / b:.2f}")
        for other_name, other in (("peer", peer), ("unbatched", unbatched)):
            if not levels_of(ours, model) or not levels_of(other, model):
                continue
            same = agreement(model, outputs_of(ours, model), outputs_of(other, model))
            entry[f"agreement_with_{other_name}"] = same
            if model == "translator":
                print(f"  answers, ours against {other_name}: {same['equal']} of {same['items']} "
                      "translations equal")
            else:
                print(f"  answers, ours against {other_name}: {same['items']} images, largest "
                      f"score difference {same['max_score_diff']:.2g}, box "
                      f"{same['max_box_diff_px']:.2g} px, {same['label_mismatches']} labels differ")
        out[model] = entry
    for name, result in results.items():
        if "rss_end" in result:
            before, after = result["rss_after_warmup"], result["rss_end"]
            out[f"{name}_rss_change_pct"] = change(before, after)
            print(f"{name}, server memory over the whole load (RSS): {before['rss_mib']:,.0f} MiB "
                  f"({before['processes']} processes) after the warm-up, "
                  f"{after['rss_mib']:,.0f} MiB ({after['processes']}) after the last level: "
                  f"{_fmt(out[f'{name}_rss_change_pct'], '+.1f')} %")
    return out


def default_export(model: str) -> str | None:
    for path in DEFAULT_EXPORTS[model]:
        if (path / "saved_model.pb").is_file():
            return str(path)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--translator", default=None,
                        help="translator export (default: the first of "
                             f"{', '.join(map(str, DEFAULT_EXPORTS['translator']))} there is)")
    parser.add_argument("--detector", default=None,
                        help="detector export (default: the first of "
                             f"{', '.join(map(str, DEFAULT_EXPORTS['detector']))} there is)")
    parser.add_argument("--levels", default="1,8,32", help="concurrent clients per level")
    parser.add_argument("--requests", type=int, default=32,
                        help="requests per client in each round of a level (N x this at most)")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="time limit of each round of a level: no new request after it")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per level and server")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--servers", default="ours,peer,unbatched",
                        help="which of ours, peer, unbatched to run")
    parser.add_argument("--serve-script", default=str(ROOT / "scripts" / "serve.py"))
    parser.add_argument("--server-args", default="",
                        help="more arguments for scripts/serve.py, e.g. '--replicas 2'")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--logdir", default=None, help="server logs (default: a temporary one)")
    parser.add_argument("--json", default=None, help="write all figures to this file")
    parser.add_argument("--peer-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=8501, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.peer_server:
        return peer_server(args.translator, args.detector, args.port)

    models = [m for m in args.models.split(",") if m]
    servers = [s for s in args.servers.split(",") if s]
    levels = sorted({int(n) for n in args.levels.split(",") if n})
    if set(models) - set(MODELS) or set(servers) - {"ours", "peer", "unbatched"} or not levels \
            or min(levels) < 1 or not models or args.repeats < 1:
        parser.error(f"--models within {MODELS}, --servers within ours,peer,unbatched, "
                     "--levels positive integers, --repeats at least 1")
    exports = {"translator": args.translator or default_export("translator"),
               "detector": args.detector or default_export("detector")}
    missing = [m for m in MODELS if not exports[m]
               or not (Path(exports[m]) / "saved_model.pb").is_file()]
    if missing:
        looked = [f"--{m} {getattr(args, m)}" if getattr(args, m) else
                  " or ".join(str(p) for p in DEFAULT_EXPORTS[m]) for m in missing]
        print(f"error: no {' and no '.join(missing)} export (no saved_model.pb in "
              f"{'; '.join(looked)}). `make demo` "
              "(scripts/quickstart.py) trains both and writes runs/quickstart/nmt/export and "
              "runs/quickstart/detr/export; or pass --translator DIR/export and --detector "
              "DIR/export of scripts/train_nmt.py and scripts/train_detr.py runs.",
              file=sys.stderr)
        return 2

    import tempfile

    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="serve_load_"))
    logdir.mkdir(parents=True, exist_ok=True)
    model_args = [a for m in MODELS for a in (f"--{m}", exports[m])]
    ours_argv = [sys.executable, args.serve_script, *model_args, *shlex.split(args.server_args)]
    peer_argv = [sys.executable, str(Path(__file__).resolve()), "--peer-server", *model_args]
    plans = {"ours": (ours_argv, levels), "peer": (peer_argv, levels),
             "unbatched": (ours_argv + ["--max-batch-size", "1"], [max(levels)])}
    print(f"exports: {exports}\nlevels {levels}; each round at most {args.requests} requests per "
          f"client and {args.seconds:g} s; {args.repeats} rounds per level; {os.cpu_count()} "
          f"CPUs, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    bodies = {m: request_bodies(m) for m in models}
    results: dict = {}
    failed: list[str] = []
    start = time.perf_counter()
    for group in ([s for s in ("ours", "peer") if s in servers],
                  [s for s in ("unbatched",) if s in servers]):
        if group:
            print(flush=True)
            run_group(group, plans, args, bodies, logdir, results, failed)
    figures = summary(results, models, levels)
    for name, result in results.items():
        for model, entry in result["models"].items():
            errors = sum(row["errors"] for row in entry["levels"])
            if errors:
                failed.append(f"{name} {model}: {errors} failed requests")
    print(f"\ntotal {time.perf_counter() - start:.0f} s; load average now "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        for result in results.values():
            for entry in result["models"].values():
                for row in entry["levels"]:
                    row.pop("outputs", None)
        Path(args.json).write_text(json.dumps({
            "argv": sys.argv, "exports": exports, "levels": levels, "requests": args.requests,
            "seconds": args.seconds, "repeats": args.repeats, "cpus": os.cpu_count(),
            "machine": platform.platform(), "date": time.strftime("%Y-%m-%d"),
            "servers": results, "summary": figures, "failed": failed}, indent=2),
            encoding="utf-8")
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
