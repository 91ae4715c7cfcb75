"""Translation speed of several exports of one model, side by side in one process: how much a
change of the decoding code buys (export the same weights before and after it).

    python experiments/decode_exports.py EXPORT_A EXPORT_B [...] [--limit 500] [--repeats 5]
                                        [--batch-size 64] [--signatures serving_default,greedy]

Each export's signatures translate the first ``--limit`` held-out sentences of the embedded
data (``nlp.training.evaluate.translate_all``: batches of ``--batch-size`` sentences of similar
length) after two warm-up batches; the exports alternate within every repeat, and each time is the
median over ``--repeats``. Prints seconds per pass in wall-clock time and in this process's
CPU time (all threads: steadier than wall time on a shared machine), the ratios of each
export's times to the first's (medians of the per-repeat ratios) and whether the translations
are identical to the first's; JSON last. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from nlp.data.sources import evaluation_split, load_pairs  # noqa: E402
from nlp.export.load import load_translator  # noqa: E402
from nlp.training.evaluate import translate_all  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", help="export directories (the first is the base)")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--signatures", default="serving_default,greedy")
    args = parser.parse_args(argv)
    for path in args.exports:
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            print(f"error: no SavedModel in {path}", file=sys.stderr)
            return 2
    sources = [s for s, _ in load_pairs("embedded", evaluation_split("embedded"),
                                        limit=args.limit)]
    signatures = [s.strip() for s in args.signatures.split(",") if s.strip()]
    cases = {}  # (signature, export) -> text (N,) -> (N,)
    for signature in signatures:
        for path in args.exports:
            beam = None if signature == "serving_default" else 1
            cases[signature, path] = load_translator(path, beam_size=beam)
    by_length = sorted(sources, key=len)
    for translate in cases.values():
        for texts in (by_length[:8], by_length[-9:]):
            translate(tf.constant(texts))
    outputs, times = {}, {key: [] for key in cases}
    for _ in range(args.repeats):
        for key, translate in cases.items():
            start, cpu = time.perf_counter(), time.process_time()
            outputs[key] = translate_all(translate, sources, args.batch_size, progress=False)
            times[key].append((time.perf_counter() - start, time.process_time() - cpu))
    print(f"{len(sources)} sentences, batches of {args.batch_size}, median of {args.repeats}; "
          f"{platform.machine()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}")
    report = []
    for (signature, path), pairs in times.items():
        base = times[signature, args.exports[0]]
        row = {"signature": signature, "export": path,
               "same_translations_as_first": outputs[signature, path] == outputs[
                   signature, args.exports[0]]}
        for k, name in ((0, "wall"), (1, "cpu")):
            row[f"{name}_seconds"] = round(statistics.median(p[k] for p in pairs), 3)
            row[f"{name}_ratio_to_first"] = round(
                statistics.median(p[k] / b[k] for p, b in zip(pairs, base)), 3)
        report.append(row)
        print(f"{signature:<16} wall {row['wall_seconds']:7.2f} s (ratio "
              f"{row['wall_ratio_to_first']:5.2f})  CPU {row['cpu_seconds']:7.2f} s (ratio "
              f"{row['cpu_ratio_to_first']:5.2f})  same {row['same_translations_as_first']}  "
              f"{path}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
