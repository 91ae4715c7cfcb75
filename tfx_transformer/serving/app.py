"""The Ray Serve application: one deployment per model, one HTTP ingress.

`ModelReplica` holds a `model.ServedModel` in each of its replicas (Ray processes, each with
its own TensorFlow thread pool) and batches requests with ``@serve.batch``: requests that arrive
within ``batch_wait_s`` of each other run as one signature call of up to ``max_batch_size``
instances. `Ingress` (FastAPI) answers TensorFlow Serving's REST API, routes each model's
requests to its deployment and serves the page (``static/``). `build_app` wires them.

Paths (``NAME`` a served model; ``/versions/1`` may follow it, the only version):

- ``GET /v1/models/NAME``: status; ``GET /v1/models/NAME/metadata``: the signatures;
- ``POST /v1/models/NAME:predict``: `rest.parse_predict` → `rest.format_response`;
- ``GET /v1/models``: the served models and what they are (not in TF Serving's API: the page
  reads it);
- ``GET /``: the page; ``GET /static/FILE``: its files.

Limits (each a flag of ``tfx-serve``): a request's body size, its JSON's depth and number of
values, a text's length and an encoded image's pixels (read from its header, before the model
decodes it) are checked in the replica before the model runs (`rest.Limits`; 413 or 400).
Each model's requests beyond those its replicas hold (``max_ongoing_requests``) wait in the
ingress's queue of Ray Serve (``max_queued_requests``); beyond ``max_queue`` they are refused
with 503 and ``Retry-After``. A request not answered within ``request_timeout_s`` is answered
504 and cancelled, as is one not answered within the client's ``Prefer: wait=SECONDS``
(RFC 7240) when that is sooner, and the request of a client that disconnects (Ray Serve's
proxy cancels the ingress's call, which cancels the model's): queued, it never runs; a large
one stops at its next chunk of ``max_batch_size`` instances.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations (Request).
import asyncio
import json
import os
import re

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from ray import serve
from ray.serve.exceptions import BackPressureError

from tfx_transformer.serving import signatures as sig
from tfx_transformer.serving.limits import prefer_wait
from tfx_transformer.serving.model import ServedModel
from tfx_transformer.serving.rest import Limits, RestError, format_response, parse_predict

__all__ = ["Ingress", "ModelReplica", "answer_within", "build_app", "parse_model_path"]

RETRY_AFTER_S = 1  # the Retry-After of a 503 for a full queue

STATIC = os.path.join(os.path.dirname(__file__), "static")
_PATH = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
                   r"(?:(?P<metadata>/metadata)|:(?P<verb>[A-Za-z]+))?$")


def _requests_size(requests) -> int:
    return sum(request.size for request in requests)


@serve.deployment
class ModelReplica:
    """One model's replica: loads the export in the background and answers its requests.

    Args:
        name: the model's name in the API.
        path: the export directory.
        threads: TensorFlow's thread pool size in this replica.
        max_batch_size: the most instances one signature call runs.
        batch_wait_s: how long a request waits for others to share its call.
        limits: what one request may hold (`rest.Limits`).
    """

    def __init__(self, name: str, path: str, threads: int, max_batch_size: int,
                 batch_wait_s: float, limits: Limits):
        self.model = ServedModel(name, path, threads)
        self.max_batch_size = max_batch_size
        self.limits = limits
        self._batched.set_max_batch_size(max_batch_size)
        self._batched.set_batch_wait_timeout_s(batch_wait_s)

    async def status(self) -> tuple[int, dict]:
        state = self.model.state
        return (200 if state != "END" else 500), sig.status(state, self.model.error)

    async def metadata(self) -> tuple[int, dict]:
        try:
            self.model.check_available()
        except RestError as error:
            return error.status, {"error": error.message}
        return 200, self.model.metadata

    async def predict(self, body: bytes) -> tuple[int, bytes]:
        """``(HTTP status, JSON body)`` of a predict request's body."""
        try:
            self.model.check_available()
            request = await asyncio.to_thread(parse_predict, body, self.model.specs,
                                              limits=self.limits)
            if request.size > self.max_batch_size:  # too big to share a call: alone
                outputs = await self._run_in_chunks(request)
            else:
                outputs = await self._batched(request)
            if isinstance(outputs, RestError):
                raise outputs
            answer = await asyncio.to_thread(format_response, outputs, request.row_format)
            return 200, json.dumps(answer, ensure_ascii=False).encode()
        except RestError as error:
            return error.status, json.dumps({"error": error.message}, ensure_ascii=False).encode()

    async def _run_in_chunks(self, request) -> dict:
        """A large request's outputs, run ``max_batch_size`` rows at a time: a cancelled
        request (timed out, its client gone) stops after its current chunk."""
        parts = []
        for start in range(0, request.size, self.max_batch_size):
            chunk = request.rows(start, start + self.max_batch_size)
            parts.append(await asyncio.to_thread(self.model.run, chunk))
        try:
            return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        except ValueError:  # outputs whose shape beyond the batch differs between chunks
            raise RestError(f"this model's outputs differ in shape between calls: send at "
                            f"most {self.max_batch_size} instances (--max-batch-size) per "
                            "request") from None

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=_requests_size)
    async def _batched(self, requests: list) -> list:
        return await asyncio.to_thread(self.model.run_batch, requests)


def parse_model_path(path: str) -> tuple[str, str | None, str]:
    """``NAME[/versions/V][/metadata | :VERB]`` → ``(name, version, what)``, ``what`` one of
    ``"status"``, ``"metadata"`` or the verb (``"predict"``); RestError 404 when it is none."""
    match = _PATH.match(path)
    if not match:
        raise RestError(f"Malformed request: /v1/models/{path}", 404)
    what = "metadata" if match["metadata"] else match["verb"] or "status"
    return match["name"], match["version"], what


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def answer_within(response, timeout_s: float, name: str,
                        limit: str = "--request-timeout"):
    """What a deployment's ``response`` (a Ray Serve ``DeploymentResponse``) gives, waited for
    at most ``timeout_s`` seconds; on time out it is cancelled and `RestError` 504 raised,
    naming ``limit`` (the flag or header that set the time). Cancelled itself (the client went
    away), it cancels ``response``. A full queue (``BackPressureError``) is `RestError` 503."""
    async def result():
        return await response

    try:
        return await asyncio.wait_for(result(), timeout_s)
    except asyncio.TimeoutError:
        response.cancel()  # still queued: never runs; running: stops at its next chunk
        raise RestError(f"model {name} did not answer within {timeout_s:g} s ({limit})",
                        504) from None
    except asyncio.CancelledError:  # the client went away: its work is not needed
        response.cancel()
        raise
    except BackPressureError as error:
        limit = error.args[1]  # its count of queued requests may pass the limit by a few
        raise RestError(f"model {name} is busy: its queue is full (--max-queue {limit}); "
                        f"retry after {RETRY_AFTER_S} s", 503) from None


api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


# Every request waits in a model's replica, not here: Ray Serve's default (5 requests at a time)
# would queue the rest in the proxy and keep batches small.
@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
@serve.ingress(api)
class Ingress:
    """The HTTP side: TensorFlow Serving's REST API over the models' deployments.

    Args:
        handles: each model's `ModelReplica` deployment, by name.
        models: what ``GET /v1/models`` lists (``name``, ``kind`` and what the page needs).
        max_request_bytes: the largest request body taken (413 beyond it).
        request_timeout_s: the longest a request may take, its body's upload included
            (408 for a body not received in time, 504 for a model's answer).
    """

    def __init__(self, handles: dict, models: list[dict], max_request_bytes: int,
                 request_timeout_s: float):
        self.handles = handles
        self.models = models
        self.max_request_bytes = max_request_bytes
        self.request_timeout_s = request_timeout_s

    @api.get("/")
    async def page(self):
        return FileResponse(os.path.join(STATIC, "index.html"))

    @api.get("/static/{name}")
    async def static(self, name: str):
        if name not in os.listdir(STATIC):
            return _error(404, f"no such file: /static/{name}")
        return FileResponse(os.path.join(STATIC, name))

    @api.get("/v1/models")
    async def list_models(self):
        return {"models": self.models}

    @api.api_route("/v1/models/{path:path}", methods=["GET", "POST"])
    async def model(self, path: str, request: Request):
        try:
            name, version, what = parse_model_path(path)
            if name not in self.handles:
                label = f"Specific({name}, {version})" if version else f"Latest({name})"
                raise RestError(f"Servable not found for request: {label}", 404)
            if version not in (None, sig.VERSION):
                raise RestError(f"Servable not found for request: Specific({name}, {version})",
                                404)
            handle = self.handles[name]
            if what in ("status", "metadata"):
                if request.method != "GET":
                    raise RestError(f"Use GET for /v1/models/{path}", 405)
                status, body = await answer_within(getattr(handle, what).remote(),
                                                   self.request_timeout_s, name)
                return JSONResponse(body, status_code=status)
            if what != "predict":
                raise RestError(f"this server answers :predict only, not :{what}", 400)
            if request.method != "POST":
                raise RestError(f"Use POST for /v1/models/{path}", 405)
            start = asyncio.get_running_loop().time()
            try:
                body = await asyncio.wait_for(self._body(request), self.request_timeout_s)
            except asyncio.TimeoutError:
                raise RestError(f"the request body did not arrive within "
                                f"{self.request_timeout_s:g} s (--request-timeout)",
                                408) from None
            left = self.request_timeout_s - (asyncio.get_running_loop().time() - start)
            timeout, limit = max(left, 0.01), "--request-timeout"
            wait = prefer_wait(request.headers.getlist("prefer"))
            if wait is not None and wait < timeout:  # the client's deadline, if sooner
                timeout, limit = max(wait, 0.01), f"Prefer: wait={wait}"
            status, content = await answer_within(handle.predict.remote(body), timeout, name,
                                                  limit)
            return Response(content, status_code=status, media_type="application/json")
        except RestError as error:
            headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 503 else None
            return _error(error.status, error.message, headers)
        except Exception as error:  # noqa: BLE001  (never a trace in the answer)
            return _error(500, f"internal error: {type(error).__name__}")

    async def _body(self, request: Request) -> bytes:
        limit = self.max_request_bytes
        too_big = RestError(f"the request body is larger than the server's limit of {limit} "
                            "bytes (--max-request-mb)", 413)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)


def build_app(models: list[dict], threads: int, replica_cpus: float, replicas: int,
              max_batch_size: int, batch_wait_s: float, limits: Limits,
              max_request_bytes: int, max_queue: int, request_timeout_s: float):
    """The application: a `ModelReplica` deployment per entry of ``models`` (``name``, ``path``,
    ``kind``...), ``replicas`` each of ``replica_cpus`` CPUs, behind one `Ingress`.

    Each replica holds at most ``max(64, 2 * max_batch_size)`` requests (Ray Serve's
    ``max_ongoing_requests``: a batch running, the next one forming, the status probes);
    the ingress queues at most ``max_queue`` more per model (``max_queued_requests``, which
    Ray Serve counts at each caller: the one ingress) and refuses the rest with 503."""
    handles = {}
    for entry in models:
        deployment = ModelReplica.options(
            name=f"model-{entry['name']}", num_replicas=replicas,
            ray_actor_options={"num_cpus": replica_cpus},
            max_ongoing_requests=max(64, 2 * max_batch_size), max_queued_requests=max_queue,
            backpressure_config={"status_code": 503, "retry_after_s": RETRY_AFTER_S})
        handles[entry["name"]] = deployment.bind(entry["name"], entry["path"], threads,
                                                 max_batch_size, batch_wait_s, limits)
    listed = [{k: v for k, v in entry.items() if k != "path"} for entry in models]
    return Ingress.bind(handles, listed, max_request_bytes, request_timeout_s)
