"""The worker processes of the `engines` case, one per engine (CTranslate2's float32 and int8
translators share one), so that transformers' modeling code never shares a process with
TensorFlow:

    python -m cases.engines_stages ours|theirs|ct2 JOB_JSON

`workers.serve` workers, each engine on ``threads`` threads (ours: TensorFlow's intra- and
inter-op pools; transformers: ``torch.set_num_threads``; CTranslate2: ``intra_threads``):

- ``build`` (transformers, before ``load``): `engines_marian.build` writes the job's folder
  (its ``ct2/`` with CTranslate2's converter: ctranslate2 is imported there, never run);
- ``load``: read the model (ours: first convert ``opus/`` with ``scripts/convert_nmt.py``'s
  command, in this process), then translate the shortest and the longest batch in both modes
  (the warm-up);
- ``beam`` / ``greedy`` (CTranslate2: payload ``"float32"`` or ``"int8"``): one timed pass
  over the sources sorted by length, in batches: ``{"seconds", "translations", "tokens"}``
  (``tokens``: the engine's own count of generated tokens, eos included; ours has none);
- ``count`` (transformers): target-SentencePiece tokens + 1 (eos) of the given texts;
- ``train`` / ``step`` (ours, transformers): set up fine-tuning, then one timed step on the
  next batch of ``train_batches.npz``: ``{"seconds", "loss"}``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import workers

from cases import engines_marian

MODES = ("beam", "greedy")


def batches_of(sources: list, size: int) -> list:
    """The sources sorted by length in words (then position), in batches of ``size``."""
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i].split()), i))
    return [[sources[i] for i in order[k:k + size]] for k in range(0, len(order), size)]


def serve(job: dict, load, translate, variants=(None,), **handlers) -> None:
    """`workers.serve` with ``load`` (then the warm-up of each variant), ``beam`` and
    ``greedy`` (payload: the variant); ``translate(batch, mode, variant)`` returns ``(texts,
    generated tokens)``."""
    batches = []

    def loaded(_):
        started, cpu = time.perf_counter(), time.process_time()
        with open(os.path.join(job["home"], "pairs.json"), encoding="utf-8") as f:
            batches[:] = batches_of(json.load(f)["sources"], job["batch_size"])
        info = load() or {}
        for variant in variants:
            for mode in MODES:
                for batch in (batches[0], batches[-1]):
                    translate(batch, mode, variant)
        return {**info, "seconds": round(time.perf_counter() - started, 2),
                "cpu_seconds": round(time.process_time() - cpu, 2),
                "process_cpu_seconds": round(time.process_time(), 2)}

    def timed(mode):
        def run(variant):
            started = time.perf_counter()
            done = [translate(batch, mode, variant) for batch in batches]
            seconds = time.perf_counter() - started
            return {"seconds": seconds, "translations": [t for texts, _ in done for t in texts],
                    "tokens": sum(n for _, n in done)}
        return run

    workers.serve({"load": loaded, "beam": timed("beam"), "greedy": timed("greedy"),
                   **handlers})


def trainer(job: dict, setup):
    """``train`` and ``step`` handlers: ``setup()`` returns ``step(batch) -> loss``."""
    import numpy as np

    state = {"count": 0}

    def train(_):
        state["data"] = dict(np.load(os.path.join(job["home"], "train_batches.npz")))
        state["step"] = setup()
        return {"batches": len(state["data"]["source"]) // job["train_batch"],
                "process_cpu_seconds": round(time.process_time(), 2)}

    def step(_):
        data, b = state["data"], job["train_batch"]
        k = state["count"] % (len(data["source"]) // b)
        state["count"] += 1
        batch = {key: value[k * b:(k + 1) * b] for key, value in data.items()}
        started = time.perf_counter()
        loss = state["step"](batch)
        return {"seconds": time.perf_counter() - started, "loss": loss,
                "process_cpu_seconds": round(time.process_time(), 2)}

    return {"train": train, "step": step}


# ------------------------------------------------------------------------------------- ours

def ours(job: dict) -> None:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's ops)

    tf.config.threading.set_intra_op_parallelism_threads(job["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(job["threads"])

    from nlp.commands.convert import main as convert
    from nlp.config import preset
    from nlp.pretrained.model_dir import read_model_dir
    from nlp.training.train import compile_model

    converted, signatures = os.path.join(job["home"], "converted"), {}

    def load():
        info = {}
        if not os.path.exists(os.path.join(converted, "export", "saved_model.pb")):
            shutil.rmtree(converted, ignore_errors=True)  # a conversion cut short
            started = time.perf_counter()
            if convert([os.path.join(job["home"], "opus"), "--out", converted]):
                raise RuntimeError("scripts/convert_nmt.py's conversion failed (see the log)")
            info["convert_seconds"] = round(time.perf_counter() - started, 1)
        export = tf.saved_model.load(os.path.join(converted, "export"))
        signatures.update(beam=export.signatures["serving_default"],
                          greedy=export.signatures["greedy"], export=export)
        return info

    def translate(batch, mode, _):
        out = signatures[mode](text=tf.constant(batch))["translation"].numpy()
        return [t.decode("utf-8") for t in out], 0

    def setup():
        model = read_model_dir(converted)[0]
        config = preset("base", num_encoder_layers=model.num_encoder_layers,
                        num_decoder_layers=model.num_decoder_layers, d_model=model.d_model,
                        num_heads=model.num_heads, ffn_dim=model.ffn_dim,
                        vocab_size=model.vocab_size, max_positions=model.max_positions,
                        max_length=min(256, model.max_positions))
        compile_model(model, config, jit_compile=False)  # train_nmt's default: no XLA

        def step(batch):
            x = {"source": tf.constant(batch["source"]),
                 "target_in": tf.constant(batch["target_in"])}
            loss = model.train_on_batch(x, tf.constant(batch["target_out"]), return_dict=True)
            return float(loss["loss"])
        return step

    serve(job, load, translate, **trainer(job, setup))


# ------------------------------------------------------------------------------ transformers

def theirs(job: dict) -> None:
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(job["threads"])
    torch.manual_seed(0)
    folder, state = os.path.join(job["home"], "opus"), {}

    def load():
        state["tokenizer"] = transformers.MarianTokenizer.from_pretrained(folder)
        state["model"] = transformers.MarianMTModel.from_pretrained(folder).eval()

    def translate(batch, mode, _):
        tokenizer, model = state["tokenizer"], state["model"]
        enc = tokenizer(batch, padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, num_beams=4 if mode == "beam" else 1,
                                 max_new_tokens=50 + int(enc["attention_mask"].sum(1).max()))
        eos = model.config.eos_token_id
        return (tokenizer.batch_decode(out, skip_special_tokens=True),
                sum(engines_marian.count_generated(row, eos) for row in out))

    def count(texts):
        tokenizer = state["tokenizer"]
        return {"tokens": sum(len(tokenizer(text_target=t)["input_ids"]) for t in texts)}

    def setup():
        model = state["model"].train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98), eps=1e-9)

        def step(batch):
            part = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}
            loss = model(input_ids=part["source"], attention_mask=torch.ones_like(part["source"]),
                         decoder_input_ids=part["target_in"], labels=part["target_out"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss)
        return step

    def build(_):
        return engines_marian.build(job)

    serve(job, load, translate, build=build, count=count, **trainer(job, setup))


# ------------------------------------------------------------------------------ CTranslate2

def ct2(job: dict) -> None:
    import ctranslate2
    import transformers

    state, types = {}, ("float32", "int8")

    def load():
        state["tokenizer"] = transformers.MarianTokenizer.from_pretrained(
            os.path.join(job["home"], "opus"))
        for compute_type in types:
            state[compute_type] = ctranslate2.Translator(
                os.path.join(job["home"], "ct2"), device="cpu", compute_type=compute_type,
                intra_threads=job["threads"], inter_threads=1)

    def translate(batch, mode, compute_type):
        tokenizer = state["tokenizer"]
        tokens = [tokenizer.convert_ids_to_tokens(tokenizer.encode(s)) for s in batch]
        # max_decoding_length leaves out the eos that transformers' forced_eos_token_id puts
        # last; min_decoding_length 0: the default 1 forbids an immediate eos
        results = state[compute_type].translate_batch(
            tokens, beam_size=4 if mode == "beam" else 1,
            max_decoding_length=49 + max(len(t) for t in tokens), min_decoding_length=0)
        out = [r.hypotheses[0] for r in results]
        texts = [tokenizer.decode(tokenizer.convert_tokens_to_ids(t), skip_special_tokens=True)
                 for t in out]
        return texts, sum(len(t) + 1 for t in out)

    serve(job, load, translate, variants=types)


if __name__ == "__main__":
    {"ours": ours, "theirs": theirs, "ct2": ct2}[sys.argv[1]](json.loads(sys.argv[2]))
