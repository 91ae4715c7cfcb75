"""Translation speed: our ``Seq2SeqTransformer`` against the same-size KerasHub model, cached
against uncached decoding, beam against greedy. Ratios are ``ours / peer`` (below 1, ours is
faster): medians of the per-round ratios of alternating runs.

- Train step (Adam, cross-entropy, no XLA: Keras's default on a CPU): ours with
  `GlobalClipAdam`, the optimizer class of ``train_nmt``, against the model built from
  ``keras_hub.layers.TokenAndPositionEmbedding``, ``TransformerEncoder`` and
  ``TransformerDecoder`` (untied output projection) with Keras's Adam; random ids, no padding.
  Standard: vocabulary 8000, length 40; the ``tiny`` preset (2+2 layers, d 128) at batch 64
  and the ``base`` preset (6+6 layers, d 512) at batch 16, each timing the mean of 3 steps;
  the tiny one also with both steps XLA-compiled.
- Decoding, the tiny preset at random weights (dropout 0), 32 sentences of 20 ids, 64 tokens
  each (the random model does not emit eos early), each search one compiled ``tf.function``
  loop: greedy with the KV cache against re-running the decoder over the whole prefix each step
  (uncached; its prefix grows, so XLA cannot compile it); the cached one also XLA-compiled, as
  the exported translator can run it; beam search (width 4) against greedy, both cached and
  XLA-compiled. The four searches run in the same rounds.
- Standard: 5 rounds after 1 warm-up. Tiny: vocabulary 200, 1+1 layers, d 32, length 8,
  batch 4, 4 sentences of 8 ids, 8 tokens, 1 round, every row.

Everything runs in one child process (``nmt_worker``) with TensorFlow's oneDNN kernels on
unless ``TF_ENABLE_ONEDNN_OPTS`` is set, as ``train_nmt.py`` runs.
"""

from __future__ import annotations

import pathlib

import harness
import workers

DESCRIPTION = ("Seq2SeqTransformer train step against the same-size KerasHub model (also both "
               "XLA), greedy decoding with the KV cache against re-running the prefix, beam "
               "against greedy")

_MINI = {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "num_heads": 2,
         "ffn_dim": 64}

SIZES = {
    "standard": {
        "vocab": 8000, "length": 40, "iters": 3, "repeats": 5, "warmup": 1,
        "train": [{"name": "tiny", "preset": "tiny", "batch": 64, "xla": [False, True]},
                  {"name": "base", "preset": "base", "batch": 16, "xla": [False]}],
        "decode": {"preset": "tiny", "sentences": 32, "source_length": 20, "max_length": 64,
                   "beam": 4},
    },
    "tiny": {
        "vocab": 200, "length": 8, "iters": 1, "repeats": 1, "warmup": 1,
        "train": [{"name": "mini", "preset": "tiny", "overrides": _MINI, "batch": 4,
                   "xla": [False, True]}],
        "decode": {"preset": "tiny", "overrides": _MINI, "sentences": 4, "source_length": 8,
                   "max_length": 8, "beam": 4},
    },
}


def _shape(model: dict, batch: int | None = None) -> str:
    text = f"{model['layers']}, d {model['d_model']}"
    return text + (f", batch {batch}" if batch is not None else "")


def run(size: dict, workdir: pathlib.Path) -> list[harness.Row]:
    rounds = {key: size[key] for key in ("repeats", "warmup")}
    rows = []
    worker = workers.Worker([workers.PY, "-m", "cases.nmt_worker"], log=workdir / "worker.log")
    try:
        for spec in size["train"]:
            for xla in spec["xla"]:
                payload = {**spec, "xla": xla, "vocab": size["vocab"], "length": size["length"],
                           "iters": size["iters"], **rounds}
                answer = worker.ask("train", payload)
                what = f"{spec['name']} ({_shape(answer['model'], spec['batch'])})"
                measure = (f"train step, {what}, both XLA-compiled" if xla
                           else f"train step, {what} vs KerasHub")
                settings = {**payload, "onednn": answer["onednn"]}
                settings.pop("name")
                rows.append(harness.compare(
                    measure, answer["times"], ours="ours", peer="keras_hub",
                    unit="ms", settings=settings,
                    extra={"params": answer["params"], "model": answer["model"]}))
        spec = size["decode"]
        payload = {**spec, "vocab": size["vocab"], **rounds}
        answer = worker.ask("decode", payload)
    finally:
        worker.close()
    settings = {**payload, "onednn": answer["onednn"]}
    extra = {"mean_generated_length": answer["mean_length"], "model": answer["model"]}
    times = answer["times"]
    for measure, ours, peer in (
            ("greedy with KV cache vs re-running the whole prefix",
             "greedy cached", "greedy uncached"),
            ("greedy with KV cache + XLA vs re-running the whole prefix",
             "greedy cached + XLA", "greedy uncached"),
            (f"beam {spec['beam']} vs greedy (both cached + XLA)",
             "beam + XLA", "greedy cached + XLA")):
        rows.append(harness.compare(measure, times, ours=ours, peer=peer, unit="ms",
                                    settings=settings, extra=extra))
    return rows
