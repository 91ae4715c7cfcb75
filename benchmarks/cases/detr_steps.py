"""The ``detr`` case's own rows: our DETR train step, the share of it spent in Hungarian
matching, and the step XLA-compiled (runs in the case's child process, `cases.detr_child`).

For each setting (a preset, batch, image side, objects per image), builds the preset's model
(random weights) and times, in alternating rounds after a warm-up:

- the default step: ``train_on_batch`` compiled with ``jit_compile=False`` (forward, the set
  loss with matching of every decoder layer, backward, AdamW), the scipy matcher;
- the whole step XLA-compiled (``jit_compile=True``) with the ``keras.ops`` solver (scipy is a
  host callback, which XLA cannot compile);
- the matcher alone on the same outputs, scipy and ``keras.ops`` solvers, every decoder layer
  (and the two-stage proposals, where the preset has them) as the loss calls it, inside a
  ``tf.function`` without XLA.

The setting of the reference CPU run of facebookresearch/detr (vanilla ``tiny-detr``, batch
16, 128 px: 0.34 s/step, PyTorch on 2 threads of a 2-core CPU; not timed here, the run is
described in experiments/README.md) also gets the ratio of our default step to it.
"""

from __future__ import annotations

import harness
import numpy as np

PEER_TINY_B16_S = 0.34  # facebookresearch/detr's reference CPU run (PyTorch, 2 threads)
DEFAULT = "default step (no XLA, scipy solver)"
XLA = "XLA step (keras.ops solver)"
SCIPY, OPS = "scipy solver", "keras.ops solver"


def synthetic_batch(batch: int, side: int, objects: int, num_queries: int, rng):
    """Random images (all valid) and ``objects`` boxes per image, padded to the queries."""
    boxes = np.zeros((batch, num_queries, 4), "float32")
    boxes[:, :objects, :2] = rng.uniform(0.2, 0.8, (batch, objects, 2))
    boxes[:, :objects, 2:] = rng.uniform(0.05, 0.3, (batch, objects, 2))
    valid = np.zeros((batch, num_queries), bool)
    valid[:, :objects] = True
    labels = rng.integers(0, 3, (batch, num_queries)).astype("int32")
    x = {"images": rng.normal(size=(batch, side, side, 3)).astype("float32"),
         "mask": np.ones((batch, side, side), bool)}
    return x, {"labels": labels, "boxes": boxes, "valid": valid}


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` as a contender: its result dropped (a number returned would be
    taken for the call's seconds by `harness.alternate`)."""
    def run():
        fn(*args, **kwargs)

    return run


def _compiled(config, jit: bool):
    import keras

    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    keras.utils.set_random_seed(0)
    model = build_model(config, 3)
    model.compile(optimizer=build_optimizer(config, model),
                  criterion=build_criterion(config, 3), jit_compile=jit)
    return model


def steps(payload: dict) -> dict:
    """The rows of one setting: ``preset``, ``batch``, ``side``, ``objects``, ``overrides``
    (DetrConfig fields), ``reference`` (add the row against facebookresearch/detr's run),
    ``repeats``, ``warmup``."""
    import tensorflow as tf

    from vision.config import preset
    from vision.matching.matcher import HungarianMatcher

    name, batch, side = payload["preset"], payload["batch"], payload["side"]
    fields = dict(batch_size=batch, image_size=side, max_image_size=side,
                  **payload.get("overrides", {}))
    config = preset(name, **fields)
    model = _compiled(config, jit=False)
    xla_model = _compiled(preset(name, matcher_solver="ops", **fields), jit=True)
    x, y = synthetic_batch(batch, side, payload["objects"], config.num_queries,
                           np.random.default_rng(0))

    outputs = model(x, training=True)
    layers = [outputs] + list(outputs["aux_outputs"])
    if "enc_outputs" in outputs:  # two-stage proposals, matched as well
        layers.append(outputs["enc_outputs"])

    def matching(solver: str):
        matcher = HungarianMatcher(config.cost_class, config.cost_bbox, config.cost_giou,
                                   solver=solver)

        @tf.function(jit_compile=False)
        def match_all():
            return [matcher(o["pred_logits"], o["pred_boxes"], y["labels"], y["boxes"],
                            y["valid"]) for o in layers]

        def run():  # returns None: the harness times the call
            [t.numpy() for t in match_all()]

        return run

    contenders = {DEFAULT: call(model.train_on_batch, x, y),
                  XLA: call(xla_model.train_on_batch, x, y),
                  SCIPY: matching("scipy"), OPS: matching("ops")}
    times = harness.alternate(contenders, payload["repeats"], payload["warmup"])
    setting = f"{name} B{batch} {side} px"
    settings = {key: payload[key] for key in ("preset", "batch", "side", "objects")}
    settings["overrides"] = payload.get("overrides", {})
    step = float(np.median(times[DEFAULT]))
    share = {"matcher_share_of_default_step": float(np.median(times[SCIPY])) / step}
    rows = [harness.compare(f"DETR {setting} train step: XLA + keras.ops / default", times,
                            ours=XLA, peer=DEFAULT, settings=settings, extra=share),
            harness.compare(f"DETR {setting} matcher: keras.ops / scipy", times, ours=OPS,
                            peer=SCIPY, settings=settings, extra=share)]
    if payload.get("reference"):
        rows.append(harness.Row(
            f"DETR {setting} default step / facebookresearch/detr's tiny-detr B16 128 px run",
            ours=step / PEER_TINY_B16_S, unit="x", repeats=payload["repeats"],
            settings=settings, extra={"default_step_s": step, "reference_s": PEER_TINY_B16_S,
                                      "reference": "PyTorch, 2 threads, 2-core CPU; not "
                                      "timed here (experiments/README.md)"}))
    return {"rows": [row.to_json() for row in rows]}
