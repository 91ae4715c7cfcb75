"""The training half of ``gpu.py``: the ``jnp.dot`` peaks and a train step's time and MFU
under ``KERAS_BACKEND=jax`` (NMT as `nlp.training.train.compile_model` compiles it, DETR as
`vision.training.train`; those modules need TensorFlow, so the compile is written here)."""

from __future__ import annotations

import statistics
import time

import numpy as np

# Matmul peaks: label -> (dtype, matmul precision); "default" float32 is TF32 on such GPUs.
PEAKS = {"float32": ("float32", "highest"), "bfloat16": ("bfloat16", "default"),
         "float32_default": ("float32", "default")}

def matmul_peaks(n: int, repeats: int = 5, iters: int = 10) -> dict:
    """FLOP/s of an n x n ``jnp.dot`` (``2 n^3``) per `PEAKS` entry, the median of repeats."""
    import jax
    import jax.numpy as jnp

    pair, peaks = jax.random.normal(jax.random.PRNGKey(0), (2, n, n)), {}
    for label, (dtype, precision) in PEAKS.items():
        x, times = pair.astype(dtype), []
        product = jax.jit(lambda x, p=precision: jnp.dot(x[0], x[1], precision=p))
        product(x).block_until_ready()
        for _ in range(repeats):
            begin = time.perf_counter()
            for _ in range(iters):
                out = product(x)
            out.block_until_ready()
            times.append((time.perf_counter() - begin) / iters)
        peaks[label] = 2.0 * n ** 3 / statistics.median(times)
    return {"n": n, "flops_per_s": peaks}


def train_setup(size, which: str):
    """The compiled model, one batch and the items it holds (target tokens, images). NMT as
    `nlp.training.train.compile_model`, DETR as `vision.training.train`, both of which need
    TensorFlow."""
    rng = np.random.default_rng(0)
    if which == "nmt":
        from nlp.config import preset
        from nlp.modeling.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
        from nlp.modeling.model import build_model
        from tfx_transformer import NoamSchedule
        from tfx_transformer.replicas import GlobalClipAdam

        name, vocab, batch, length = size["nmt"]
        config = preset(name, vocab_size=vocab)
        model = build_model(config)
        schedule = NoamSchedule(config.d_model, config.warmup_steps, config.lr_scale)
        model.compile(
            optimizer=GlobalClipAdam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
                                     global_clipnorm=config.clip_norm),
            loss=MaskedLabelSmoothedCrossEntropy(config.label_smoothing, pad_id=model.pad_id),
            metrics=[MaskedAccuracy(pad_id=model.pad_id)], jit_compile=True)
        source, target_in, target_out = rng.integers(4, vocab, (3, batch, length), "int32")
        return model, {"source": source, "target_in": target_in}, target_out, batch * length

    from vision.config import preset
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    name, batch, height, width, objects = size["detr"]
    config = preset(name, matcher_solver="ops")
    model, slots = build_model(config, 80), config.num_queries  # targets padded as its batches
    model.compile(optimizer=build_optimizer(config, model),
                  criterion=build_criterion(config, 80), jit_compile=True)
    boxes = np.zeros((batch, slots, 4), "float32")  # (cx, cy, w, h)
    boxes[:, :objects] = rng.uniform([0.2, 0.2, 0.05, 0.05], [0.8, 0.8, 0.4, 0.4],
                                     (batch, objects, 4))
    x = {"images": rng.normal(size=(batch, height, width, 3)).astype("float32"),
         "mask": np.ones((batch, height, width), bool)}
    y = {"labels": rng.integers(0, 80, (batch, slots)).astype("int32"), "boxes": boxes,
         "valid": np.arange(slots)[None].repeat(batch, 0) < objects}
    return model, x, y, batch


def train_stage(args, size, which: str, policy: str, peaks: dict, wait) -> dict:
    import jax
    import keras

    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    precision = "default" if policy == "mixed_bfloat16" else args.precision
    times, losses = [], []
    with jax.default_matmul_precision(precision):  # traced under it
        model, x, y, items = train_setup(size, which)
        x, y = jax.device_put((x, y))
        for step in range(size["warmup"] + size["steps"]):
            if step == 1:
                wait()  # the torch worker builds its model while the first step compiles
            begin = time.perf_counter()
            losses.append(float(model.train_on_batch(x, y, return_dict=True)["loss"]))
            times.append(time.perf_counter() - begin)
        state = tuple([v.value for v in variables] for variables in (  # of Keras's train_step
            model.trainable_variables, model.non_trainable_variables,
            model.optimizer.variables, model.metrics_variables))
        lowered = jax.jit(model.train_step).lower(state, (x, y, None))
        cost = lowered.cost_analysis()  # None on some GPU backends: ask the compiled step
        cost = cost if cost is not None else lowered.compile().cost_analysis()
    keras.config.set_dtype_policy("float32")
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost["flops"]) if cost and "flops" in cost else None
    seconds = statistics.median(times[size["warmup"]:])
    peak = peaks.get("bfloat16" if policy == "mixed_bfloat16" else
                     "float32" if precision == "highest" else "float32_default")
    return {"policy": policy, "matmul_precision": precision,
            "batch": {k: list(v.shape) for k, v in x.items()},
            "parameters": model.count_params(), "first_step_s": times[0], "step_s": seconds,
            "steps_per_s": 1 / seconds,
            ("target_tokens" if which == "nmt" else "images") + "_per_s": items / seconds,
            "losses": [losses[0], losses[-1]], "step_flops": flops,
            "mfu": flops / seconds / peak if peak and flops else None}
