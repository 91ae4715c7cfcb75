"""Serve exports over TensorFlow Serving's REST API: ``tfx-serve`` / ``python scripts/serve.py``.

    python scripts/serve.py --translator runs/nmt/export --detector runs/detr/export [--port 8501]

starts a local Ray instance (or joins a cluster with ``--address``), deploys each export as a
model (``translator``, ``detector``; renamed with ``--name-translator``/``--name-detector``),
prints ``listening on http://HOST:PORT`` once the HTTP server answers (models still loading
answer 503) and a line starting ``ready:`` once every model is loaded, and serves until SIGINT
or SIGTERM, then shuts down what it started (the Ray processes of a local instance end; on a
cluster, only this application is deleted). Bad flags or exports: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
import time

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported (by the exports' checks)

from tfx_transformer.applications import EXPORTS, registered  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402
from tfx_transformer.serving.images import MAX_IMAGE_PIXELS  # noqa: E402

__all__ = ["main"]

APP_NAME = "tfx-serving"
HEALTH_INTERVAL_S = 5.0  # how often a running server checks that Ray and its application live
HEALTH_TIMEOUT_S = 30
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--translator", metavar="DIR", help="a translator export (DIR/export)")
    parser.add_argument("--detector", metavar="DIR", help="a detector export (DIR/export)")
    parser.add_argument("--name-translator", default="translator", metavar="NAME")
    parser.add_argument("--name-detector", default="detector", metavar="NAME")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=positive(int), default=8501)
    parser.add_argument("--replicas", type=positive(int), default=1,
                        help="replicas (processes) per model")
    parser.add_argument("--max-batch-size", type=positive(int), default=32,
                        help="the most instances one model call runs (1: no batching)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0,
                        help="how long a request waits for others to share its model call")
    parser.add_argument("--address", help="join a running Ray cluster: auto, HOST:PORT or "
                                          "ray://HOST:PORT (default: start a local instance)")
    parser.add_argument("--num-cpus", type=positive(int),
                        help="CPUs of the local Ray instance (default: all of this machine's)")
    parser.add_argument("--max-request-mb", type=positive(float), default=32.0,
                        help="the largest request body taken (larger: HTTP 413)")
    parser.add_argument("--max-string-bytes", type=positive(int), default=20_000,
                        help="the longest text of one instance, in UTF-8 bytes (larger: 400; "
                             "b64 values are limited by --max-request-mb only)")
    parser.add_argument("--max-image-pixels", type=positive(int), default=MAX_IMAGE_PIXELS,
                        help="the most pixels (width x height, read from the header before "
                             "decoding) of an encoded image (larger: 400; default: Pillow's "
                             "limit, 256 MiB of RGB)")
    parser.add_argument("--max-json-depth", type=positive(int), default=32,
                        help="the deepest nesting of arrays and objects in a request (deeper: "
                             "400)")
    parser.add_argument("--max-json-values", type=positive(int), default=4_000_000,
                        help="the most JSON values (numbers, strings...) in a request (more: 400)")
    parser.add_argument("--max-queue", type=positive(int), default=256,
                        help="requests per model that wait beyond those its replicas hold "
                             "(more: 503 with Retry-After)")
    parser.add_argument("--request-timeout", type=positive(float), default=60.0,
                        help="seconds a request may take, its upload included (longer: 504, "
                             "the request cancelled)")
    parser.add_argument("--verbose", action="store_true", help="keep Ray's and TensorFlow's logs")
    return parser


def _models(args) -> list[dict]:
    """The served models (name, kind, path and what the page shows), their exports checked by
    the application that made them (`tfx_transformer.applications`)."""
    describe = registered(EXPORTS)
    models = []
    for kind in ("translator", "detector"):
        path = getattr(args, kind)
        if not path:
            continue
        try:
            shown = describe[kind](path)
        except ValueError as error:
            raise ValueError(f"--{kind} {error}") from None
        models.append({"name": getattr(args, f"name_{kind}"), "kind": kind,
                       "path": os.path.abspath(path), **shown})
    if not models:
        raise ValueError("nothing to serve: give --translator DIR and/or --detector DIR")
    for flag, name in (("--name-translator", args.name_translator),
                       ("--name-detector", args.name_detector)):
        if not _NAME.match(name):
            raise ValueError(f"{flag} must be letters, digits, '_', '.' or '-', got {name!r}")
    if len({m["name"] for m in models}) < len(models):
        raise ValueError(f"--name-translator and --name-detector are both {models[0]['name']!r}")
    return models


def _check_port(host: str, port: int) -> None:
    if port > 65535:
        raise ValueError(f"--port must be at most 65535, got {port}")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(f"--port {port} on {host} is not free ({error.strerror})") from None


def _wait_ready(handles: dict, replicas: int, stop: threading.Event) -> str:
    """Polls every model's status until all are AVAILABLE; '' or the first failure."""
    pending = dict(handles)
    while pending and not stop.is_set():
        for name, handle in list(pending.items()):
            try:
                answers = [handle.status.remote() for _ in range(2 * replicas)]
                states = {body["model_version_status"][0]["state"]: body for _, body in
                          (answer.result(timeout_s=120) for answer in answers)}
            except Exception as error:  # noqa: BLE001  (a replica died, Ray went away...)
                return f"model {name} did not start: {type(error).__name__}: {error}"[:500]
            if "END" in states:
                error = states["END"]["model_version_status"][0]["status"]["error_message"]
                return f"model {name} failed to load: {error}"
            if set(states) == {"AVAILABLE"}:
                del pending[name]
        time.sleep(0.2)
    return ""


def _app_problem(serve) -> str:
    """'' while the application runs, else what is wrong (Ray gone, the application failed)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Timeout

    pool = ThreadPoolExecutor(1)
    try:
        status = pool.submit(serve.status).result(timeout=HEALTH_TIMEOUT_S)
    except Timeout:
        return f"Ray Serve did not answer within {HEALTH_TIMEOUT_S} s"
    except Exception as error:  # noqa: BLE001  (Ray's processes ended)
        return f"Ray is gone ({type(error).__name__})"
    finally:
        pool.shutdown(wait=False)
    app = status.applications.get(APP_NAME)
    if app is None or str(app.status).split(".")[-1] not in ("RUNNING", "DEPLOYING"):
        return f"the application is {'deleted' if app is None else app.status}"
    return ""


def command(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.batch_wait_ms < 0:
        raise ValueError(f"--batch-wait-ms must be >= 0, got {args.batch_wait_ms}")
    models = _models(args)
    if not args.address:
        _check_port(args.host, args.port)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers, the replicas among them, at niceness 15: any other busy process
    # of the host would then take nearly all the CPU from the models (a replica got 0.04 of a
    # core beside two busy loops, 32 sentences took 6 s instead of 0.13 s). A local instance
    # runs them at the server's own priority; a cluster's nodes decide at `ray start`.
    os.environ.setdefault("RAY_worker_niceness", "0")
    if not args.verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # the replicas inherit it
    import ray
    from ray import serve

    from tfx_transformer.serving.app import build_app
    from tfx_transformer.serving.rest import Limits

    level = logging.INFO if args.verbose else logging.WARNING
    ray.init(address=args.address or "local", num_cpus=None if args.address else
             (args.num_cpus or os.cpu_count()), include_dashboard=False, logging_level=level,
             log_to_driver=args.verbose, configure_logging=True)
    # The replicas' queue-length probes time out while TensorFlow loads (warnings, no harm).
    logging.getLogger("ray.serve").setLevel(level if args.verbose else logging.ERROR)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        cpus = float(ray.cluster_resources().get("CPU", 1))
        replica_cpus = cpus / (len(models) * args.replicas)
        threads = max(1, int(replica_cpus))
        serve.start(http_options={"host": args.host, "port": args.port})
        app = build_app(models, threads, replica_cpus, args.replicas, args.max_batch_size,
                        args.batch_wait_ms / 1000.0,
                        Limits(args.max_string_bytes, args.max_json_depth, args.max_json_values,
                               args.max_image_pixels),
                        int(args.max_request_mb * 2**20), args.max_queue, args.request_timeout)
        serve.run(app, name=APP_NAME, route_prefix="/")
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        print(f"listening on http://{shown}:{args.port}", flush=True)
        handles = {m["name"]: serve.get_deployment_handle(f"model-{m['name']}", APP_NAME)
                   for m in models}
        failure = _wait_ready(handles, args.replicas, stop)
        if failure:
            raise ValueError(failure)
        if not stop.is_set():
            print("ready: " + ", ".join(f"{m['name']} ({m['kind']}, {m['path']})"
                                        for m in models), flush=True)
        while not stop.wait(HEALTH_INTERVAL_S):
            problem = _app_problem(serve)
            if problem:
                raise ValueError(f"the server stopped working: {problem}")
        return 0
    finally:
        if args.address:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
        print("stopped", flush=True)


def main(argv=None) -> int:
    """The command through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
