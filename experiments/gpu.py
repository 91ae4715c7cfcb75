"""GPU figures under ``KERAS_BACKEND=jax`` on a machine without TensorFlow: the decoding engine
table of ``nmt_engines.py`` and the NMT base and DETR r50 train steps.

* Engines: ``gpu_torch.py`` (a torch process) builds ``nmt_engines.py``'s base OPUS-MT-layout
  ``MarianMTModel`` (random weights, 58,101 ids, eos bias set so that translations are as long
  as their sources); ``nlp.pretrained.hf_config.read_weights`` and ``nlp.pretrained.marian``'s
  ``marian_settings``/``set_weights`` read it into our ``Seq2SeqTransformer``. 512 sources of
  random ids (Zipf, lognormal lengths of median 20) sorted by length, batches of 32, then
  128: our ``beam_search`` (beam 4, transformers' convention) and ``greedy_search`` by
  ``compile_search`` (``jax.jit``; sources padded to a multiple of 16, an executable per width,
  compiled in parallel and timed apart)
  against transformers' ``generate`` (num_beams 4 / 1, ``max_new_tokens`` 50 + the longest
  source) on torch CUDA; float32 both (JAX's matmuls at ``--precision``, torch without TF32).
  Warm-up, 3 passes alternating the engines, medians; agreement: translations whose ids equal
  transformers'. CTranslate2 is not on the machine: skipped.
* Train steps: ``train_on_batch`` on device arrays, median of 10 steps after 2 (the first
  compiles), float32 then ``mixed_bfloat16``: NMT ``base`` (vocabulary 8,000, 128 x 32 source
  and target tokens, compiled as ``nlp.training.train`` does) and DETR ``r50``
  (``matcher_solver="ops"``, 4 images of 800 x 1066 px, 7 objects each, 80 classes, as its
  trainer). MFU: the step's FLOPs (XLA's cost analysis) / step time / the ``jnp.dot`` peak
  (8192^2) of its dtype, measured first.
  On the H200 that analysis leaves out the products XLA hands to cuBLAS (23.8 GFLOP counted
  for an NMT base step of 1,197 GFLOP by ``peak.py``'s ``nmt_flops``), so read its ``mfu`` as a
  lower bound and divide the analytic count by the step time instead (experiments/README.md).
  ``--only NAME,NAME`` runs those stages alone (after the peak).

Each stage rewrites ``$OUT/gpu.json`` (default ``runs/gpu``); one that would end past
``--budget`` s (estimated by the stage it repeats) is skipped; ``--quick``: tiny sizes, for a
CPU. The train steps are in ``gpu_train.py``. On the GPU machine (no TensorFlow: what this
imports of ``nlp`` and ``vision`` needs none), with the wheels of keras 3.15.1, namex, optree
and absl-py in ``.whl/``:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=jax \\
        || exit; python3 experiments/gpu.py [--quick] [--budget 360] [--precision highest]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
from gpu_torch import TorchWorker, cut, groups_of, make_sources  # this folder is on the path
from gpu_train import matmul_peaks, train_stage

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
from harness import machine  # noqa: E402
from workers import ROOT, WorkerError  # noqa: E402

EXTRA = 50  # tokens past the source (ours: each sentence's; transformers: the batch's longest)
FULL = dict(vocab=58101, real=8000, layers=6, d=512, heads=8, ffn=2048, calibration=8,
            sentences=512, median=20, batches=(32, 128), bucket=16, repeats=3,
            nmt=("base", 8000, 128, 32),  # preset, vocabulary, batch, length
            detr=("r50", 4, 800, 1066, 7),  # preset, batch, height, width, objects
            steps=10, warmup=2, peak_n=8192)
QUICK = dict(vocab=1000, real=300, layers=2, d=64, heads=4, ffn=128, calibration=5,
             sentences=24, median=8, batches=(8, 12), bucket=8, repeats=1,
             nmt=("tiny", 1000, 8, 12), detr=("tiny", 2, 64, 64, 3), steps=2, warmup=1,
             peak_n=256)


def marian_model(folder: str):
    """`nlp.pretrained.marian.read_marian` less the tokenizer, and the beam-search arguments."""
    from nlp.modeling.model import Seq2SeqTransformer

    def read(name):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return {k: v for k, v in json.load(f).items() if k != "transformers_version"}

    import nlp.pretrained.hf_config as hf_config
    import nlp.pretrained.marian as marian

    kwargs, decoding = marian.marian_settings(read("config.json"), read("generation_config.json"))
    model = Seq2SeqTransformer(**kwargs, source_pad_id=kwargs["pad_id"])  # one vocabulary
    marian.set_weights(model, hf_config.read_weights(folder))
    return model, dict(beam_size=4, length_penalty=decoding.length_penalty,
                       convention=decoding.convention, renormalize=decoding.renormalize)


def decode_stage(args, size, worker, batch: int, cache: dict) -> dict:
    import jax

    from nlp.search.decoding import compile_search

    if "model" not in cache:
        cache["model"] = marian_model(os.path.join(cache["workdir"], "opus"))
    (model, beam), sources, bucket = cache["model"], cache["sources"], size["bucket"]
    groups, arrays = groups_of(sources, batch), []
    for group in groups:  # (B, S) ids, S the longest source rounded up to the bucket
        width = -(-len(sources[group[-1]]) // bucket) * bucket
        arrays.append(np.full((len(group), width), model.pad_id, "int32"))
        for row, i in enumerate(group):
            arrays[-1][row, :len(sources[i])] = sources[i]
    searches = {"beam": compile_search(model, "beam", extra_length=EXTRA, **beam),
                "greedy": compile_search(model, "greedy", extra_length=EXTRA)}
    begin = time.perf_counter()
    with jax.default_matmul_precision(args.precision):
        lowered = {(mode, shape): search.lower(jax.ShapeDtypeStruct(shape, "int32"))
                   for mode, search in searches.items() for shape in {a.shape for a in arrays}}
    lower_s, begin = time.perf_counter() - begin, time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        compiled = dict(zip(lowered, pool.map(lambda low: low.compile(), lowered.values())))
    compile_s = time.perf_counter() - begin

    def ours(mode, subset=None):
        outputs, begin = [None] * len(sources), time.perf_counter()
        for k in range(len(groups)) if subset is None else subset:
            ids = np.asarray(compiled[mode, arrays[k].shape](arrays[k]))
            for i, row in zip(groups[k], ids):
                outputs[i] = cut(row)
        return {"seconds": time.perf_counter() - begin, "outputs": outputs}

    def theirs(mode, everything=True):
        return worker.ask("generate", {"mode": mode, "batch": batch, "all": everything})

    for mode in searches:  # warm-up: each executable once; transformers first and last batch
        ours(mode, {a.shape: k for k, a in enumerate(arrays)}.values())
        theirs(mode, everything=False)
    times, results = {}, {}
    for _ in range(size["repeats"]):
        for mode in searches:
            for engine, run in (("ours", ours), ("transformers", theirs)):
                out = run(mode)
                times.setdefault((engine, mode), []).append(out["seconds"])
                results[engine, mode] = out["outputs"]
    rows = []
    for (engine, mode), seconds in times.items():
        out, median = results[engine, mode], statistics.median(seconds)
        same = sum(a == b for a, b in zip(out, results["transformers", mode]))
        rows.append({"mode": mode, "engine": engine, "seconds": median, "passes": seconds,
                     "sentences_per_s": len(out) / median, "tokens": sum(map(len, out)),
                     "tokens_per_s": sum(map(len, out)) / median, "same_as_transformers": same,
                     "at_limit": sum(len(o) >= len(s) + EXTRA for o, s in zip(out, sources))})
    return {"batch": batch, "sentences": len(sources), "executables": len(compiled),
            "widths": sorted({a.shape[1] for a in arrays}), "lower_s": lower_s,
            "compile_s_parallel": compile_s, "rows": rows,
            "ctranslate2": "skipped: not installed on this machine"}


def main(args) -> None:
    import jax
    import keras

    assert keras.backend.backend() == "jax", "run with KERAS_BACKEND=jax"
    started, size = time.time(), QUICK if args.quick else FULL
    out_dir = os.environ.get("OUT") or os.path.join(ROOT, "runs", "gpu")
    os.makedirs(out_dir, exist_ok=True)
    report = {"machine": machine(), "jax_device": jax.devices()[0].device_kind,
              "jax": jax.__version__, "keras": keras.__version__, "quick": args.quick,
              "sizes": size, "budget_s": args.budget, "float32_precision": args.precision,
              "stages": {}}
    stages, peaks, worker = report["stages"], {}, None
    cache = {"sources": make_sources(size), "workdir": tempfile.mkdtemp(prefix="gpu_")}
    with open(os.path.join(cache["workdir"], "job.json"), "w") as f:
        json.dump({"size": size, "sources": cache["sources"], "extra": EXTRA}, f)

    def wait():  # for the torch worker's model, once (None)
        if "torch_worker" not in report:
            try:
                report["torch_worker"] = worker.wait_ready()
            except WorkerError as error:  # it died: see torch_worker.log
                report["torch_worker"] = {"error": str(error)}

    def train(which, policy):
        return lambda: train_stage(args, size, which, policy, peaks, wait)

    def decode(batch):
        return lambda: wait() or decode_stage(args, size, worker, batch, cache)

    small, large = size["batches"]
    plan = [  # name, stage, the stage whose time estimates its time
        ("matmul peak", lambda: matmul_peaks(size["peak_n"]), None),  # the GPU to itself
        ("train nmt float32", train("nmt", "float32"), None),
        (f"decode batch {small}", decode(small), None),
        ("train detr float32", train("detr", "float32"), None),
        ("train nmt mixed_bfloat16", train("nmt", "mixed_bfloat16"), "train nmt float32"),
        ("train detr mixed_bfloat16", train("detr", "mixed_bfloat16"), "train detr float32"),
        (f"decode batch {large}", decode(large), f"decode batch {small}")]
    for name, stage, like in plan:
        begin = time.time()
        estimate = stages.get(like, {}).get("stage_s", 0.0)
        if args.only and name != "matmul peak" and name not in args.only.split(","):
            stages[name] = {"skipped": "not in --only"}
        elif args.budget and begin - started + estimate > args.budget:
            stages[name] = {"skipped": f"it would end past --budget {args.budget} s"}
        else:
            try:
                stages[name] = stage()
            except Exception as error:
                stages[name] = {"error": f"{type(error).__name__}: {error}",
                                "traceback": traceback.format_exc()[-4000:]}
            stages[name]["stage_s"] = round(time.time() - begin, 1)
        if worker is None:  # after the peak: the torch worker builds its model
            peaks.update(stages[name].get("flops_per_s", {}))
            worker = TorchWorker(cache["workdir"])
        report.update(seconds=round(time.time() - started, 1),
                      tensorflow_imported=sys.modules.get("tensorflow") is not None,
                      torch_imported=sys.modules.get("torch") is not None)
        with open(os.path.join(out_dir, "gpu.json"), "w") as f:
            json.dump(report, f, indent=1, default=float)
        print(f"[{time.time() - started:.0f} s] {name}: {json.dumps(stages[name])[:800]}",
              flush=True)
    wait()
    try:
        worker.close()
    except OSError:  # it ended already (its log says why)
        pass
    with open(worker.log, errors="replace") as log, \
            open(os.path.join(out_dir, "torch_worker.log"), "w") as f:
        f.write(log.read()[-20000:])
    shutil.rmtree(cache["workdir"], ignore_errors=True)
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a CPU check")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds; a stage that would end later is skipped (0: none is)")
    parser.add_argument("--only", default="",
                        help="comma-separated stage names to run (the matmul peak always runs)")
    parser.add_argument("--precision", default="highest",
                        help="JAX matmul precision of the float32 runs (highest: no TF32)")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.7")  # the torch worker's share
    main(parser.parse_args())
