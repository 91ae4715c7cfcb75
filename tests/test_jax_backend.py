"""Models saved under TensorFlow run under JAX: same outputs, searches and set loss in `jax.jit`.

The test process (TensorFlow backend) builds a tiny NMT model and a tiny DETR, saves both as
``.keras`` files with their outputs, translations, set loss and its gradients, then a fresh
process with ``KERAS_BACKEND=jax`` loads them and checks that it gets the same numbers, with
greedy search, beam search and the set loss (``HungarianMatcher(solver="ops")``) with its
gradients compiled by ``jax.jit``. Needs the ``jax`` extra (``pip install -e ".[jax]"``);
skipped without it.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest

if importlib.util.find_spec("jax") is None:
    pytest.skip("jax is not installed (the optional extra `jax`: pip install -e '.[jax]')",
                allow_module_level=True)

from nlp.modeling.model import Seq2SeqTransformer  # noqa: E402
from nlp.search.decoding import beam_search, greedy_search  # noqa: E402
from vision.config import preset  # noqa: E402
from vision.modeling.detr import build_criterion, build_model  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="saves the models under the TensorFlow backend")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300  # the JAX process takes about 25 s on two busy cores, most of it compiling

# Logits, scores, boxes, losses and gradients are float32 sums of a few hundred terms, which
# TensorFlow and XLA order differently (seen: <= 2e-6).
ATOL = 1e-5

SOURCE = np.array([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0]], "int32")  # eos-terminated
TARGET_IN = np.array([[2, 12, 13, 14], [2, 15, 0, 0]], "int32")
SEARCH = dict(extra_length=4)
BEAM = dict(beam_size=3, length_penalty=0.6, extra_length=4, return_scores=True)

DETR_SIZE = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6,
                 tiny_filters=(8, 16, 16, 32), num_encoder_layers=1, num_decoder_layers=2,
                 matcher_solver="ops")
NUM_CLASSES = 3


def _detr_inputs():
    """Two images of one padded 64x80 batch (the second 40x72), and their targets."""
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 64, 80, 3)).astype("float32")
    mask = np.zeros((2, 64, 80), bool)
    mask[0], mask[1, :40, :72] = True, True
    boxes = np.zeros((2, 3, 4), "float32")
    boxes[0] = [[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4], [0.5, 0.5, 0.9, 0.9]]
    boxes[1, 0] = [0.4, 0.5, 0.3, 0.3]
    return {
        "images": images, "mask": mask,
        "labels": np.array([[0, 2, 1], [1, 0, 0]], "int32"), "boxes": boxes,
        "valid": np.array([[True, True, True], [True, False, False]]),
    }


def _flat(prefix, tree) -> dict:
    """A nested dict/list of tensors as ``{"prefix/key/0/...": array}``."""
    return {"/".join(map(str, (prefix, *path))): keras.ops.convert_to_numpy(value)
            for path, value in keras.tree.flatten_with_path(tree)}


# Run with KERAS_BACKEND=jax: argv[1] the folder with the saved models and `reference.npz`,
# argv[2] the tolerance, argv[3:] the reprs of SEARCH, BEAM and DETR_SIZE.
JAX_SCRIPT = textwrap.dedent("""
    import ast
    import sys
    import time
    from pathlib import Path

    import jax
    import keras
    import numpy as np

    import nlp.modeling.model  # noqa: F401  (registers the saved classes)
    from nlp.search.decoding import beam_search, compile_search
    from tfx_transformer import MultiHeadAttention
    from vision.config import preset
    from vision.modeling.detr import build_criterion

    assert keras.backend.backend() == "jax", keras.backend.backend()
    folder, atol = Path(sys.argv[1]), float(sys.argv[2])
    search, beam, detr_size = map(ast.literal_eval, sys.argv[3:6])
    ref = dict(np.load(folder / "reference.npz"))
    start = time.perf_counter()


    def flat(prefix, tree):  # as `_flat` of the test
        return {"/".join(map(str, (prefix, *path))): np.asarray(value)
                for path, value in keras.tree.flatten_with_path(tree)}


    def same(got, prefix):
        want = {k: v for k, v in ref.items() if k == prefix or k.startswith(prefix + "/")}
        assert got.keys() == want.keys(), (sorted(got.keys() - want.keys())[:5],
                                           sorted(want.keys() - got.keys())[:5])
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, atol=atol, rtol=0, err_msg=key)


    # NMT: the loaded model's logits, then greedy and beam search compiled by jax.jit.
    nmt = keras.saving.load_model(folder / "nmt.keras")
    source = ref["nmt/source"]
    batch = {"source": source, "target_in": ref["nmt/target_in"]}
    same(flat("nmt/logits", jax.jit(nmt)(batch)), "nmt/logits")
    greedy = compile_search(nmt, "greedy", **search)  # jax.jit under JAX
    assert hasattr(greedy, "lower"), f"not a jax.jit function: {greedy!r}"
    np.testing.assert_array_equal(np.asarray(greedy(source)), ref["nmt/greedy"],
                                  err_msg="greedy")
    ids, scores = jax.jit(lambda s: beam_search(nmt, s, **beam))(source)
    np.testing.assert_array_equal(np.asarray(ids), ref["nmt/beam"], err_msg="beam")
    np.testing.assert_allclose(np.asarray(scores), ref["nmt/beam_scores"], atol=atol,
                               err_msg="beam scores")
    print(f"nmt ok {time.perf_counter() - start:.1f}s", flush=True)

    # Without the weights, attention is keras.ops.dot_product_attention under JAX: the same
    # output as the explicit product, zeros for a query with no key, float16 scores of
    # 160,000 (beyond float16's 65504) formed in float32.
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    mask = np.ones((2, 3, 3), bool)
    mask[0, 1] = False  # query 1 of sentence 0 may attend nothing
    for policy, tol in (("float32", 1e-6), ("mixed_float16", 2e-3)):
        layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype=policy)
        fused = layer(x, x, attention_mask=mask).output
        explicit = layer(x, x, attention_mask=mask, return_attention_scores=True).output
        fused, explicit = (np.asarray(keras.ops.cast(o, "float32")) for o in (fused, explicit))
        assert np.all(fused[0, 1] == 0) and np.all(np.abs(fused[1]) > 0), policy
        np.testing.assert_allclose(fused, explicit, atol=tol, err_msg=policy)
    big = np.concatenate([np.full((2, 16), 200.0), np.full((1, 16), -200.0)])[None]
    layer = MultiHeadAttention(num_heads=1, key_dim=16, dtype="mixed_float16")
    layer(big, big)
    eye, zero = np.eye(16, dtype="float32"), np.zeros((1, 16), "float32")
    layer.set_weights([eye[:, None], zero] * 3 + [eye[None], np.zeros(16, "float32")])
    out = np.asarray(keras.ops.cast(layer(big, big).output, "float32"))[0]
    np.testing.assert_allclose(out, big[0], rtol=1e-3)  # weights (0.5, 0.5, 0), (0, 0, 1)

    # DETR: predictions, set loss and gradients of the loaded model in one jax.jit step.
    detr = keras.saving.load_model(folder / "detr.keras")
    criterion = build_criterion(preset("tiny", **detr_size), detr.num_classes)
    assert criterion.matcher.solver == "ops"
    inputs = {"images": ref["detr/images"], "mask": ref["detr/mask"]}
    targets = {k: ref[f"detr/{k}"] for k in ("labels", "boxes", "valid")}


    def loss_fn(trainable, non_trainable, inputs, targets):
        outputs, _ = detr.stateless_call(trainable, non_trainable, inputs)
        losses = criterion(outputs, targets)
        return losses["loss"], (outputs, losses)


    step = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    (_, (outputs, losses)), grads = step([v.value for v in detr.trainable_variables],
                                         [v.value for v in detr.non_trainable_variables],
                                         inputs, targets)
    same(flat("detr/outputs", outputs), "detr/outputs")
    same(flat("detr/losses", losses), "detr/losses")
    same({f"detr/grads/{i:03d}": g for i, g in enumerate(grads)}, "detr/grads")
    print(f"detr ok {time.perf_counter() - start:.1f}s", flush=True)
""")


def _nmt_references(folder: Path) -> dict:
    keras.utils.set_random_seed(0)
    model = Seq2SeqTransformer(vocab_size=50, num_encoder_layers=1, num_decoder_layers=1,
                               d_model=16, num_heads=2, ffn_dim=32, dropout=0.0)
    logits = model({"source": SOURCE, "target_in": TARGET_IN})
    ids, scores = beam_search(model, SOURCE, **BEAM)
    model.save(folder / "nmt.keras")
    return {"nmt/source": SOURCE, "nmt/target_in": TARGET_IN,
            **_flat("nmt/logits", logits),
            "nmt/greedy": np.asarray(greedy_search(model, SOURCE, **SEARCH)),
            "nmt/beam": np.asarray(ids), "nmt/beam_scores": np.asarray(scores)}


def _detr_references(folder: Path) -> dict:
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    config = preset("tiny", **DETR_SIZE)
    model = build_model(config, NUM_CLASSES)
    criterion = build_criterion(config, NUM_CLASSES)
    data = _detr_inputs()
    inputs = {"images": data["images"], "mask": data["mask"]}
    targets = {k: data[k] for k in ("labels", "boxes", "valid")}
    with tf.GradientTape() as tape:
        outputs = model(inputs)
        losses = criterion(outputs, targets)
    grads = tape.gradient(losses["loss"], model.trainable_variables)
    model.save(folder / "detr.keras")
    return {**{f"detr/{k}": v for k, v in data.items()}, **_flat("detr/outputs", outputs),
            **_flat("detr/losses", losses),
            **{f"detr/grads/{i:03d}": np.asarray(g) for i, g in enumerate(grads)}}


def test_models_saved_under_tensorflow_run_under_jax_jit(tmp_path):
    ref = {**_nmt_references(tmp_path), **_detr_references(tmp_path)}
    assert len(set(ref["nmt/greedy"][0])) > 1  # the translations are not all one token
    assert ref["detr/losses/loss"] > 0
    assert all(np.isfinite(v).all() for k, v in ref.items() if k.startswith("detr/grads/"))
    np.savez(tmp_path / "reference.npz", **ref)
    # XLA's CPU backend compiles about twice as fast without LLVM optimizations; these models
    # are too small for that to matter when they run.
    xla_flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": xla_flags,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", JAX_SCRIPT, str(tmp_path), str(ATOL),
               *map(repr, (SEARCH, BEAM, DETR_SIZE))]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        out = error.stdout or b""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = error.stderr or b""
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        pytest.fail(f"the JAX process ran past {TIMEOUT_S} s.\nstdout:\n{out[-2000:]}\n"
                    f"stderr:\n{err[-4000:]}")
    assert done.returncode == 0, (
        f"the JAX process failed after {time.perf_counter() - start:.0f} s.\n"
        f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-6000:]}"
    )
    assert "detr ok" in done.stdout, done.stdout
