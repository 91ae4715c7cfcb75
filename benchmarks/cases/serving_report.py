"""The rows of the ``serving`` case: per model and level, ours against the peer (time per
request, p50 and p95 latency); per model the batching speed-up and the agreement of the
answers; the servers' memory."""

from __future__ import annotations

import harness


def change(before: dict, after: dict) -> float | None:
    if not before["rss_mib"]:
        return None
    return 100 * (after["rss_mib"] - before["rss_mib"]) / before["rss_mib"]


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


def levels_of(results: dict, name: str, model: str) -> dict[int, dict]:
    return results.get(name, {}).get("models", {}).get(model, {})


def outputs_of(results: dict, name: str, model: str) -> dict:
    merged: dict = {}
    for row in levels_of(results, name, model).values():
        for index, output in row["outputs"].items():
            merged.setdefault(index, output)
    return merged


def _pooled(row: dict) -> dict:
    return {key: None if row[key] is None else round(row[key], 1)
            for key in ("p50_ms", "p95_ms", "p99_ms")}


def level_rows(model: str, clients: int, levels: dict[str, dict], settings: dict) -> list:
    """ours against the peer at one level: a round is one load of one server (its time per
    completed request, the p50 and p95 of its latencies)."""
    pair = {name: levels[name] for name in ("ours", "peer")}
    common = {**settings, "model": model, "clients": clients}
    rounds = {name: row["rounds"] for name, row in pair.items()}
    per_request = {name: [r["seconds"] / r["completed"] for r in rs]
                   for name, rs in rounds.items()}
    extra = {"requests_per_s": {name: round(row["requests_per_s"], 2)
                                for name, row in pair.items()},
             "completed": {name: row["completed"] for name, row in pair.items()},
             "errors": {name: row["errors"] for name, row in pair.items()},
             "rss_mib": {name: [round(row["rss_before"]["rss_mib"]),
                                round(row["rss_after"]["rss_mib"])]
                         for name, row in pair.items()}}
    rows = [harness.compare(f"{model}, N={clients}: time per request", per_request,
                            peer="peer", settings=common, extra=extra)]
    for q in ("p50", "p95"):
        times = {name: [r[f"{q}_s"] for r in rs] for name, rs in rounds.items()}
        rows.append(harness.compare(
            f"{model}, N={clients}: {q} latency", times, peer="peer", settings=common,
            extra={"all_rounds_ms": {name: _pooled(row) for name, row in pair.items()}}))
    return rows


def model_rows(results: dict, model: str, settings: dict) -> list:
    """The level rows, the batching speed-up (ours / unbatched requests/s at the largest
    level) and the agreement of ours' answers with the peer's and with unbatched's."""
    rows = []
    ours = levels_of(results, "ours", model)
    for clients in sorted(ours):
        peer = levels_of(results, "peer", model)
        if clients in peer:
            rows += level_rows(model, clients, {"ours": ours[clients], "peer": peer[clients]},
                               settings)
    unbatched = levels_of(results, "unbatched", model)
    for clients in sorted(set(ours) & set(unbatched)):
        a, b = ours[clients]["requests_per_s"], unbatched[clients]["requests_per_s"]
        rows.append(harness.Row(
            f"{model}, N={clients}: batching speed-up (req/s batched / max batch 1)",
            ours=a / b, unit="x", repeats=len(unbatched[clients]["rounds"]),
            settings={**settings, "model": model, "clients": clients},
            extra={"requests_per_s": {"ours": round(a, 2), "unbatched": round(b, 2)}}))
    for other in ("peer", "unbatched"):
        if not ours or not levels_of(results, other, model):
            continue
        same = agreement(model, outputs_of(results, "ours", model),
                         outputs_of(results, other, model))
        if model == "translator":
            rows.append(harness.Row(
                f"translator: equal translations, ours vs {other}",
                ours=100 * same["equal"] / max(same["items"], 1), unit="%",
                settings={"model": model}, extra=same))
        else:
            rows.append(harness.Row(
                f"detector: largest score difference, ours vs {other}",
                ours=same["max_score_diff"], unit="", settings={"model": model}, extra=same))
    return rows


def memory_row(results: dict) -> harness.Row | None:
    """Each server's memory (summed RSS of its process tree) after its last level; extra: after
    the warm-up, the change, its start, idle CPU and exit."""
    if "ours" not in results or "peer" not in results or "rss_end" not in results["ours"] \
            or "rss_end" not in results["peer"]:
        return None
    extra = {}
    for name, result in results.items():
        end, warm = result.get("rss_end"), result.get("rss_after_warmup")
        extra[name] = {
            "rss_end_mib": end and round(end["rss_mib"]), "processes": end and end["processes"],
            "rss_after_warmup_mib": warm and round(warm["rss_mib"]),
            "change_pct": end and warm and change(warm, end),
            "start_seconds": result.get("start_seconds"),
            "idle_cpu_pct": result.get("idle_cpu_pct"), "exit": result.get("exit")}
    ours, peer = results["ours"]["rss_end"]["rss_mib"], results["peer"]["rss_end"]["rss_mib"]
    return harness.Row("server memory (RSS of its processes) after the load", ours=ours,
                       peer=peer, ratio=ours / peer, peer_name="peer", unit="MiB", extra=extra)
