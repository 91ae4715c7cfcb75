"""A base-size OPUS-MT (Marian) model of random weights, converted with
``scripts/convert_nmt.py``: translation speed of our export against transformers'
``MarianMTModel.generate``, and fine-tuning speed of the converted Keras model against
transformers' model with torch's Adam.

    python benchmarks/nmt_marian.py [--workdir runs/nmt_marian] [--sentences 500] [--repeats 3]
                                    [--train-steps 10] [--pieces 8000]

Nothing is downloaded. The steps, each in its own process (transformers' modeling code must not
share a process with TensorFlow):

1. the embedded corpus (``nlp.data.sources.load_pairs("embedded", ...)``): the training pairs
   train the two SentencePiece models (``--pieces`` each, unigram, a soft limit: what
   SentencePiece can learn from the corpus; the embedded corpus's small vocabulary gives
   about 280 + 620 pieces, a shared vocabulary of 818, far below OPUS-MT's 58k: the output
   projection, and so the beam steps, cost less than a real model's) and fill the
   fine-tuning batches; the first
   ``--sentences`` held-out sources (``valid_fraction=0.05, seed=0``) are translated;
2. transformers builds the OPUS-MT folder as ``tests/nlp/pretrained/reference_marian.py`` does (its
   config, its random weights and its files), but base-size: 6+6 layers, d_model 512, 8 heads,
   ffn 2048, swish, shared vocabulary (the union of both spm models, OPUS-MT's ``vocab.json``).
   With random weights the beams would run to the length limit; the bias of eos in
   ``final_logits_bias`` is set (by bisection on greedy decoding of 32 sentences) so that
   translations are about as long as their sources, as OPUS-MT's are;
3. ``scripts/convert_nmt.py FOLDER --out DIR``;
4. two workers stay up, ours (TensorFlow: ``DIR/export``'s ``serving_default``, and
   ``DIR/model.keras`` compiled as ``nlp.training.train.compile_model`` does, without XLA as
   ``train_nmt`` by default) and theirs (torch, ``torch.set_num_threads(2)``); the parent
   alternates them:

   * translation: the sentences sorted by length, in batches of ``--batch-size``, beam 4.
     Ours decodes at most source length + 50 tokens a sentence; theirs gets
     ``max_new_tokens`` = 50 + the longest source of the batch (``torch.inference_mode``).
     Each worker first translates the shortest and the longest batch (warm-up); a pass is
     timed ``--repeats`` times, alternating, and the median is reported. Generated tokens:
     theirs counted from the ids (eos included), ours by encoding our translations with the
     target spm (+ eos): only an estimate, as random pieces re-segment into more pieces;
   * fine-tuning: the same ``--train-batch`` x ``--train-length`` batches (source, target_in,
     target_out, no padding) on both; ``--warmup-steps`` steps, then ``--train-steps`` timed
     steps; median step time. Ours: ``model.train_on_batch`` (Adam, global clip norm,
     label-smoothed loss); theirs: forward with ``labels``, backward, clip, ``torch.optim.Adam``.
     Tokens/s counts target tokens (batch x length).

Prints a table (ratios ours/theirs of the times: below 1, ours is faster) and JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
STAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marian_stages.py")


def read_result(stream) -> dict:
    for line in stream:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("worker ended without a result")


# -------------------------------------------------------------------------------------- parent

def run_stage(stage, args) -> dict:
    command = [PY, STAGES, "--stage", stage, *passthrough(args)]
    proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"stage {stage} failed ({proc.returncode})")
    return read_result(proc.stdout.splitlines())


def passthrough(args) -> list:
    out = []
    for name in ("workdir", "sentences", "batch_size", "repeats", "train_steps", "warmup_steps",
                 "train_batch", "train_length", "pieces", "calibration_steps"):
        out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return out


class Worker:
    def __init__(self, stage, args):
        self.proc = subprocess.Popen(
            [PY, STAGES, "--stage", stage, *passthrough(args)], cwd=ROOT,
            env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(os.path.join(args.workdir, f"{stage}.log"), "w"), text=True)
        read_result(self.proc.stdout)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return read_result(self.proc.stdout)

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait()


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def main(args) -> None:
    started = time.time()
    os.makedirs(args.workdir, exist_ok=True)
    report = {"machine": machine(), "load_before": os.getloadavg()}
    report["data"] = run_stage("data", args)
    if not os.path.exists(os.path.join(args.workdir, "opus", "model.safetensors")):
        report["build"] = run_stage("build", args)
        print("built:", json.dumps(report["build"]), flush=True)
    converted = os.path.join(args.workdir, "converted")
    if not os.path.exists(converted):
        t = time.time()
        subprocess.run([PY, "scripts/convert_nmt.py", os.path.join(args.workdir, "opus"),
                        "--out", converted], cwd=ROOT, env=ENV, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report["convert_seconds"] = round(time.time() - t, 1)
    ours, theirs = Worker("ours", args), Worker("theirs", args)
    t_ours, t_theirs = [], []
    for _ in range(args.repeats):
        a = ours.ask("translate")
        t_ours.append(a["seconds"])
        b = theirs.ask("translate")
        t_theirs.append(b["seconds"])
        print(f"translate pass: ours {a['seconds']:.1f} s, theirs {b['seconds']:.1f} s",
              flush=True)
    ours_tokens = theirs.ask("count " + json.dumps(a["translations"]))["tokens"]
    n = len(a["translations"])
    same = sum(x == y for x, y in zip(a["translations"], b["translations"]))
    tr_ours, tr_theirs = ours.ask("train"), theirs.ask("train")
    ours.close()
    theirs.close()
    so, st = statistics.median(t_ours), statistics.median(t_theirs)
    step_o, step_t = statistics.median(tr_ours["step_seconds"]), statistics.median(
        tr_theirs["step_seconds"])
    tokens = args.train_batch * args.train_length
    report.update(
        translate={"sentences": n, "ours_seconds": t_ours, "theirs_seconds": t_theirs,
                   "ours_tokens": ours_tokens, "theirs_tokens": b["tokens"],
                   "identical_translations": same},
        train={"ours_step_seconds": tr_ours["step_seconds"],
               "theirs_step_seconds": tr_theirs["step_seconds"],
               "ours_loss": tr_ours["loss"], "theirs_loss": tr_theirs["loss"],
               "ours_parameters": tr_ours["parameters"]},
        load_after=os.getloadavg(), seconds=round(time.time() - started, 1))
    rows = [
        ("translation, sentences/s", n / so, n / st, so / st),
        ("translation, generated tokens/s", ours_tokens / so, b["tokens"] / st, so / st),
        ("fine-tuning, target tokens/s", tokens / step_o, tokens / step_t, step_o / step_t),
    ]
    print(f"\nmachine: {report['machine']}")
    print("| measure | ours | transformers | time ours / theirs |\n|---|---:|---:|---:|")
    for name, x, y, r in rows:
        print(f"| {name} | {x:,.1f} | {y:,.1f} | {r:.2f} |")
    print(f"translation: {n} sentences, median of {args.repeats} passes (ours {so:.1f} s, theirs "
          f"{st:.1f} s), {ours_tokens} / {b['tokens']} generated tokens, {same} identical; "
          f"fine-tuning: {args.train_batch} x {args.train_length}, median of "
          f"{args.train_steps} steps (ours {step_o:.2f} s, theirs {step_t:.2f} s)")
    print(json.dumps(report))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/nmt_marian")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-length", type=int, default=32)
    parser.add_argument("--pieces", type=int, default=8000)
    parser.add_argument("--calibration-steps", type=int, default=6)
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)
    return args


if __name__ == "__main__":
    main(parse())
