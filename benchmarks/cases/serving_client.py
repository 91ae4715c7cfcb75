"""The load of the ``serving`` case: the request bodies, the asyncio clients (aiohttp) and the
statistics of a level's rounds."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import statistics
import time
from collections import Counter


def request_bodies(model: str, count: int) -> list[bytes]:
    """The JSON bodies of ``count`` requests to one model: one instance each, distinct items
    (held-out sentences; held-out 128 px shapes images, PNG)."""
    if model == "translator":
        from nlp.data.embedded import generate_pairs

        return [json.dumps({"instances": [source]}).encode("utf-8")
                for source, _ in generate_pairs(count, split="valid")]
    from PIL import Image

    from vision.data.shapes import ShapesGenerator

    shapes, bodies = ShapesGenerator(split="valid"), []
    for index in range(count):
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
