"""Decoding engines on the same weights: our SavedModel against transformers' ``generate``
(PyTorch CPU) and CTranslate2 (float32 and int8), beam 4 and greedy, for an OPUS-MT-layout
Marian model; and its fine-tuning step against transformers'.

Nothing is downloaded. Three worker processes (`engines_stages`; transformers' modeling code
never shares a process with TensorFlow), started at once:

1. build (`engines_marian.build`, in transformers' worker): a ``MarianMTModel`` of random
   weights written with ``save_pretrained`` as ``tests/nlp/pretrained/reference_marian.py``
   does, two SentencePiece models trained on the embedded corpus's training pairs, a shared
   tied vocabulary padded with unused pieces to OPUS-MT en-de's 58,101 entries (so that the
   output projection, softmax and top-k cost what they cost in a real model; the padding
   pieces are never chosen; the ``<pad>`` row zeros, as OPUS-MT's), the eos bias bisected so
   that translations are about as long as their sources. CTranslate2's own converter
   (``ct2-transformers-converter``'s) converts it, float32 (int8: ``compute_type="int8"``
   on load); our worker converts it with ``scripts/convert_nmt.py``'s command;
2. translation: the engines, on ``threads`` threads each, translate the first ``sentences``
   held-out sources of the embedded corpus sorted by length, in batches of ``batch_size``,
   beam 4 and greedy, as users run each engine: ours the export's ``serving_default`` /
   ``greedy`` (at most source length + 50 tokens); transformers ``generate(num_beams=4 or 1,
   max_new_tokens=50 + the longest source of the batch)``; CTranslate2 a plain
   ``Translator.translate_batch`` on token lists (MarianTokenizer's pieces), the same beam,
   ``max_decoding_length`` 49 + the longest source, ``min_decoding_length=0``. Each engine
   warms up on the shortest and longest batch; the engines alternate (`harness.alternate`)
   over ``repeats`` passes. A row: seconds per pass, ours against one peer; ``extra`` has
   sentences/s, generated tokens (every engine's translations encoded with the target
   SentencePiece model, + 1 each; the peer's own count), tokens/s (the like-for-like figure
   in beam mode, where CTranslate2 stops a sentence once its best hypothesis ends) and the
   translations identical to transformers';
3. fine-tuning: the same ``train_batch`` x ``train_length`` batches (source, target_in,
   target_out, no padding) on the converted Keras model (``model.train_on_batch``, compiled
   by ``nlp.training.train.compile_model`` without XLA: Adam, global clip norm,
   label-smoothed loss) and on transformers' model (forward with ``labels``, backward, clip
   to 1, ``torch.optim.Adam``), alternating step by step after ``warmup_steps``.

Sizes: ``standard``: the base layout (6+6 layers, d_model 512, 8 heads, ffn 2048, swish;
74.4 M parameters), 2 threads, 128 sentences, 3 passes, 10 steps of 16 x 32 tokens (500
sentences, as in experiments/README.md's record, take about 36 minutes on 2 cores; that
record's fine-tuning figures had the corpus's 818 pieces, not the padded vocabulary).
``tiny``: 2+2 layers, d_model 128, 16 sentences, one pass, one step, one thread per engine
(beside other jobs, the 2-thread pools of torch and CTranslate2 thrash, 10-50x slower). The
built model is kept in ``WORKDIR/model-KEY`` (KEY: the build's settings) and reused.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import pathlib
import shutil
import statistics
import time

import harness
import workers

DESCRIPTION = ("decoding engines on one OPUS-MT-layout model (ours vs transformers' generate "
               "and CTranslate2 float32 / int8, beam 4 and greedy) and its fine-tuning step")

SIZES = {
    "tiny": {"layers": 2, "d_model": 128, "heads": 4, "ffn": 512, "pieces": 256,
             "vocab_size": 768, "train_pairs": 1000, "sentences": 16, "threads": 1,
             "batch_size": 8, "repeats": 1, "calibration_steps": 6, "train_batch": 4,
             "train_length": 16, "train_steps": 1, "warmup_steps": 1},
    "standard": {"layers": 6, "d_model": 512, "heads": 8, "ffn": 2048, "pieces": 8000,
                 "vocab_size": 58101, "train_pairs": None, "sentences": 128, "threads": 2,
                 "batch_size": 32, "repeats": 3, "calibration_steps": 6, "train_batch": 16,
                 "train_length": 32, "train_steps": 10, "warmup_steps": 2},
}
# What the built folder depends on (its cache key); None train_pairs: the corpus's 20,000.
BUILD = ("layers", "d_model", "heads", "ffn", "pieces", "vocab_size", "train_pairs",
         "sentences", "calibration_steps", "train_batch", "train_length", "train_steps",
         "warmup_steps")
# engine -> (worker, the payload of its beam / greedy asks)
ENGINES = {"ours": ("ours", None), "transformers": ("theirs", None),
           "ctranslate2 float32": ("ct2", "float32"), "ctranslate2 int8": ("ct2", "int8")}
WORKERS = ("ours", "theirs", "ct2")
MODES = {"beam": "beam 4", "greedy": "greedy"}


def _start(name: str, job: dict) -> workers.Worker:
    return workers.Worker([workers.PY, "-m", "cases.engines_stages", name, json.dumps(job)],
                          log=pathlib.Path(job["home"]) / f"{name}.log")


def _together(*calls) -> list:
    """The calls' results, the calls run at once (the children's imports and loads overlap)."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def _theirs(pool: dict, job: dict) -> dict:
    """Starts transformers' worker; it builds the job's folder unless that is done."""
    pool["theirs"] = _start("theirs", job)
    done = pathlib.Path(job["home"]) / "build.json"
    if not done.exists():
        done.write_text(json.dumps(pool["theirs"].ask("build")))
    return json.loads(done.read_text())


def _load(pool: dict, name: str, job: dict) -> dict:
    if name not in pool:
        pool[name] = _start(name, job)
    return pool[name].ask("load")


def _translation_rows(pool: dict, repeats: int, settings: dict) -> list:
    rows, last = [], {}

    def contender(engine, mode):
        def call():
            worker, variant = ENGINES[engine]
            last[engine, mode] = pool[worker].ask(mode, variant)
            return last[engine, mode]["seconds"]
        return call

    for mode, label in MODES.items():
        times = harness.alternate({e: contender(e, mode) for e in ENGINES}, repeats, warmup=0)
        texts = {e: last[e, mode]["translations"] for e in ENGINES}
        tokens = {e: pool["theirs"].ask("count", texts[e])["tokens"] for e in ENGINES}
        n = len(texts["ours"])
        for peer in list(ENGINES)[1:]:
            pair = ("ours", peer)
            seconds = {e: statistics.median(times[e]) for e in pair}
            rows.append(harness.compare(
                f"{label}, {n} sentences, vs {peer}", times, peer=peer, unit="s",
                settings=settings,
                extra={"sentences": n,
                       "sentences_per_s": {e: round(n / seconds[e], 3) for e in pair},
                       "tokens": {e: tokens[e] for e in pair},
                       "tokens_per_s": {e: round(tokens[e] / seconds[e], 1) for e in pair},
                       "peer_own_token_count": last[peer, mode]["tokens"],
                       "same_as_transformers": {e: sum(a == b for a, b in zip(
                           texts[e], texts["transformers"])) for e in pair}}))
    return rows


def _fine_tuning_row(pool: dict, size: dict, settings: dict) -> harness.Row:
    _together(lambda: pool["ours"].ask("train"), lambda: pool["theirs"].ask("train"))
    last = {}

    def contender(engine):
        def call():
            last[engine] = pool[ENGINES[engine][0]].ask("step")
            return last[engine]["seconds"]
        return call

    times = harness.alternate({e: contender(e) for e in ("ours", "transformers")},
                              size["train_steps"], warmup=size["warmup_steps"])
    tokens = size["train_batch"] * size["train_length"]
    return harness.compare(
        f"fine-tuning step, {size['train_batch']} x {size['train_length']} target tokens",
        times, peer="transformers", unit="ms", settings=settings,
        extra={"target_tokens_per_s": {e: round(tokens / statistics.median(t), 1)
                                       for e, t in times.items()},
               "last_loss": {e: answer["loss"] for e, answer in last.items()},
               "process_cpu_seconds": {e: answer["process_cpu_seconds"]
                                       for e, answer in last.items()}})


def run(size: dict, workdir: pathlib.Path) -> list:
    job = {key: size[key] for key in BUILD}
    home = workdir / f"model-{hashlib.sha1(json.dumps(job).encode()).hexdigest()[:10]}"
    if not (home / "build.json").exists():
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    job.update(home=str(home), batch_size=size["batch_size"], threads=size["threads"])
    pool, ok, started = {}, False, time.perf_counter()
    try:  # the build beside our worker's imports, then the loads (ours converts) and ct2's start
        built = _together(lambda: _theirs(pool, job),
                          lambda: pool.update(ours=_start("ours", job)))[0]
        loads = dict(zip(WORKERS, _together(*(lambda name=name: _load(pool, name, job)
                                               for name in WORKERS))))
        settings = {"model": {k: built[k] for k in ("parameters", "vocab_size", "real_vocab")},
                    "load": loads, "ready_seconds": round(time.perf_counter() - started, 1)}
        rows = _translation_rows(pool, size["repeats"], settings)
        rows.append(_fine_tuning_row(pool, size, settings))
        ok = True
    finally:
        for worker in pool.values():
            worker.close() if ok else worker.kill()
    return rows
