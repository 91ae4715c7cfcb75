"""The child processes of `nmt_marian.py` (see its docstring): ``--stage data`` (the corpus),
``build`` (transformers writes the OPUS-MT folder), ``ours`` and ``theirs`` (the two workers
the parent alternates). transformers' modeling code never shares a process with TensorFlow.
Run by `nmt_marian.py`, not by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

from nmt_marian import ROOT, parse  # this script's folder is on the path when it runs

REFERENCE = os.path.join(ROOT, "tests", "nlp", "pretrained", "reference_marian.py")


def reference_module():
    """``tests/nlp/pretrained/reference_marian.py``, whose config, random weights and file writers
    the benchmark's folder shares with the parity tests."""
    spec = importlib.util.spec_from_file_location("reference_marian", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def emit(obj) -> None:
    """A result line for the parent (everything else a worker prints is ignored)."""
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


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

    ref = reference_module()

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

    config = ref.marian_config("shared", len(vocab), len(vocab))
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
    from nlp.pretrained.model_dir import read_model_dir
    from nlp.training.train import compile_model

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



# Used by nmt_engines.py: the base and tiny layouts, and the padded vocabulary.
FILLER_BIAS = -30.0
LAYOUTS = {  # OPUS-MT en-de's, and the project's tiny preset's dimensions in Marian's layout
    "base": dict(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                 activation_function="swish"),
    "tiny": dict(encoder_layers=2, decoder_layers=2, d_model=128, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
                 activation_function="swish"),
}


def stage_build_padded(args) -> None:
    """`stage_build` with ``vocab.json`` padded to ``--vocab-size`` (0: not
    padded), in the tiny preset's dimensions with ``--size tiny``."""
    global reference_module
    import torch
    import transformers

    original = reference_module
    fillers = {}

    def padded_reference():
        ref = original()
        plain_vocab, plain_randomize = ref.opus_vocab, ref.randomize

        def opus_vocab(middle, tc_big=False):
            real = plain_vocab(middle, tc_big)  # "</s>", "<unk>", pieces, "<pad>"
            fillers["range"] = (len(real) - 1, max(args.vocab_size, len(real)) - 1)
            extra = [f"▁unused{i}" for i in range(args.vocab_size - len(real))]
            return plain_vocab(list(middle) + extra, tc_big)

        def randomize(model, scales):
            plain_randomize(model, scales)
            first, last = fillers["range"]
            with torch.no_grad():
                model.final_logits_bias[0, first:last] = FILLER_BIAS
                # OPUS-MT's pad row (the decoder start) is zeros, and CTranslate2 relies on it:
                # its Marian models start from a zero embedding and drop <pad>.
                model.get_input_embeddings().weight[model.config.pad_token_id] = 0.0

        ref.opus_vocab, ref.randomize = opus_vocab, randomize
        return ref

    reference_module = padded_reference
    # The layout, set on the config as the model is built (after marian_stages sets its own).
    plain_init = transformers.MarianMTModel.__init__

    def init(self, config, *rest, **kwargs):
        for key, value in LAYOUTS[args.size].items():
            setattr(config, key, value)
        plain_init(self, config, *rest, **kwargs)

    transformers.MarianMTModel.__init__ = init
    stage_build(args)

if __name__ == "__main__":
    ARGS = parse()
    {"data": stage_data, "build": stage_build, "ours": worker_ours,
     "theirs": worker_theirs}[ARGS.stage](ARGS)
