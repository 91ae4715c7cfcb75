"""Load test of the REST server (``scripts/serve.py``) on loopback, against a hand-rolled peer.

    python benchmarks/serve_load.py [--translator DIR] [--detector DIR] [--levels 1,4,16,64]
        [--requests 32] [--seconds 8] [--repeats 3] [--server-args '...'] [--json OUT]
    python benchmarks/serve_load.py --table OUT      # the README's table of a --json file

Starts each server as a subprocess on a free port of 127.0.0.1, waits for its ``ready:`` line,
loads it, then stops it with SIGTERM and checks that it and every process it started exited
(those left are killed and reported). The servers:

* ``ours``: ``scripts/serve.py --translator DIR --detector DIR --port P`` (dynamic batching
  with the server's default batch size and wait; ``--server-args`` adds flags);
* ``peer``: the obvious hand-rolled way, ``benchmarks/serve_peer.py``: one
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

The parts: ``serve_peer.py`` (the peer), ``serve_process.py`` (servers as subprocesses, their
memory and idle CPU), ``serve_client.py`` (the request bodies, the load clients and the
statistics of a level) and ``serve_report.py`` (the printed rows and summary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from serve_client import finish_row, load, request_bodies
from serve_process import HOST, ROOT, Server, free_port, idle_cpu, tree_rss
from serve_report import HEADER, print_row, summary

MODELS = ("translator", "detector")
DEFAULT_EXPORTS = {  # the first that exists is the default
    "translator": (ROOT / "runs" / "quickstart" / "nmt" / "export",
                   Path("/tmp/demo/nmt_after2/export")),
    "detector": (ROOT / "runs" / "quickstart" / "detr" / "export",
                 Path("/tmp/demo/detr_after/export")),
}
WARMUP_SEQUENTIAL = 3


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


def markdown_table(figures: dict) -> str:
    """The README's table of a ``--json`` file: per model and N, each server's requests/s, the
    ratio ours / peer and the p50 / p99 latencies."""
    servers = figures["servers"]
    lines = ["| model | N | ours req/s | peer req/s | ours / peer | ours p50 / p99 ms | "
             "peer p50 / p99 ms | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = {(name, model, row["clients"]): row for name, result in servers.items()
            for model, entry in result["models"].items() for row in entry["levels"]}
    for model in MODELS:
        for clients in figures["levels"]:
            ours, peer = rows.get(("ours", model, clients)), rows.get(("peer", model, clients))
            if not ours or not peer:
                continue
            lines.append(
                f"| {model} | {clients} | {ours['requests_per_s']:.1f} | "
                f"{peer['requests_per_s']:.1f} | "
                f"**{ours['requests_per_s'] / peer['requests_per_s']:.2f}** | "
                f"{ours['p50_ms']:,.0f} / {ours['p99_ms']:,.0f} | "
                f"{peer['p50_ms']:,.0f} / {peer['p99_ms']:,.0f} | "
                f"{ours['errors'] + peer['errors']} |")
    return "\n".join(lines)


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
    parser.add_argument("--levels", default="1,4,16,64", help="concurrent clients per level "
                        "(64 stays below tfx-serve's default --max-queue of 256: no 503)")
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
    parser.add_argument("--table", metavar="JSON", default=None,
                        help="only print the Markdown table of a --json file, run nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(Path(args.table).read_text(encoding="utf-8"))))
        return 0

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
    peer_argv = [sys.executable, str(Path(__file__).resolve().parent / "serve_peer.py"),
                 *model_args]
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
