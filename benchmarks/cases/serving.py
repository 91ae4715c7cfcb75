"""Load test of the REST server (``scripts/serve.py``, Ray Serve) on loopback, against a
hand-rolled single-threaded ``http.server`` peer.

Each server runs as a subprocess on a free port of 127.0.0.1; it is loaded once its ``ready:``
line came, then stopped with SIGTERM, and it and every process it started must exit (those
left are killed; the case then fails, as it does when a request fails). The servers:

* ``ours``: ``scripts/serve.py --translator DIR --detector DIR --port P`` with its defaults
  (one replica per model, dynamic batching: ``--max-batch-size 32``, ``--batch-wait-ms 5``);
* ``peer``: ``benchmarks/cases/serving_peer.py``, the obvious hand-rolled way: one
  ``tf.saved_model.load`` per export, called from the handler of a single-threaded
  ``http.server.HTTPServer`` (one request at a time, one instance per call, HTTP/1.0, listen
  backlog 128), on the same paths and JSON (``{"instances": [...]}`` in,
  ``{"predictions": [...]}`` out);
* ``unbatched``: ``ours`` with ``--max-batch-size 1``, at the largest level only (standard
  size only: a second Ray instance costs tens of seconds of CPU to start).

``ours`` and ``peer`` run at the same time (the one idle while the other is loaded) and take
turns (`harness.alternate`: ours, peer, then peer, ours, ...), ``repeats`` rounds per level;
``unbatched`` runs alone afterwards. A round: N concurrent aiohttp clients, each sending one
request after the other, one instance per request, until ``requests`` x N were sent or
``seconds`` passed. The translator gets ``{"instances": [SENTENCE]}`` (held-out
sentences of the embedded data; beam search, ``serving_default``), the detector
``{"signature_name": "serving_bytes", "instances": [{"b64": PNG}]}`` (held-out 128 px shapes
images, about 31 kB); request ``i`` carries item ``i`` on every server. First each model of
each server gets 3 requests one after the other and a burst of N = the largest level; then
each server's CPU use while idle is measured (``idle_seconds``). The load generator shares
the machine's cores.

Rows, per model and N: time per request (a round's wall time / its completed requests; the
requests/s, errors and RSS in ``extra``), the p50 and p95 latency of a round's requests (the
percentiles of all rounds pooled in ``extra``), ours against the peer; per model the batching
speed-up (ours / unbatched requests/s at the largest N) and how far ours' answers differ from
the peer's and unbatched's; the servers' memory (summed RSS of each process tree, Ray's
processes included) after the load.

Sizes: ``standard``: N = 1, 4, 16, 64, 32 requests per client or 8 s a round, 3 rounds, the
exports of ``scripts/quickstart.py`` (8 minutes of training, built once in the work
directory), about 6 minutes once the exports exist; ``tiny``: ours and the peer at N = 2,
3 requests per client, 1 round, small exports at random weights (no ``unbatched``, so no
batching row).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import shlex

import harness
import workers

from cases import serving_exports
from cases.serving_client import finish_row, load, percentile, request_bodies
from cases.serving_process import HOST, Server, free_port, idle_cpu, tree_rss
from cases.serving_report import memory_row, model_rows

DESCRIPTION = ("REST server (scripts/serve.py, Ray Serve, dynamic batching) under N concurrent "
               "clients against a single-threaded http.server peer: time per request, p50/p95")
MODELS = ("translator", "detector")
SIZES = {
    "tiny": {"exports": "random", "levels": [2], "requests": 3, "seconds": 8.0, "repeats": 1,
             "pool": {"translator": 16, "detector": 8}, "idle_seconds": 1.0,
             "unbatched": False, "timeout": 60.0, "start_timeout": 240.0},
    "standard": {"exports": "trained", "train_minutes": 8.0, "levels": [1, 4, 16, 64],
                 "requests": 32, "seconds": 8.0, "repeats": 3,
                 "pool": {"translator": 256, "detector": 64}, "idle_seconds": 5.0,
                 "unbatched": True, "timeout": 120.0, "start_timeout": 300.0},
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


def one_round(server: Server, model: str, items: list[bytes], clients: int, size: dict,
              rounds: list[dict]) -> float:
    """One round of load on ``server``, appended to ``rounds``; its time per request."""
    out = asyncio.run(load(url_of(server, model), items, clients, size["requests"] * clients,
                           size["seconds"], size["timeout"]))
    rounds.append(out)
    if server.proc.poll() is not None:
        raise RuntimeError(f"{server.name} server exited with {server.proc.poll()} under "
                           f"load:\n{server.tail()}")
    if not out["completed"]:
        raise RuntimeError(f"{server.name} server answered none of {model}'s "
                           f"{out['requests']} requests at N={clients} ({out['error_kinds']}; "
                           f"first: {out['first_error']}):\n{server.tail()}")
    out["p50_s"], out["p95_s"] = (percentile(out["latencies"], q) for q in (50, 95))
    return out["seconds"] / out["completed"]


def load_levels(started: dict[str, Server], plans: dict, size: dict,
                bodies: dict[str, list[bytes]], results: dict) -> None:
    """Each model at each level: the servers that have the level take turns, ``repeats``
    rounds each."""
    for model, items in bodies.items():
        levels = sorted({n for name in started for n in plans[name][1]})
        for clients in levels:
            names = [name for name in started if clients in plans[name][1]]
            rows = {name: {"clients": clients, "rounds": [],
                           "rss_before": tree_rss(started[name].proc.pid)} for name in names}
            harness.alternate({name: (lambda name=name: one_round(
                started[name], model, items, clients, size, rows[name]["rounds"]))
                for name in names}, size["repeats"], warmup=0)
            for name in names:
                results[name]["models"][model][clients] = finish_row(
                    rows[name], tree_rss(started[name].proc.pid))


def stop_all(started: dict[str, Server], results: dict, failed: list[str]) -> None:
    """SIGTERM to every server at once; each must exit, with every process it started."""
    with concurrent.futures.ThreadPoolExecutor(max(len(started), 1)) as pool:
        exits = dict(zip(started, pool.map(Server.stop, started.values())))
    for name, exit_ in exits.items():
        results[name]["exit"] = exit_
        if exit_["rc"] != 0 or exit_.get("killed") or exit_.get("leftover"):
            failed.append(f"{name} server did not exit cleanly on SIGTERM: {exit_} "
                          f"(log {started[name].log})")


def run_group(names: list[str], plans: dict, size: dict, bodies: dict[str, list[bytes]],
              logdir: pathlib.Path, results: dict, failed: list[str]) -> None:
    """Starts the servers ``names`` together, warms them up, loads them (`load_levels`) and
    stops them, whatever fails; fills ``results``, a failure goes to ``failed``."""
    started: dict[str, Server] = {}
    try:
        for name in names:
            argv = plans[name][0]
            port = free_port()
            started[name] = Server(name, argv + ["--port", str(port)], logdir / f"{name}.log",
                                   port)
            results[name] = {"command": shlex.join(argv),
                             "models": {model: {} for model in bodies}}
            started[name].launch()
        for name, server in started.items():
            results[name]["start_seconds"] = round(server.wait_ready(size["start_timeout"]), 1)
        for name, server in started.items():
            for model, items in bodies.items():
                warm_up(server, model, items, max(plans[name][1]), size["timeout"])
        idle = idle_cpu([server.proc.pid for server in started.values()], size["idle_seconds"])
        for (name, server), pct in zip(started.items(), idle):
            results[name]["idle_cpu_pct"] = round(pct, 1)
            results[name]["rss_after_warmup"] = tree_rss(server.proc.pid)
        load_levels(started, plans, size, bodies, results)
        for name, server in started.items():
            results[name]["rss_end"] = tree_rss(server.proc.pid)
    except (RuntimeError, workers.WorkerError) as error:
        failed.append(str(error))
    finally:
        stop_all(started, results, failed)


def run(size: dict, workdir: pathlib.Path) -> list[harness.Row]:
    kind = size["exports"]
    exports = serving_exports.exports(kind, workdir / f"exports-{kind}",
                                      size.get("train_minutes", 0.0),
                                      log=workdir / f"exports-{kind}.log")
    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    model_args = [a for m in MODELS for a in (f"--{m}", exports[m])]
    ours = [workers.PY, str(workers.ROOT / "scripts" / "serve.py"), *model_args]
    levels = sorted(size["levels"])
    plans = {"ours": (ours, levels),
             "peer": ([workers.PY, str(pathlib.Path(__file__).with_name("serving_peer.py")),
                       *model_args], levels),
             "unbatched": (ours + ["--max-batch-size", "1"], [levels[-1]])}
    bodies = {m: request_bodies(m, size["pool"][m]) for m in MODELS}
    results: dict = {}
    failed: list[str] = []
    groups = [["ours", "peer"]] + ([["unbatched"]] if size["unbatched"] else [])
    for group in groups:
        run_group(group, plans, size, bodies, logdir, results, failed)
        if failed:
            break
    for name, result in results.items():
        for model, entry in result["models"].items():
            errors = sum(row["errors"] for row in entry.values())
            if errors:
                failed.append(f"{name} {model}: {errors} failed requests")
    if failed:
        raise RuntimeError("serving: " + "\n".join(failed))
    settings = {key: size[key] for key in ("requests", "seconds", "repeats")}
    rows = [row for model in MODELS for row in model_rows(results, model, settings)]
    memory = memory_row(results)
    return rows + ([memory] if memory else [])
