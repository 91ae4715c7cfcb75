"""Translation speed: our ``Seq2SeqTransformer`` against the same-size KerasHub model, cached
against uncached decoding, beam against greedy. Ratios are ``ours / peer`` (below 1, ours is
faster): medians of the per-round ratios of alternating runs.

- Train step (Adam, cross-entropy, no XLA: Keras's default on a CPU): ours with
  `GlobalClipAdam`, the optimizer class of ``train_nmt``, against the model built from
  ``keras_hub.layers.TokenAndPositionEmbedding``, ``TransformerEncoder`` and
  ``TransformerDecoder`` (untied output projection) with Keras's Adam; random ids, no padding.
  Standard: vocabulary 8000, length 40; the ``tiny`` preset (2+2 layers, d 128) at batch 64
  and the ``base`` preset (6+6 layers, d 512) at batch 16, each timing the mean of 3 steps;
  the tiny one (not the base one) also with both steps XLA-compiled.
- Decoding, the tiny preset at random weights (dropout 0), 32 sentences of 20 ids, 64 tokens
  each (the random model does not emit eos early), each search one compiled ``tf.function``
  loop: greedy with the KV cache against re-running the decoder over the whole prefix each step
  (uncached; its prefix grows, so XLA cannot compile it); the cached one also XLA-compiled, as
  the exported translator can run it; beam search (width 4) against greedy, both cached and
  XLA-compiled. The four searches run in the same rounds.
- Standard: 5 rounds after 1 warm-up. Tiny: vocabulary 200, 1+1 layers, d 32, length 8,
  batch 4, 4 sentences of 8 ids, 8 tokens, 1 round, every row.

Two child processes (``nmt_worker``; TensorFlow's oneDNN kernels on unless
``TF_ENABLE_ONEDNN_OPTS`` is set, as ``train_nmt.py`` runs) build and compile the jobs (each
train step, the decoding) two at a time, untimed; then each job's contenders run in turns,
one job at a time, the other child idle.
"""

from __future__ import annotations

import collections
import concurrent.futures
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


WORKERS = 2  # child processes: the jobs' builds and compilations run two at a time


def _jobs(size: dict) -> list[dict]:
    """The payloads of the jobs, in the rows' order."""
    jobs = [{"job": "train", **spec, "xla": xla, "vocab": size["vocab"],
             "length": size["length"], "iters": size["iters"]}
            for spec in size["train"] for xla in spec["xla"]]
    jobs.append({"job": "decode", **size["decode"], "vocab": size["vocab"]})
    return [{**job, "key": key} for key, job in enumerate(jobs)]


def _start(workdir: pathlib.Path) -> list[workers.Worker]:
    """``WORKERS`` children, started together (their imports overlap)."""
    argv = [workers.PY, "-m", "cases.nmt_worker"]
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(workers.Worker, argv, log=workdir / f"worker-{i}.log")
                   for i in range(WORKERS)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for worker in started:
            worker.close()
        raise failed[0]
    return started


def _prepare(children: list[workers.Worker], jobs: list[dict]) -> tuple[dict, dict]:
    """Each child takes the next job when it is free and builds it (untimed, two at a time):
    returns each job's child and its answer (parameters, model, oneDNN)."""
    queue, owner, meta = collections.deque(jobs), {}, {}

    def drain(child: workers.Worker) -> None:
        while True:
            try:
                job = queue.popleft()
            except IndexError:
                return
            try:
                meta[job["key"]] = child.ask("prepare", job)
            except BaseException:
                queue.clear()  # the other child stops too
                raise
            owner[job["key"]] = child

    with concurrent.futures.ThreadPoolExecutor(len(children)) as pool:
        futures = [pool.submit(drain, child) for child in children]
    for future in futures:
        future.result()
    return owner, meta


def _shape(model: dict, batch: int | None = None) -> str:
    text = f"{model['layers']}, d {model['d_model']}"
    return text + (f", batch {batch}" if batch is not None else "")


def _rows(job: dict, meta: dict, times: dict, rounds: dict) -> list[harness.Row]:
    settings = {key: value for key, value in job.items() if key not in ("job", "key", "name")}
    settings.update(rounds, onednn=meta["onednn"])
    extra = {key: value for key, value in meta.items() if key != "onednn"}
    if job["job"] == "train":
        what = f"{job['name']} ({_shape(meta['model'], job['batch'])})"
        measure = (f"train step, {what}, both XLA-compiled" if job["xla"]
                   else f"train step, {what} vs KerasHub")
        return [harness.compare(measure, times, ours="ours", peer="keras_hub", unit="ms",
                                settings=settings, extra=extra)]
    return [harness.compare(measure, times, ours=ours, peer=peer, unit="ms", settings=settings,
                            extra=extra)
            for measure, ours, peer in (
                ("greedy with KV cache vs re-running the whole prefix",
                 "greedy cached", "greedy uncached"),
                ("greedy with KV cache + XLA vs re-running the whole prefix",
                 "greedy cached + XLA", "greedy uncached"),
                (f"beam {job['beam']} vs greedy (both cached + XLA)",
                 "beam + XLA", "greedy cached + XLA"))]


def run(size: dict, workdir: pathlib.Path) -> list[harness.Row]:
    """Builds the jobs two at a time, then times them one after the other."""
    jobs, rounds = _jobs(size), {key: size[key] for key in ("repeats", "warmup")}
    children = _start(workdir)
    try:
        owner, meta = _prepare(children, jobs)
        rows = []
        for job in jobs:
            times = owner[job["key"]].ask("time", {"key": job["key"], **rounds})
            rows += _rows(job, meta[job["key"]], times, rounds)
    finally:
        for child in children:
            child.close()
    return rows
