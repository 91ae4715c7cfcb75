"""The transformers side of `gpu.py`: its sources (`make_sources`, `groups_of`) and its torch
worker (`TorchWorker` runs ``python experiments/gpu_torch.py WORKDIR``; torch and JAX each load
their own CUDA libraries, so they never share a process).

Builds ``nmt_engines.py``'s OPUS-MT-layout ``MarianMTModel`` at the sizes of
``WORKDIR/job.json``: random weights as ``tests/nlp/pretrained/reference_marian.py`` makes them, the
filler ids (all but the first ``real`` after ``</s>`` and ``<unk>``) at ``final_logits_bias``
-30, the ``<pad>`` row zeros (OPUS-MT's), and the eos bias bisected so that greedy translations
of the first 32 sources are as long as those sources on average. Writes it with
``save_pretrained`` and the Hub's ``generation_config.json`` to ``WORKDIR/opus`` and decodes
with the model read back from there, float32 without TF32, on CUDA if there is one. Then
answers each ``generate`` command of the worker protocol (``benchmarks/workers.py``), with
``{"mode": "beam" | "greedy", "batch": B, "all": bool}``, by one timed pass
over the sources sorted by length in batches of B (``all`` false: the first and last batch
only, a warm-up): ``generate(num_beams=4 or 1, max_new_tokens=extra + the longest source)``;
until a line ``quit``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
from cases.engines_marian import FILLER_BIAS, reference  # noqa: E402
from workers import Worker, serve  # noqa: E402


def make_sources(size, seed=0) -> list:
    """Random ids over the real ids (Zipf-like), eos (0) last, lognormal lengths."""
    rng, weights = np.random.default_rng(seed), 1.0 / (np.arange(size["real"]) + 10.0)
    lengths = np.clip(rng.lognormal(np.log(size["median"]), 0.55, size["sentences"]).round(),
                      3, 5 * size["median"]).astype(int)
    return [[int(i) for i in 2 + rng.choice(size["real"], n - 1, p=weights / weights.sum())]
            + [0] for n in lengths]


def groups_of(sources, size: int) -> list:
    """The sources' indices sorted by length (then index), in batches of ``size``."""
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i]), i))
    return [order[k:k + size] for k in range(0, len(order), size)]


def cut(row, eos: int = 0) -> list:
    """Generated ids up to the first eos, included."""
    row = [int(t) for t in row]
    return row[:row.index(eos) + 1] if eos in row else row


def main(workdir: str) -> None:
    import torch
    import transformers

    started, (ref, _) = time.time(), reference()
    with open(os.path.join(workdir, "job.json")) as f:
        job = json.load(f)
    size, sources, pad = job["size"], job["sources"], job["size"]["vocab"] - 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    config = ref.marian_config("shared", size["vocab"], size["vocab"])
    config.d_model = size["d"]
    config.encoder_layers = config.decoder_layers = size["layers"]
    config.encoder_ffn_dim = config.decoder_ffn_dim = size["ffn"]
    config.encoder_attention_heads = config.decoder_attention_heads = size["heads"]
    model = transformers.MarianMTModel(config).eval()
    ref.randomize(model, ref.SCALES["shared"])
    with torch.no_grad():  # fillers computed but never chosen; OPUS-MT's zero pad row
        model.final_logits_bias[0, size["real"] + 2:pad] = FILLER_BIAS
        model.get_input_embeddings().weight[pad] = 0.0
    model.to(device)

    def generate(rows, beams, **kwargs):
        ids = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=(ids != pad).to(device),
                                 num_beams=beams, **kwargs)
        return [cut(row[1:]) for row in out.tolist()]  # without the decoder start

    # eos bias: bisection on the mean generated length (eos included) against the sources'.
    probe = sources[:32]
    target = float(np.mean([len(s) for s in probe]))
    base, low, high, steps = float(model.final_logits_bias[0, 0]), -20.0, 40.0, []
    for _ in range(size["calibration"]):
        mid = (low + high) / 2
        with torch.no_grad():
            model.final_logits_bias[0, 0] = base + mid
        out = generate(probe, 1, max_new_tokens=int(target * 3), bad_words_ids=[[pad]])
        steps.append((round(mid, 2), float(np.mean([len(row) for row in out]))))
        low, high = (mid, high) if steps[-1][1] > target else (low, mid)
    with torch.no_grad():
        model.final_logits_bias[0, 0] = base + (low + high) / 2
    folder = os.path.join(workdir, "opus")
    model.save_pretrained(folder)
    ref.write_json(os.path.join(folder, "generation_config.json"), ref.generation_config(pad))
    model = transformers.MarianMTModel.from_pretrained(folder).to(device).eval()
    ready = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
          "torch": torch.__version__, "transformers": transformers.__version__,
          "parameters": sum(p.numel() for p in model.parameters()),
          "eos_bias_added": round((low + high) / 2, 2), "probe_length": target,
          "bisection": steps, "seconds": round(time.time() - started, 1)}

    def generate_pass(ask: dict) -> dict:
        """One timed pass: ``{"mode": "beam" | "greedy", "batch": B, "all": bool}``."""
        outputs = [None] * len(sources)
        groups = groups_of(sources, ask["batch"])
        if device == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        for group in groups if ask["all"] else (groups[0], groups[-1]):
            rows = [sources[i] for i in group]
            out = generate(rows, 4 if ask["mode"] == "beam" else 1,
                           max_new_tokens=job["extra"] + max(map(len, rows)))
            for i, row in zip(group, out):
                outputs[i] = row
        return {"seconds": time.perf_counter() - begin, "outputs": outputs}

    serve({"generate": generate_pass}, ready)


class TorchWorker(Worker):
    """`gpu_torch.py` in its own process; its stderr goes to ``WORKDIR/torch_worker.log``."""

    def __init__(self, workdir):
        super().__init__([sys.executable, os.path.abspath(__file__), workdir],
                         log=os.path.join(workdir, "torch_worker.log"), wait=False)


if __name__ == "__main__":
    main(sys.argv[1])
