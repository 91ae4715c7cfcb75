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
2. transformers builds the OPUS-MT folder as ``tests/nlp/reference_marian.py`` does (its
   config, its random weights and its files), but base-size: 6+6 layers, d_model 512, 8 heads,
   ffn 2048, swish, shared vocabulary (the union of both spm models, OPUS-MT's ``vocab.json``).
   With random weights the beams would run to the length limit; the bias of eos in
   ``final_logits_bias`` is set (by bisection on greedy decoding of 32 sentences) so that
   translations are about as long as their sources, as OPUS-MT's are;
3. ``scripts/convert_nmt.py FOLDER --out DIR``;
4. two workers stay up, ours (TensorFlow: ``DIR/export``'s ``serving_default``, and
   ``DIR/model.keras`` compiled as ``nlp.train.compile_model`` does, without XLA as
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


def emit(obj) -> None:
    """A result line for the parent (everything else a worker prints is ignored)."""
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_result(stream) -> dict:
    for line in stream:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("worker ended without a result")


# ----------------------------------------------------------------------------------- stage data

def stage_data(args) -> None:
    from nlp.data.sources import load_pairs

    train = load_pairs("embedded", "train", valid_fraction=0.05, seed=0)
    valid = load_pairs("embedded", "valid", valid_fraction=0.05, seed=0)
    with open(os.path.join(args.workdir, "pairs.json"), "w", encoding="utf-8") as f:
        json.dump({"train": train, "sources": [s for s, _ in valid[:args.sentences]]}, f,
                  ensure_ascii=False)
    emit({"train": len(train), "sources": min(len(valid), args.sentences)})


# ---------------------------------------------------------------------------------- stage build

def stage_build(args) -> None:
    import io

    import numpy as np
    import sentencepiece
    import torch
    import transformers

    sys.path.insert(0, os.path.join(ROOT, "tests", "nlp"))
    import reference_marian as ref

    started = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    folder = os.path.join(args.workdir, "opus")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(args.workdir, "pairs.json"), encoding="utf-8") as f:
        data = json.load(f)
    train, sources = data["train"], data["sources"]
    sentencepiece.set_min_log_level(2)

    def spm(lines, path):
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
            vocab_size=args.pieces, hard_vocab_limit=False, character_coverage=1.0,
            num_threads=2)
        with open(path, "wb") as f:
            f.write(model.getvalue())
        return sentencepiece.SentencePieceProcessor(model_file=path)

    source_spm = spm([s for s, _ in train], f"{folder}/source.spm")
    target_spm = spm([t for _, t in train], f"{folder}/target.spm")

    def kept(p):
        return [p.id_to_piece(i) for i in range(p.get_piece_size())
                if not (p.is_unknown(i) or p.is_control(i))]

    source_pieces, target_pieces = kept(source_spm), kept(target_spm)
    seen = set(source_pieces)
    vocab = ref.opus_vocab(source_pieces + [p for p in target_pieces if p not in seen])
    ref.write_json(f"{folder}/vocab.json", vocab)
    ref.write_json(f"{folder}/tokenizer_config.json", {
        "source_lang": "en", "target_lang": "de", "separate_vocabs": False,
        "model_max_length": 512})
    ref.write_json(f"{folder}/special_tokens_map.json",
                   {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    spm_seconds = time.time() - started

    config = ref.marian_config(True, len(vocab), len(vocab))
    config.d_model, config.encoder_ffn_dim, config.decoder_ffn_dim = 512, 2048, 2048
    model = transformers.MarianMTModel(config).eval()
    ref.randomize(model, ref.SCALES["shared"])
    tokenizer = transformers.MarianTokenizer(
        source_spm=f"{folder}/source.spm", target_spm=f"{folder}/target.spm",
        vocab=f"{folder}/vocab.json", source_lang="en", target_lang="de")

    # eos bias: bisection so that greedy translations of 32 sentences are about as long as
    # their sources (mean), instead of running to the length limit.
    probe = tokenizer(sources[:32], padding=True, return_tensors="pt")
    target_length = float(probe["attention_mask"].sum(1).float().mean())
    eos, pad = config.eos_token_id, config.pad_token_id
    base = float(model.final_logits_bias[0, eos])
    low, high, lengths = 0.0, 40.0, []
    for _ in range(args.calibration_steps):
        mid = (low + high) / 2
        with torch.no_grad():
            model.final_logits_bias[0, eos] = base + mid
        with torch.inference_mode():
            out = model.generate(**probe, num_beams=1, max_new_tokens=int(target_length * 3),
                                 bad_words_ids=[[pad]])
        length = float(np.mean([count_generated(row, eos) for row in out]))
        lengths.append((round(mid, 2), round(length, 1)))
        if length > target_length:
            low = mid
        else:
            high = mid
    with torch.no_grad():
        model.final_logits_bias[0, eos] = base + (low + high) / 2
    model.save_pretrained(folder)
    ref.write_json(f"{folder}/generation_config.json", ref.generation_config(pad))

    # Fine-tuning batches: the training pairs' ids run together, cut into rows of L tokens.
    n = args.train_batch * max(args.warmup_steps + args.train_steps, 24)
    length = args.train_length
    src_ids, tgt_ids = [], []
    for s, t in train:
        if len(src_ids) >= n * length and len(tgt_ids) >= n * length:
            break
        src_ids += tokenizer(s)["input_ids"]
        tgt_ids += tokenizer(text_target=t)["input_ids"]
    source = np.array(src_ids[:n * length], np.int32).reshape(n, length)
    target_out = np.array(tgt_ids[:n * length], np.int32).reshape(n, length)
    target_in = np.concatenate([np.full((n, 1), pad, np.int32), target_out[:, :-1]], 1)
    np.savez(os.path.join(args.workdir, "train_batches.npz"), source=source,
             target_in=target_in, target_out=target_out)
    emit({"vocab_size": len(vocab), "source_pieces": source_spm.get_piece_size(),
          "target_pieces": target_spm.get_piece_size(),
          "parameters": sum(p.numel() for p in model.parameters()),
          "eos_bias_added": round((low + high) / 2, 2), "probe_source_length": target_length,
          "bisection": lengths, "spm_seconds": round(spm_seconds, 1),
          "seconds": round(time.time() - started, 1)})


def count_generated(row, eos: int) -> int:
    ids = row[1:].tolist()  # without the decoder start token
    return ids.index(eos) + 1 if eos in ids else len(ids)


# ------------------------------------------------------------------------------------- workers

def batches_of(sources, size):
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i].split()), i))
    return [[sources[i] for i in order[k:k + size]] for k in range(0, len(order), size)]


def worker_ours(args) -> None:
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's ops)

    from nlp.config import preset
    from nlp.model_dir import read_model_dir
    from nlp.train import compile_model

    model_dir = os.path.join(args.workdir, "converted")
    with open(os.path.join(args.workdir, "pairs.json"), encoding="utf-8") as f:
        batches = batches_of(json.load(f)["sources"], args.batch_size)
    translator = tf.saved_model.load(os.path.join(model_dir, "export"))
    serve = translator.signatures["serving_default"]

    def translate(batch):
        return [t.decode("utf-8") for t in serve(text=tf.constant(batch))["translation"].numpy()]

    for batch in (batches[0], batches[-1]):
        translate(batch)
    emit({"ready": True})
    model = None
    for line in sys.stdin:
        command = line.strip()
        if command == "translate":
            started = time.perf_counter()
            out = [t for batch in batches for t in translate(batch)]
            emit({"seconds": time.perf_counter() - started, "translations": out})
        elif command == "train":
            data = np.load(os.path.join(args.workdir, "train_batches.npz"))
            model, _, _, _ = read_model_dir(model_dir)
            config = preset("base", num_encoder_layers=model.num_encoder_layers,
                            num_decoder_layers=model.num_decoder_layers, d_model=model.d_model,
                            num_heads=model.num_heads, ffn_dim=model.ffn_dim,
                            vocab_size=model.vocab_size, max_positions=model.max_positions,
                            max_length=min(256, model.max_positions))
            compile_model(model, config, jit_compile=False)
            b = args.train_batch
            times = []
            for step in range(args.warmup_steps + args.train_steps):
                x = {"source": tf.constant(data["source"][step * b:(step + 1) * b]),
                     "target_in": tf.constant(data["target_in"][step * b:(step + 1) * b])}
                y = tf.constant(data["target_out"][step * b:(step + 1) * b])
                started = time.perf_counter()
                loss = model.train_on_batch(x, y, return_dict=True)
                times.append(time.perf_counter() - started)
            emit({"step_seconds": times[args.warmup_steps:],
                  "loss": float(loss["loss"]), "parameters": model.count_params()})
        elif command == "quit":
            return


def worker_theirs(args) -> None:
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(2)
    torch.manual_seed(0)
    folder = os.path.join(args.workdir, "opus")
    with open(os.path.join(args.workdir, "pairs.json"), encoding="utf-8") as f:
        batches = batches_of(json.load(f)["sources"], args.batch_size)
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    eos = model.config.eos_token_id

    def translate(batch):
        enc = tokenizer(batch, padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, num_beams=4,
                                 max_new_tokens=50 + int(enc["attention_mask"].sum(1).max()))
        return ([count_generated(row, eos) for row in out],
                tokenizer.batch_decode(out, skip_special_tokens=True))

    for batch in (batches[0], batches[-1]):
        translate(batch)
    emit({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command == "translate":
            started = time.perf_counter()
            counts, out = [], []
            for batch in batches:
                c, t = translate(batch)
                counts += c
                out += t
            emit({"seconds": time.perf_counter() - started, "translations": out,
                  "tokens": sum(counts)})
        elif command.startswith("count "):  # target-spm tokens (+ eos) of the given texts
            texts = json.loads(command[len("count "):])
            emit({"tokens": sum(len(tokenizer(text_target=t)["input_ids"]) for t in texts)})
        elif command == "train":
            data = np.load(os.path.join(args.workdir, "train_batches.npz"))
            model.train()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98),
                                         eps=1e-9)
            b, times = args.train_batch, []
            for step in range(args.warmup_steps + args.train_steps):
                part = {k: torch.from_numpy(data[k][step * b:(step + 1) * b].astype(np.int64))
                        for k in ("source", "target_in", "target_out")}
                started = time.perf_counter()
                loss = model(input_ids=part["source"],
                             attention_mask=torch.ones_like(part["source"]),
                             decoder_input_ids=part["target_in"], labels=part["target_out"]).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - started)
            emit({"step_seconds": times[args.warmup_steps:], "loss": float(loss)})
        elif command == "quit":
            return


# -------------------------------------------------------------------------------------- parent

def run_stage(stage, args) -> dict:
    command = [PY, os.path.abspath(__file__), "--stage", stage, *passthrough(args)]
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
            [PY, os.path.abspath(__file__), "--stage", stage, *passthrough(args)], cwd=ROOT,
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
    ARGS = parse()
    {"data": stage_data, "build": stage_build, "ours": worker_ours, "theirs": worker_theirs,
     None: main}[ARGS.stage](ARGS)
