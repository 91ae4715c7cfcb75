"""Mixed precision on this machine: one train step under ``mixed_bfloat16`` (and
``mixed_float16``) against the same model in float32. Prints ``ratio = mixed / float32``
(lower is faster), the median of alternating repeats, and the loss of both policies on the same
weights and batch (the mixed model gets the float32 model's weights).

    python experiments/precision.py [--cases nmt-tiny,nmt-base,detr-tiny,detr-r50] [--repeats 5]
                                   [--policies mixed_bfloat16,mixed_float16,xla]

``xla`` is no policy: the float32 model compiled with XLA (``jit_compile=True``; DETR then
matches with the ``keras.ops`` solver), against the same model without.

NMT: ``Seq2SeqTransformer`` with the label-smoothed loss and Adam, vocabulary 8000, length
40; tiny batch 64, base batch 16. DETR: the preset's model, set loss and AdamW, 4 objects per
image: ``tiny`` batch 16 of 128 px, ``r50`` (ResNet-50 backbone) batch 2 of 256 px. No XLA.
A bf16 matmul is fast only on CPUs with AMX / AVX512-BF16 (``lscpu`` flags ``amx_bf16``,
``avx512_bf16``) and on recent GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

VOCAB, LENGTH = 8000, 40


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    found = [name for name in ("amx_bf16", "avx512_bf16", "avx512f") if name in flags]
    return ",".join(found) or "none of amx_bf16/avx512_bf16"


def _nmt(preset_name: str, batch: int):
    from nlp.config import preset
    from nlp.modeling.model import build_model
    from nlp.training.train import compile_model

    config = preset(preset_name, vocab_size=VOCAB)
    rng = np.random.default_rng(0)
    x = {"source": rng.integers(4, VOCAB, (batch, LENGTH)).astype("int32"),
         "target_in": rng.integers(4, VOCAB, (batch, LENGTH)).astype("int32")}
    y = rng.integers(4, VOCAB, (batch, LENGTH)).astype("int32")

    def build(jit_compile=False):
        model = build_model(config)
        compile_model(model, config, jit_compile=jit_compile)
        return model

    return build, x, y


def _detr(preset_name: str = "tiny", batch: int = 16, side: int = 128, objects: int = 4):
    from vision.config import preset
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    config = preset(preset_name, batch_size=batch, image_size=side, max_image_size=side)
    rng = np.random.default_rng(0)
    q = config.num_queries
    boxes = np.zeros((batch, q, 4), "float32")
    boxes[:, :objects, :2] = rng.uniform(0.2, 0.8, (batch, objects, 2))
    boxes[:, :objects, 2:] = rng.uniform(0.05, 0.3, (batch, objects, 2))
    valid = np.zeros((batch, q), bool)
    valid[:, :objects] = True
    x = {"images": rng.normal(size=(batch, side, side, 3)).astype("float32"),
         "mask": np.ones((batch, side, side), bool)}
    y = {"labels": rng.integers(0, 3, (batch, q)).astype("int32"), "boxes": boxes,
         "valid": valid}

    def build(jit_compile=False):
        cfg = dataclasses.replace(config, matcher_solver="ops") if jit_compile else config
        model = build_model(cfg, 3)
        model.compile(optimizer=build_optimizer(cfg, model),
                      criterion=build_criterion(cfg, 3), jit_compile=jit_compile)
        return model

    return build, x, y


CASES = {
    "nmt-tiny": lambda: _nmt("tiny", 64),
    "nmt-base": lambda: _nmt("base", 16),
    "detr-tiny": _detr,
    "detr-r50": lambda: _detr("r50-detr", batch=2, side=256),
}


def _loss(model, x, y) -> float:
    value = model.test_on_batch(x, y)
    return float(value[0] if isinstance(value, (list, tuple)) else value)


def measure(case: str, policy: str, repeats: int, iters: int = 2):
    build, x, y = CASES[case]()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    full = build()
    # "xla": the float32 model compiled with XLA (DETR with the keras.ops matcher, which XLA
    # can compile; the scipy one is a host callback).
    keras.config.set_dtype_policy("float32" if policy == "xla" else policy)
    keras.utils.set_random_seed(0)
    mixed = build(jit_compile=True) if policy == "xla" else build()
    keras.config.set_dtype_policy("float32")
    mixed.set_weights(full.get_weights())
    losses = (_loss(full, x, y), _loss(mixed, x, y))
    steps = {"float32": lambda: full.train_on_batch(x, y),
             policy: lambda: mixed.train_on_batch(x, y)}
    for step in steps.values():
        step()  # trace and warm up
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(iters):
                step()
            times[name].append((time.perf_counter() - start) / iters)
    ratios = [m / f for m, f in zip(times[policy], times["float32"])]
    return (statistics.median(times["float32"]), statistics.median(times[policy]),
            statistics.median(ratios), losses)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="nmt-tiny,nmt-base,detr-tiny,detr-r50")
    parser.add_argument("--policies", default="mixed_bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, "
          f"{platform.machine()}, {os.cpu_count()} cores, CPU flags: {_cpu_flags()}")
    print(f"{'case':<12}{'policy':<16}{'f32 ms':>9}{'mixed ms':>10}{'ratio':>7}"
          f"{'loss f32':>10}{'loss mixed':>12}")
    for case in args.cases.split(","):
        for policy in args.policies.split(","):
            f32, mixed, ratio, (loss32, loss_mixed) = measure(case, policy, args.repeats)
            print(f"{case:<12}{policy:<16}{f32 * 1e3:>9.1f}{mixed * 1e3:>10.1f}{ratio:>7.2f}"
                  f"{loss32:>10.4f}{loss_mixed:>12.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
