"""The translator as a CTranslate2 model against its SavedModel: identical translations, BLEU,
speed and size, on the 500 held-out sentences of the embedded data.

    python benchmarks/formats_translator.py [--workdir runs/formats_translator] [--repeats 3]
    python benchmarks/formats_translator.py --workdir DIR   (a finished train_nmt.py run)

Without a finished run in ``--workdir``, trains the tiny preset there first
(``scripts/train_nmt.py --data embedded --preset tiny --max-steps 300``, a few minutes on 2
cores). Then writes the run as CTranslate2 float32 and int8 (`nlp.export.ctranslate2.write`, what
``tfx-export --format ctranslate2`` runs) and translates the held-out sentences with each:

* ``SavedModel``: the export's ``serving_default`` (beam search as exported), batches of
  ``--batch-size`` sentences of similar length (`nlp.training.evaluate.translate_all`), TensorFlow
  on ``--threads`` threads;
* ``CT2 float32``, ``CT2 int8``: `nlp.export.ctranslate2_runtime.Ct2Translator` on ``--threads``
threads;
* ``CT2 float32, patience 1``: the same with CTranslate2's beam patience 1 instead of the
  export's (2 for GNMT: it searches until twice the beam's width of hypotheses finished);
* ``CT2 float32, CTranslate2's length penalty`` (not timed): its own ``n ** α`` ranking
  instead of GNMT's, what rescoring in `nlp.export.ctranslate2_runtime` changes.

Per system: the share of sentences whose translation is the SavedModel's, sacrebleu's corpus
BLEU against the references, output tokens per second (SentencePiece pieces of the system's
own translations plus eos, per wall second and per CPU second of this process (steadier on
a shared machine); medians over ``--repeats`` passes, the systems alternating, after one
warm-up pass each) with the ratios to the SavedModel, and the size on disk. Prints a
Markdown table and the JSON. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent

import sacrebleu  # noqa: E402
import tensorflow as tf  # noqa: E402

from nlp.data.sources import evaluation_split, load_pairs  # noqa: E402
from nlp.export import ctranslate2  # noqa: E402
from nlp.export.ctranslate2_runtime import Ct2Translator  # noqa: E402
from nlp.export.load import load_translator  # noqa: E402
from nlp.text.tokenizer import Tokenizer  # noqa: E402
from nlp.training.evaluate import translate_all  # noqa: E402

TRAIN_STEPS = 300


def train(workdir: Path) -> None:
    if not (workdir / "export" / "saved_model.pb").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "train_nmt.py"), "--data",
                        "embedded", "--preset", "tiny", "--max-steps", str(TRAIN_STEPS),
                        "--workdir", str(workdir)], check=True)


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "formats_translator"))
    parser.add_argument("--limit", type=int, default=500, help="held-out sentences")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    workdir = Path(args.workdir)
    train(workdir)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    pairs = load_pairs("embedded", evaluation_split("embedded"), limit=args.limit)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    out = Path(tempfile.mkdtemp(prefix="formats_translator_"))
    dirs = {p: out / p for p in ("float32", "int8")}
    for precision, path in dirs.items():
        ctranslate2.write(workdir, path, precision, None)
    saved = load_translator(workdir / "export")
    ct2 = {"CT2 float32": Ct2Translator(dirs["float32"], threads=args.threads),
           "CT2 float32, patience 1": Ct2Translator(dirs["float32"], threads=args.threads,
                                                    patience=1.0),
           "CT2 int8": Ct2Translator(dirs["int8"], threads=args.threads)}
    systems = {"SavedModel": lambda: translate_all(saved, sources, args.batch_size,
                                                   progress=False)}
    for name, translator in ct2.items():
        systems[name] = lambda t=translator: t.translate(sources, batch_size=args.batch_size)
    sizes = {"SavedModel": size(workdir / "export"), "CT2 float32": size(dirs["float32"]),
             "CT2 float32, patience 1": size(dirs["float32"]), "CT2 int8": size(dirs["int8"])}
    outputs = {name: run() for name, run in systems.items()}  # also the warm-up pass
    plain = Ct2Translator(dirs["float32"], threads=args.threads)
    plain.settings = {**plain.settings, "convention": "transformers"}  # ranks by n ** α
    outputs["CT2 float32, CTranslate2's length penalty"] = plain.translate(sources)
    times = {name: [] for name in systems}  # (wall s, CPU s of this process) per pass
    for _ in range(args.repeats):
        for name, run in systems.items():
            start, cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append((time.perf_counter() - start, time.process_time() - cpu))
    tokenizer = Tokenizer.from_file(workdir / "tokenizer.model")
    rows = {}
    for name, hypotheses in outputs.items():
        row = {"identical": sum(a == b for a, b in zip(hypotheses, outputs["SavedModel"]))
               / len(sources),
               "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}
        if name in times:
            tokens = sum(len(tokenizer.encode(h)) + 1 for h in hypotheses)
            wall = statistics.median(t for t, _ in times[name])
            cpu = statistics.median(c for _, c in times[name])
            row.update(seconds=wall, cpu_seconds=cpu, tokens_per_second=tokens / wall,
                       tokens_per_cpu_second=tokens / cpu, size_bytes=sizes[name])
        rows[name] = row
    base = rows["SavedModel"]
    settings = json.loads((dirs["float32"] / "settings.json").read_text())
    print(f"{len(sources)} held-out sentences, beam {settings['beam_size']} (length penalty "
          f"{settings['length_penalty']}, {settings['convention']}), {args.threads} threads; "
          f"{machine()}; load {os.getloadavg()[0]:.1f}")
    print("| system | identical to SavedModel | BLEU | tokens/s | ratio | tokens/CPU s | ratio "
          "| size |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        speed = " | ".join(
            f"{row[key]:.0f} | {row[key] / base[key]:.2f}x"
            for key in ("tokens_per_second", "tokens_per_cpu_second")) \
            + f" | {row['size_bytes'] / 2**20:.2f} MiB" if "seconds" in row else "- | - | - | - | -"
        print(f"| {name} | {100 * row['identical']:.1f}% | {row['bleu']:.2f} | {speed} |")
    print(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
