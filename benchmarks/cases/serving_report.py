"""The printed report of ``serve_load.py``: a row per server, model and level, then per model
the ratios, the batching speed-up, the agreement of the answers and the memory."""

from __future__ import annotations

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
