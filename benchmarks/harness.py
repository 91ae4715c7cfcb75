"""The benchmark suite: one harness for every comparison of this project with a peer.

    python benchmarks/harness.py [--cases layers,nmt,...] [--size standard|tiny]
                                 [--out benchmarks/results] [--workdir runs/bench]
    python benchmarks/harness.py --readme     # the README's tables from the --out folder
    python benchmarks/harness.py --list

A case is a module of ``benchmarks/cases`` with ``DESCRIPTION``, ``SIZES`` (``"tiny"``: the
test's, seconds; ``"standard"``: the README's) and ``run(size, workdir) -> list[Row]``. The
harness gives each case:

- `alternate`: the contenders run in turns, the first of each round rotating, after a warm-up;
  each contender returns its own seconds (or None: the harness times the call);
- `compare`: the medians of each contender's times and the median of the per-round ratios
  ``ours / peer`` (below 1, ours is faster), as one `Row`;
- `machine`: the header every result carries (CPU model, cores, the vector extensions that
  change TensorFlow's kernels, memory, versions, load average).

Each case's rows are written to ``OUT/CASE.json``; ``--readme`` rewrites the README's table of
every case that has a JSON file (between ``<!-- case:NAME -->`` and ``<!-- /case:NAME -->``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Callable

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
README = HERE / "README.md"
CASES = ("layers", "nmt", "detr", "engines", "formats", "serving")
SIZE_NAMES = ("tiny", "standard")
# The distributions whose versions a result names (read from their metadata, nothing imported).
VERSIONS = ("tensorflow", "keras", "keras-hub", "torch", "transformers", "ctranslate2",
            "onnxruntime", "ai-edge-litert", "ray")
# The CPU flags that decide TensorFlow's kernels (oneDNN needs AVX-512; bf16 is fast with AMX).
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


# ------------------------------------------------------------------------------------ machine

def machine() -> dict:
    """What a figure was measured on: the header of every result."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    memory = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "flags": [flag for flag in FLAGS if flag in flags],
        "memory_gib": memory,
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "versions": versions,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg")
        else None,
    }


def machine_line(header: dict) -> str:
    flags = ", ".join(header["flags"]) or "no AVX2"
    versions = ", ".join(f"{name} {v}" for name, v in header["versions"].items())
    return (f"{header['cpu']}, {header['cores']} cores ({flags}), {header['memory_gib']} GiB; "
            f"{versions}")


# ------------------------------------------------------------------------------------- timing

def timed(fn: Callable[[], object]) -> float:
    """Seconds of one call, or the seconds the call reports (a number it returns)."""
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    return float(out) if isinstance(out, (int, float)) and not isinstance(out, bool) else elapsed


def alternate(contenders: dict[str, Callable[[], object]], repeats: int,
              warmup: int = 1) -> dict[str, list[float]]:
    """``repeats`` rounds of every contender, after ``warmup`` untimed rounds.

    Round r starts with contender ``r mod n``, so that none always runs right after another
    (a cache or a thermal state left by one then falls on each in turn). A contender returns
    its own seconds (a worker's reported time, a median of inner steps) or anything else, and
    then the call is timed here."""
    names = list(contenders)
    if not names or repeats < 1:
        raise ValueError("alternate needs contenders and repeats >= 1")
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(contenders[name]))
    return times


def median_ratio(ours: list[float], peer: list[float]) -> float:
    """The median of the per-round ratios ``ours / peer`` (steadier than a ratio of medians
    when the machine's speed drifts between rounds)."""
    if len(ours) != len(peer) or not ours:
        raise ValueError("median_ratio needs two equally long, non-empty lists")
    return statistics.median(o / p for o, p in zip(ours, peer))


@dataclasses.dataclass
class Row:
    """One measure: our time, the peer's (None where the row has no peer), their ratio."""

    measure: str
    ours: float
    peer: float | None = None
    ratio: float | None = None
    peer_name: str = ""
    unit: str = "ms"
    repeats: int = 1
    settings: dict = dataclasses.field(default_factory=dict)
    extra: dict = dataclasses.field(default_factory=dict)
    times: dict = dataclasses.field(default_factory=dict)  # contender -> seconds per round

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


UNITS = {"ms": 1e3, "s": 1.0}


def compare(measure: str, times: dict[str, list[float]], ours: str = "ours",
            peer: str | None = None, unit: str = "ms", settings: dict | None = None,
            extra: dict | None = None) -> Row:
    """A `Row` from `alternate`'s times: each contender's median (in ``unit``) and the
    median per-round ratio ``ours / peer``. ``peer`` defaults to the other contender."""
    if peer is None:
        others = [name for name in times if name != ours]
        if len(others) != 1:
            raise ValueError(f"name the peer among {sorted(times)}")
        peer = others[0]
    scale = UNITS[unit]
    return Row(measure=measure, ours=statistics.median(times[ours]) * scale,
               peer=statistics.median(times[peer]) * scale,
               ratio=median_ratio(times[ours], times[peer]), peer_name=peer, unit=unit,
               repeats=len(times[ours]), settings=dict(settings or {}), extra=dict(extra or {}),
               times={name: list(times[name]) for name in (ours, peer)})


# -------------------------------------------------------------------------------------- cases

def test_module(path: str):
    """A module of the test suite's reference builders, ``path`` relative to the checkout
    (``tests/vision/pretrained/reference_rtdetr.py``), loaded from its file once: the cases
    compare on the parity tests' own models and files instead of copies of them."""
    file = ROOT / path
    name = file.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def load_case(name: str):
    if name not in CASES:
        raise ValueError(f"no case {name!r} (the cases: {', '.join(CASES)})")
    # benchmarks/ is on the path wherever this module is importable as ``harness`` (the
    # script's own folder, or the importer's entry), so ``cases`` is too.
    return importlib.import_module(f"cases.{name}")


def run_case(name: str, size: str, workdir: pathlib.Path, out: pathlib.Path | None) -> dict:
    """Runs one case at one size; writes ``out/NAME.json`` (where ``out`` is given)."""
    case = load_case(name)
    settings = case.SIZES[size]
    started = time.time()
    header = machine()
    case_dir = workdir / name
    case_dir.mkdir(parents=True, exist_ok=True)
    rows = case.run(settings, case_dir)
    result = {
        "case": name,
        "description": case.DESCRIPTION,
        "size": size,
        "settings": settings,
        "date": datetime.date.today().isoformat(),
        "machine": header,
        "load_after": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg")
        else None,
        "seconds": round(time.time() - started, 1),
        "rows": [row.to_json() for row in rows],
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ------------------------------------------------------------------------------------- tables

def _number(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def table(result: dict) -> str:
    """The Markdown table of one result, under its machine line."""
    lines = [f"`{result['size']}` size, {result['date']}, {machine_line(result['machine'])}; "
             f"load average {result['machine']['load_average']} before, "
             f"{result['load_after']} after; {result['seconds']} s.", "",
             "| measure | ours | peer | peer is | ratio ours / peer | repeats |",
             "|---|---:|---:|---|---:|---:|"]
    for row in result["rows"]:
        ratio = "–" if row["ratio"] is None else f"**{row['ratio']:.2f}**"
        lines.append(f"| {row['measure']} | {_number(row['ours'])} {row['unit']} | "
                     f"{_number(row['peer'])} {row['unit'] if row['peer'] is not None else ''} | "
                     f"{row['peer_name']} | {ratio} | {row['repeats']} |")
    return "\n".join(lines)


def render_readme(text: str, results: pathlib.Path) -> str:
    """``text`` with each case's table replaced by the one of ``results/CASE.json`` (a case
    without one says so)."""
    for name in CASES:
        path = results / f"{name}.json"
        start, end = f"<!-- case:{name} -->", f"<!-- /case:{name} -->"
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        body = (table(json.loads(path.read_text())) if path.exists() else
                f"No standard run recorded yet: `python benchmarks/harness.py --cases {name}`.")
        text = f"{head}{start}\n{body}\n{end}{tail}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--size", default="standard", choices=SIZE_NAMES)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--workdir", type=pathlib.Path, default=ROOT / "runs" / "bench")
    parser.add_argument("--readme", action="store_true",
                        help="only rewrite the README's tables from the --out folder")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    if args.size == "tiny" and args.out.resolve() == RESULTS and not args.list:
        parser.error("--size tiny: give --out DIR (benchmarks/results holds the README's figures)")
    for name in names:
        if name not in CASES:
            parser.error(f"--cases: no case {name!r} (the cases: {', '.join(CASES)})")
    if args.list:
        for name in names:
            print(f"{name}: {load_case(name).DESCRIPTION}")
        return 0
    if not args.readme:
        print(machine_line(machine()), flush=True)
        for name in names:
            result = run_case(name, args.size, args.workdir.resolve(), args.out)
            print(f"\n## {name}\n{table(result)}", flush=True)
    if args.readme or args.out.resolve() == RESULTS:
        README.write_text(render_readme(README.read_text(), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
