"""Decoding engines on the same weights: our SavedModel against transformers' ``generate``
(PyTorch CPU) and CTranslate2 (float32 and int8), for a base-size OPUS-MT-layout model.

    python benchmarks/nmt_engines.py [--workdir runs/nmt_engines] [--sentences 500]
                                     [--repeats 3] [--batch-size 32] [--vocab-size 58101]
                                     [--size base|tiny] [--engines ours,transformers,...]
                                     [--modes beam,greedy] [--ours LABEL=EXPORT_DIR ...]

``--size tiny`` builds the same folder in the project's tiny preset's dimensions (2+2 layers,
d_model 128, 4 heads, ffn 512; Marian's swish; random weights with the eos bias); use it with
``--pieces 2000 --vocab-size 0`` (no padding: the vocabulary is the two SentencePiece models'
pieces). ``--ours LABEL=DIR`` adds a SavedModel written by another version of the search
(``scripts/convert_nmt.py`` run at that version) as engine ``ours LABEL``, alternating with
the others: the before/after ratio of a change to the search.

Nothing is downloaded. Steps, each in its own process (transformers' modeling code never shares
a process with TensorFlow):

1. ``benchmarks/marian_stages.py --stage data`` and ``--stage build`` (see
   ``benchmarks/nmt_marian.py``): the embedded corpus, two SentencePiece models trained on it,
   and a ``MarianMTModel`` of random weights written with ``save_pretrained`` (6+6 layers,
   d_model 512, 8 heads, ffn 2048, swish, shared tied vocabulary; eos bias set so that
   translations are about as long as their sources). Here ``vocab.json`` is padded with
   unused pieces to ``--vocab-size`` entries (OPUS-MT en-de's size, 58,101) so that the output
   projection, softmax and top-k cost what they cost in a real model; the padding pieces get
   ``final_logits_bias`` -30, so they are computed at every step but never chosen; the
   ``<pad>`` row (the decoder start) is zeros, as in OPUS-MT's models (CTranslate2 starts
   Marian decoders from a zero embedding and drops ``<pad>`` from the vocabulary);
2. ``scripts/convert_nmt.py FOLDER --out DIR`` (this project's converter) and CTranslate2's
   own ``ct2-transformers-converter --model FOLDER`` (float32; int8 is CTranslate2's
   ``compute_type="int8"`` on load);
3. three workers, each on 2 threads (ours: TensorFlow's default pools on this 2-core machine;
   transformers: ``torch.set_num_threads(2)``; CTranslate2: ``intra_threads=2``), translate
   the first ``--sentences`` held-out sentences sorted by length in batches of
   ``--batch-size``, beam 4 and greedy: ours the export's ``serving_default`` / ``greedy``
   (at most source length + 50 tokens), transformers ``generate(num_beams=4 or 1,
   max_new_tokens=50 + longest source of the batch)``, CTranslate2 ``translate_batch`` with
   the same beam, ``max_decoding_length`` 49 + the longest source (its limit leaves out the
   eos that transformers' ``forced_eos_token_id`` puts last) and ``min_decoding_length=0``
   (its default 1 forbids an immediate eos). Each warms up on the shortest and longest
   batch; the engines alternate within every repeat; times are medians.

Generated tokens, for every engine alike: its translations encoded with the target
SentencePiece model, + 1 (eos) each (each engine's own count, where it has one, in the JSON).
Agreement: translations identical to transformers' with the same beam. Prints a table and
JSON last. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import marian_stages  # this script's folder is on the path when it runs
from marian_stages import batches_of, count_generated, emit
from nmt_marian import ENV, PY, ROOT, Worker, machine, read_result

STAGES = [PY, os.path.join(ROOT, "benchmarks", "marian_stages.py")]
ENGINES = ("ours", "transformers", "ct2 float32", "ct2 int8")
def stage_args(args) -> list:
    return ["--workdir", args.workdir, "--sentences", str(args.sentences),
            "--batch-size", str(args.batch_size), "--pieces", str(args.pieces),
            "--calibration-steps", str(args.calibration_steps)]


# ---------------------------------------------------------------------------------- workers

def serve(args, translate) -> None:
    """Warm up, then answer ``beam``/``greedy`` lines with the pass's time and outputs."""
    with open(os.path.join(args.workdir, "pairs.json"), encoding="utf-8") as f:
        batches = batches_of(json.load(f)["sources"], args.batch_size)
    for mode in ("beam", "greedy"):
        for batch in (batches[0], batches[-1]):
            translate(batch, mode)
    emit({"ready": True})
    for line in sys.stdin:
        mode = line.strip()
        if mode == "quit":
            return
        started = time.perf_counter()
        done = [translate(batch, mode) for batch in batches]
        seconds = time.perf_counter() - started
        emit({"seconds": seconds, "translations": [t for texts, _ in done for t in texts],
              "tokens": sum(n for _, n in done)})


def worker_ours(args) -> None:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's ops)

    export = tf.saved_model.load(args.export or os.path.join(args.workdir, "converted",
                                                             "export"))
    signatures = {"beam": export.signatures["serving_default"],
                  "greedy": export.signatures["greedy"]}

    def translate(batch, mode):
        out = signatures[mode](text=tf.constant(batch))["translation"].numpy()
        return [t.decode("utf-8") for t in out], 0  # tokens: counted by the parent

    serve(args, translate)


def worker_theirs(args) -> None:
    import torch
    import transformers

    torch.set_num_threads(2)
    folder = os.path.join(args.workdir, "opus")
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    eos = model.config.eos_token_id

    def translate(batch, mode):
        enc = tokenizer(batch, padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, num_beams=4 if mode == "beam" else 1,
                                 max_new_tokens=50 + int(enc["attention_mask"].sum(1).max()))
        return (tokenizer.batch_decode(out, skip_special_tokens=True),
                sum(count_generated(row, eos) for row in out))

    if args.count:  # target-spm tokens (+ eos) of the texts on stdin, then exit
        texts = json.loads(sys.stdin.readline())
        emit({"tokens": sum(len(tokenizer(text_target=t)["input_ids"]) for t in texts)})
        return
    serve(args, translate)


def worker_ct2(args) -> None:
    import ctranslate2
    import transformers

    tokenizer = transformers.MarianTokenizer.from_pretrained(os.path.join(args.workdir, "opus"))
    translator = ctranslate2.Translator(os.path.join(args.workdir, "ct2"), device="cpu",
                                        compute_type=args.compute_type, intra_threads=2,
                                        inter_threads=1)

    def translate(batch, mode):
        tokens = [tokenizer.convert_ids_to_tokens(tokenizer.encode(s)) for s in batch]
        results = translator.translate_batch(
            tokens, beam_size=4 if mode == "beam" else 1,
            max_decoding_length=49 + max(len(t) for t in tokens), min_decoding_length=0)
        out = [r.hypotheses[0] for r in results]
        texts = [tokenizer.decode(tokenizer.convert_tokens_to_ids(t), skip_special_tokens=True)
                 for t in out]
        return texts, sum(len(t) + 1 for t in out)

    serve(args, translate)


# ----------------------------------------------------------------------------------- parent

def prepare(args) -> dict:
    """Data, the transformers folder, our conversion and CTranslate2's (each once)."""
    report = {}
    folder, converted = os.path.join(args.workdir, "opus"), os.path.join(args.workdir,
                                                                         "converted")
    steps = [
        ("data", [*STAGES, "--stage", "data", *stage_args(args)], None),
        ("build", [PY, __file__, "--stage", "build", *stage_args(args),
                   "--vocab-size", str(args.vocab_size), "--size", args.size],
         f"{folder}/model.safetensors"),
        ("convert", [PY, "scripts/convert_nmt.py", folder, "--out", converted],
         f"{converted}/export/saved_model.pb"),
        ("ct2", [os.path.join(os.path.dirname(PY), "ct2-transformers-converter"), "--model",
                 folder, "--output_dir", os.path.join(args.workdir, "ct2"), "--force"],
         os.path.join(args.workdir, "ct2", "model.bin")),
    ]
    for name, command, done in steps:
        if done is not None and os.path.exists(done):
            continue
        started = time.time()
        proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"error: step {name} failed ({proc.returncode})")
        lines = proc.stdout.splitlines()
        report[name] = {"seconds": round(time.time() - started, 1)}
        if any(line.startswith("RESULT ") for line in lines):
            report[name].update(read_result(lines))
        print(f"{name}: {json.dumps(report[name])}", flush=True)
    return report


class EngineWorker(Worker):
    def __init__(self, name, stage, args, *extra):
        log = open(os.path.join(args.workdir, f"{name.replace(' ', '_')}.log"), "w")
        self.proc = subprocess.Popen(
            [PY, __file__, "--stage", stage, *stage_args(args), *extra], cwd=ROOT, env=ENV,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        read_result(self.proc.stdout)


def count_tokens(args, texts) -> int:
    proc = subprocess.run([PY, __file__, "--stage", "theirs", "--count", *stage_args(args)],
                          cwd=ROOT, env=ENV, input=json.dumps(texts) + "\n",
                          capture_output=True, text=True, check=True)
    return read_result(proc.stdout.splitlines())["tokens"]


def main(args) -> None:
    started = time.time()
    os.makedirs(args.workdir, exist_ok=True)
    report = {"machine": machine(), "load_before": os.getloadavg(), **prepare(args)}
    starts = {"ours": ("ours",), "transformers": ("theirs",),
              "ct2 float32": ("ct2", "--compute-type", "float32"),
              "ct2 int8": ("ct2", "--compute-type", "int8")}
    for label, export in (item.split("=", 1) for item in args.ours):
        starts[f"ours {label}"] = ("ours", "--export", os.path.abspath(export))
    engines = [e for e in args.engines.split(",") if e] + [f"ours {item.split('=')[0]}"
                                                         for item in args.ours]
    modes = args.modes.split(",")
    workers = {engine: EngineWorker(engine, starts[engine][0], args, *starts[engine][1:])
               for engine in engines}
    times = {(e, m): [] for e in engines for m in modes}
    results = {}
    for repeat in range(args.repeats):
        for mode in modes:
            for engine in engines:
                results[engine, mode] = workers[engine].ask(mode)
                times[engine, mode].append(results[engine, mode]["seconds"])
                print(f"pass {repeat + 1}, {mode}, {engine}: "
                      f"{results[engine, mode]['seconds']:.1f} s", flush=True)
    for worker in workers.values():
        worker.close()
    rows = []
    same_as = "transformers" if "transformers" in engines else engines[0]
    ours = next(e for e in engines if e.startswith("ours"))
    for mode in modes:
        for engine in engines:
            out = results[engine, mode]
            out["own_count"], out["tokens"] = out["tokens"], count_tokens(args,
                                                                          out["translations"])
        reference = results[same_as, mode]["translations"]
        our_texts = results[ours, mode]["translations"]  # a change to the search keeps them
        base = statistics.median(times[engines[0], mode])
        for engine in engines:
            seconds = statistics.median(times[engine, mode])
            out = results[engine, mode]
            rows.append({"mode": mode, "engine": engine, "seconds": round(seconds, 2),
                         "sentences_per_s": round(len(out["translations"]) / seconds, 2),
                         "tokens": out["tokens"], "own_count": out["own_count"],
                         "tokens_per_s": round(out["tokens"] / seconds, 1),
                         "ours_time_over_this": round(base / seconds, 2),
                         "same_as_transformers": sum(a == b for a, b in
                                                     zip(out["translations"], reference)),
                         f"same_as_{ours}": sum(a == b for a, b in
                                                zip(out["translations"], our_texts))})
    n = len(results[engines[0], modes[0]]["translations"])
    print(f"\nmachine: {report['machine']}; {n} sentences, median of {args.repeats} passes")
    print(f"| decoding | engine | s | sentences/s | tokens/s | {engines[0]} time / its time | "
          f"same as {same_as} |\n|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['engine']} | {r['seconds']:.2f} | {r['sentences_per_s']:.2f} | "
              f"{r['tokens_per_s']:.1f} | {r['ours_time_over_this']:.2f} | "
              f"{r['same_as_transformers']} / {n} |")
    report.update(rows=rows, times={f"{e}, {m}": t for (e, m), t in times.items()},
                  load_after=os.getloadavg(), seconds=round(time.time() - started, 1))
    print(json.dumps(report))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/nmt_engines")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=58101,
                        help="pad the vocabulary to this size (0: no padding)")
    parser.add_argument("--size", choices=("base", "tiny"), default="base")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--modes", default="beam,greedy")
    parser.add_argument("--ours", action="append", default=[], metavar="LABEL=EXPORT_DIR",
                        help="another SavedModel to time as engine 'ours LABEL'")
    parser.add_argument("--calibration-steps", type=int, default=6)
    parser.add_argument("--pieces", type=int, default=8000)
    for name, default in (("train-batch", 16), ("train-length", 32), ("train-steps", 10),
                          ("warmup-steps", 2)):  # marian_stages.stage_build's batches
        parser.add_argument(f"--{name}", type=int, default=default, help=argparse.SUPPRESS)
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compute-type", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--export", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)
    return args


if __name__ == "__main__":
    ARGS = parse()
    if ARGS.stage is None:
        main(ARGS)
    else:
        {"build": marian_stages.stage_build_padded, "ours": worker_ours, "theirs": worker_theirs,
         "ct2": worker_ct2}[ARGS.stage](ARGS)
