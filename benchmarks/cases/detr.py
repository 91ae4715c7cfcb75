"""DETR train-step time and the share of it spent in Hungarian matching.

For each setting, builds the preset's model (random weights), times ``train_on_batch`` (one
optimizer step: forward, set loss with matching of every decoder layer, backward, AdamW) and,
on the same outputs, the matcher alone (scipy and ``keras.ops`` solvers, every decoder layer,
as the loss calls it), and the whole step XLA-compiled with the ``keras.ops`` solver, each the
median of several repetitions after a warm-up. Prints the
matcher's share of the step and, for the setting of the reference CPU run of
facebookresearch/detr (vanilla ``tiny-detr``, batch 16, 128 px), the ratio to its 0.34 s/step
(measured with PyTorch on 2 threads of a 2-core CPU, not timed here; the run is described in
benchmarks/README.md). ``tiny`` adds the two-stage
proposals (matched too) and box refinement.

    python benchmarks/detr.py [--repeats 5] [--only tiny,tiny16,tiny-detr16,r50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from vision.config import preset  # noqa: E402
from vision.matching.matcher import HungarianMatcher  # noqa: E402
from vision.modeling.detr import build_criterion, build_model  # noqa: E402
from vision.modeling.optimizer import build_optimizer  # noqa: E402

PEER_TINY_B16_S = 0.34  # facebookresearch/detr's reference CPU run (PyTorch, 2 threads)
SETTINGS = {  # name: (preset, batch, image side, objects per image)
    "tiny": ("tiny", 2, 128, 4),
    "tiny16": ("tiny", 16, 128, 4),
    "tiny-detr16": ("tiny-detr", 16, 128, 4),  # vanilla DETR: the reference's setting
    "r50": ("r50-detr", 2, 256, 4),
}


def _batch(batch: int, side: int, objects: int, num_queries: int, rng):
    boxes = np.zeros((batch, num_queries, 4), "float32")
    boxes[:, :objects, :2] = rng.uniform(0.2, 0.8, (batch, objects, 2))
    boxes[:, :objects, 2:] = rng.uniform(0.05, 0.3, (batch, objects, 2))
    valid = np.zeros((batch, num_queries), bool)
    valid[:, :objects] = True
    labels = rng.integers(0, 3, (batch, num_queries)).astype("int32")
    x = {"images": rng.normal(size=(batch, side, side, 3)).astype("float32"),
         "mask": np.ones((batch, side, side), bool)}
    return x, {"labels": labels, "boxes": boxes, "valid": valid}


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (tracing)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, repeats: int) -> dict:
    preset_name, batch, side, objects = SETTINGS[name]
    config = preset(preset_name, batch_size=batch, image_size=side, max_image_size=side)
    keras.utils.set_random_seed(0)
    model = build_model(config, 3)
    model.compile(optimizer=build_optimizer(config, model),
                  criterion=build_criterion(config, 3), jit_compile=False)
    x, y = _batch(batch, side, objects, config.num_queries, np.random.default_rng(0))
    step = _median_seconds(lambda: model.train_on_batch(x, y), repeats)
    # The whole step under XLA: only the keras.ops solver compiles (scipy is a host callback).
    xla_config = preset(preset_name, batch_size=batch, image_size=side, max_image_size=side,
                        matcher_solver="ops")
    keras.utils.set_random_seed(0)
    xla_model = build_model(xla_config, 3)
    xla_model.compile(optimizer=build_optimizer(xla_config, xla_model),
                      criterion=build_criterion(xla_config, 3), jit_compile=True)
    xla_step = _median_seconds(lambda: xla_model.train_on_batch(x, y), repeats)

    outputs = model(x, training=True)
    layers = [outputs] + list(outputs["aux_outputs"])
    if "enc_outputs" in outputs:  # two-stage proposals, matched as well
        layers.append(outputs["enc_outputs"])
    row = {"setting": f"{preset_name} B{batch} {side}px", "step_s": step, "xla_step_s": xla_step}
    for solver in ("scipy", "ops"):
        matcher = HungarianMatcher(config.cost_class, config.cost_bbox, config.cost_giou,
                                   solver=solver)

        @tf.function(jit_compile=False)
        def match_all(matcher=matcher):
            return [matcher(o["pred_logits"], o["pred_boxes"], y["labels"], y["boxes"],
                            y["valid"]) for o in layers]

        row[f"match_{solver}_s"] = _median_seconds(lambda: [t.numpy() for t in match_all()],
                                                   repeats)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=",".join(SETTINGS),
                        help=f"comma-separated settings of {sorted(SETTINGS)}")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown or args.repeats < 1:
        parser.error(f"unknown settings {unknown} or --repeats < 1")
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
          f"{os.cpu_count()} CPUs, GPUs: {len(tf.config.list_physical_devices('GPU'))}")
    print(f"{'setting':<18}{'step':>10}{'matcher (scipy)':>17}{'share':>8}"
          f"{'matcher (ops)':>15}{'ops / scipy':>13}{'XLA+ops step':>14}{'XLA / default':>15}")
    for name in names:
        r = measure(name, args.repeats)
        print(f"{r['setting']:<18}{r['step_s'] * 1e3:>8.0f}ms{r['match_scipy_s'] * 1e3:>15.1f}ms"
              f"{r['match_scipy_s'] / r['step_s']:>8.1%}{r['match_ops_s'] * 1e3:>13.1f}ms"
              f"{r['match_ops_s'] / r['match_scipy_s']:>13.2f}{r['xla_step_s'] * 1e3:>12.0f}ms"
              f"{r['xla_step_s'] / r['step_s']:>15.2f}", flush=True)
        if name == "tiny-detr16":
            print(f"{'':<18}ratio = ours / facebookresearch/detr reference "
                  f"({PEER_TINY_B16_S} s/step): {r['step_s'] / PEER_TINY_B16_S:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
