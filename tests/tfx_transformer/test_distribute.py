"""Tests for tfx_transformer.training.distribute and tfx_transformer.training.distribute, and for
what the two
applications need under a strategy: NMT's replica-even batches and chief-only tokenizer,
and one `MirroredStrategy` step of each model equal to the single-device step.

Two real workers of `MultiWorkerMirroredStrategy`: tests/test_multi_worker.py.
"""

import inspect
import json
import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfx_transformer.training.distribute as distribute
from nlp.data.batching import make_batches
from nlp.data.embedded import generate_pairs
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import train_tokenizer
from nlp.training.train import build_tokenizer, count_batches
from tfx_transformer.replicas import (
    GlobalClipAdam,
    clip_by_global_norm_of_sum,
    num_replicas,
    replica_sum,
)
from tfx_transformer.training.distribute import (
    broadcast_from_chief,
    get_strategy,
    is_chief,
    set_mixed_precision,
    task_index,
    tf_config,
)


def test_strategy_names(monkeypatch):
    assert get_strategy("auto").num_replicas_in_sync == 1
    expected = r"one of \('auto', 'mirrored', 'multi_worker'\)\. Received: strategy='tpu'"
    with pytest.raises(ValueError, match=expected):
        get_strategy("tpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        get_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        get_strategy("multi_worker")


def test_is_chief_and_task_index(monkeypatch):
    cluster = {"worker": ["a:1", "b:2"]}
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert is_chief() and task_index() == 0 and tf_config() == {}
    for index, expected in [(0, True), (1, False)]:
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(config))
        assert is_chief() is expected and task_index() == index
        assert tf_config() == config
    config = {"cluster": {**cluster, "chief": ["c:3"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert not is_chief()
    monkeypatch.setenv("TF_CONFIG", "[1, 2]")  # JSON, but not an object
    assert tf_config() == {} and is_chief()


class FakeTokenizer:
    """Ids written as text ("5 6 7"): make_batches and count_batches without SentencePiece."""

    pad_id, bos_id, eos_id = 0, 2, 3
    source_pad_id, source_eos_id = 0, 3

    def tokenize(self, texts):
        return tf.strings.to_number(tf.strings.split(texts), tf.int32)

    tokenize_target = tokenize

    def encode(self, text):
        return [int(t) for t in text.split()]

    encode_target = encode


# One step on two logical CPUs against the same global batch on one device: the loss, the
# weights and the optimizer's slots (Adam's first and second moments are the gradients,
# which the weights after Adam's first step, about lr * sign(g), would not show; a
# parameter whose gradient is 0 up to round-off, such as an attention key bias, moves by
# ±lr either way, so the learning rates are small). Eager steps: tracing costs more than the
# steps. NMT: 3 rows (a pad row for the second replica) holding 4 and 7 target tokens.
# DETR: 2 and 6 objects; eos_coef = 1, so that the class weights sum alike on both replicas
# (DETR's classification loss is each replica's weighted mean, averaged); no clipping: Keras
# clips each replica's gradients before summing them (`clip_by_global_norm_of_sum`).
MIRRORED_STEPS = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    two = [tf.config.LogicalDeviceConfiguration()] * 2
    tf.config.set_logical_device_configuration(cpu, two)
    import keras
    from tfx_transformer.replicas import clip_by_global_norm_of_sum, num_replicas, replica_sum
    from tfx_transformer.training.distribute import get_strategy
""") + inspect.getsource(FakeTokenizer) + textwrap.dedent("""
    mirrored = get_strategy("mirrored")  # one: another one's collectives would clash
    assert mirrored.num_replicas_in_sync == 2, mirrored.extended.worker_devices
    single = tf.distribute.get_strategy()

    def one_step(strategy, build, data, eager=True):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = build()
        model.run_eagerly = eager
        history = model.fit(data, epochs=1, verbose=0, shuffle=False)
        return (history.history["loss"][0], model.get_weights(),
                [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables])

    def compare(name, build, data_for, eager=True):
        (loss_2, weights_2, slots_2), (loss_1, weights_1, slots_1) = (
            one_step(s, build, data_for(s.num_replicas_in_sync), eager)
            for s in (mirrored, single))
        np.testing.assert_allclose(loss_2, loss_1, rtol=1e-5, err_msg=f"{name}: loss")
        for what, got, want, atol in (("weights", weights_2, weights_1, 1e-5),
                                      ("optimizer variables", slots_2, slots_1, 1e-6)):
            assert len(got) == len(want)
            for i, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol,
                                           err_msg=f"{name}: {what}[{i}]")
        print(name, "OK", flush=True)

    # A Keras loss ("sum_over_batch_size", which Keras scales), in a traced step.
    def dense_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        return model

    x = np.linspace(0, 1, 32, dtype="float32").reshape(8, 4)
    xy = tf.data.Dataset.from_tensors((x, x.sum(1, keepdims=True)))
    compare("dense", dense_model, lambda n: xy, eager=False)

    from nlp.config import preset as nmt_preset
    from nlp.data.batching import make_batches
    from nlp.modeling.model import build_model as build_nmt
    from nlp.training.train import compile_model

    # warmup_steps 100,000: lr(1) = 16^-0.5 * 100,000^-1.5 ~ 8e-9 (lr_scale 1), far below atol.
    nmt = nmt_preset("tiny", vocab_size=16, d_model=16, num_heads=2, ffn_dim=32, dropout=0.0,
                     num_encoder_layers=1, num_decoder_layers=1, max_length=16,
                     warmup_steps=100_000)
    pairs = [("5 6", "7"), ("8 9 10", "11"), ("12 13", "4 5 6 7 8 9")]

    def nmt_data(replicas):
        ds = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))
        ds = make_batches(ds, FakeTokenizer(), 64, nmt.max_length, shuffle=False,
                          num_replicas=replicas)[0]
        return ds.apply(tf.data.experimental.assert_cardinality(1))

    def nmt_model():
        model = build_nmt(nmt)
        compile_model(model, nmt, jit_compile=False)  # the Noam schedule
        return model

    compare("nmt", nmt_model, nmt_data)

    from vision.config import preset as detr_preset
    from vision.modeling.detr import build_criterion, build_model as build_detr
    from vision.modeling.optimizer import build_optimizer

    detr = detr_preset("tiny", hidden_dim=16, num_heads=2, ffn_dim=32, num_queries=4,
                       num_encoder_layers=1, num_decoder_layers=1, tiny_filters=(8, 16),
                       eos_coef=1.0, learning_rate=1e-6)
    rng = np.random.default_rng(0)
    valid = np.array([[1, 0, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], "float32")
    batch = ({"images": rng.normal(size=(4, 16, 16, 3)).astype("float32"),
              "mask": np.ones((4, 16, 16), "float32")},
             {"labels": rng.integers(0, 2, size=(4, 3)).astype("int32"),
              "boxes": rng.uniform(0.3, 0.6, size=(4, 3, 4)).astype("float32"),
              "valid": valid})

    def detr_model():
        model = build_detr(detr, 2)
        model.compile(optimizer=build_optimizer(detr, model),
                      criterion=build_criterion(detr, 2))
        return model

    compare("detr", detr_model, lambda n: tf.data.Dataset.from_tensors(batch))

    # The helpers in a replica context: replica 0 holds g, replica 1 holds 2 g.
    base = [np.array([3.0, 0.0], "float32"), np.array([[4.0]], "float32")]

    @tf.function
    def in_replicas():
        def fn():
            k = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                        tf.float32)
            grads = [tf.constant(g) * k for g in base]
            return (tf.constant(num_replicas()), replica_sum(k),
                    clip_by_global_norm_of_sum([grads[0], None, grads[1]], 1.0))
        return mirrored.run(fn)

    replicas, total, clipped = in_replicas()
    assert [int(r) for r in mirrored.experimental_local_results(replicas)] == [2, 2]
    assert [float(t) for t in mirrored.experimental_local_results(total)] == [3.0, 3.0]
    assert clipped[1] is None
    summed = [mirrored.reduce("SUM", clipped[i], axis=None).numpy() for i in (0, 2)]
    for got, g in zip(summed, base):  # 3 g has the norm 15: clipped to 3 g / 15
        np.testing.assert_allclose(got, 3 * g / 15, rtol=1e-6)
    print("ALL OK", flush=True)
""")


def test_mirrored_on_two_logical_cpus_matches_single_device():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", MIRRORED_STEPS], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.split("\n")[:-1] == ["dense OK", "nmt OK", "detr OK", "ALL OK"], (
        done.stdout)


def test_one_replica_helpers_are_the_identity(monkeypatch):
    x = tf.constant([1.0, 2.0])
    assert num_replicas() == 1 and replica_sum(x) is x
    with tf.distribute.get_strategy().scope():
        assert num_replicas() == 1 and replica_sum(x) is x
    assert broadcast_from_chief(b"proto") == b"proto"  # no other worker
    with pytest.raises(ValueError, match="no chief"):
        broadcast_from_chief(None)
    assert distribute.multi_worker_strategy() is None
    monkeypatch.setattr(keras.config, "backend", lambda: "jax")  # no TensorFlow context read
    monkeypatch.setattr(tf.distribute, "get_replica_context", lambda: pytest.fail("read"))
    assert num_replicas() == 1 and replica_sum(x) is x


def test_clip_by_global_norm_of_sum_with_one_replica_is_keras_clipping():
    grads = [tf.constant([3.0, 0.0]), None, tf.constant([[4.0]])]
    clipped = clip_by_global_norm_of_sum(grads, 1.0)  # norm 5
    assert clipped[1] is None
    np.testing.assert_allclose(clipped[0], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped[2], [[0.8]], rtol=1e-6)
    kept = clip_by_global_norm_of_sum(grads, 10.0)
    np.testing.assert_allclose(kept[0], grads[0])
    np.testing.assert_allclose(kept[2], grads[2])
    assert np.isnan(clip_by_global_norm_of_sum([tf.constant([np.inf])], 1.0)[0]).all()
    assert clip_by_global_norm_of_sum([None], 1.0) == [None]


def test_global_clip_adam_steps_as_keras_adam_dense_and_sparse():
    """The fused kernel (dense gradients) and Keras's own step (IndexedSlices) give Keras's
    Adam, clipping included, over three steps."""
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(shape).astype("float32") for shape in ((4, 3), 5)]
    results = []
    for optimizer in (keras.optimizers.Adam(1e-2, beta_2=0.98, epsilon=1e-6, global_clipnorm=1.0),
                      GlobalClipAdam(1e-2, beta_2=0.98, epsilon=1e-6,
                                                global_clipnorm=1.0)):
        variables = [keras.Variable(w) for w in start]
        grads_rng = np.random.default_rng(1)
        for _ in range(3):
            dense = tf.constant(grads_rng.standard_normal((4, 3)), tf.float32)
            rows = tf.IndexedSlices(tf.constant(grads_rng.standard_normal((2,)), tf.float32),
                                    tf.constant([1, 3]), tf.constant([5]))
            optimizer.apply([dense, rows], variables)
        results.append([v.numpy() for v in variables])
    assert not np.allclose(results[1][0], start[0], atol=1e-3)
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _traced_apply(optimizer, variables):
    return tf.function(lambda grads: optimizer.apply(grads, variables))


def test_a_traced_adam_step_makes_its_scalars_once_and_steps_as_keras_adam():
    """Traced, the fused step's learning rate, beta powers and epsilon are in the graph once
    for all variables (one ``Pow`` per beta, one ``ResourceApplyAdam`` per variable), and
    three steps give Keras's Adam."""
    rng = np.random.default_rng(0)
    start = [rng.standard_normal(shape).astype("float32") for shape in ((4, 3), (5,), (2, 2))]
    grads = [[tf.constant(rng.standard_normal(w.shape), tf.float32) for w in start]
             for _ in range(3)]
    results, graphs = [], []
    for optimizer in (keras.optimizers.Adam(1e-2, beta_2=0.98, epsilon=1e-6, global_clipnorm=1.0),
                      GlobalClipAdam(1e-2, beta_2=0.98, epsilon=1e-6, global_clipnorm=1.0)):
        variables = [keras.Variable(w) for w in start]
        optimizer.build(variables)
        step = _traced_apply(optimizer, variables)
        for g in grads:
            step(g)
        graphs.append(step.get_concrete_function(grads[0]).graph)
        results.append([v.numpy() for v in variables])
    ops = [op.type for op in graphs[1].get_operations()]
    assert ops.count("ResourceApplyAdam") == 3 and ops.count("Pow") == 2, sorted(set(ops))
    assert [op.type for op in graphs[0].get_operations()].count("Pow") >= 3 * 2  # Keras's own
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_make_batches_pads_rows_to_a_multiple_of_the_replicas():
    rng = np.random.default_rng(0)
    pairs = [(" ".join(str(t) for t in rng.integers(4, 50, size=rng.integers(1, 12))),
              " ".join(str(t) for t in rng.integers(4, 50, size=rng.integers(1, 12))))
             for _ in range(60)]
    ds = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))

    def batches(replicas):
        out = make_batches(ds, FakeTokenizer(), 40, 12, seed=3, num_replicas=replicas)[0]
        return [(x["source"].numpy(), x["target_in"].numpy(), y.numpy()) for x, y in out]

    plain, padded = batches(1), batches(3)
    kept, _, expected = count_batches(pairs, FakeTokenizer(), 40, 12)
    assert len(plain) == len(padded) == expected  # the count of the training loop
    assert sum(len(b[0]) for b in plain) == kept
    assert any(len(b[0]) % 3 for b in plain)  # some batches needed rows
    for one, three in zip(plain, padded):
        rows = len(one[0])
        assert len(three[0]) == 3 * math.ceil(rows / 3)
        for a, b in zip(one, three):
            np.testing.assert_array_equal(b[:rows], a)
            assert not b[rows:].any()  # all pad: ignored by the masked loss
    with pytest.raises(ValueError, match="num_replicas"):
        make_batches(ds, FakeTokenizer(), num_replicas=0)


@pytest.fixture(scope="module")
def proto(tmp_path_factory):
    """A tokenizer trained for ``vocab_size=120``, as its model proto."""
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    texts = [text for pair in generate_pairs(50, seed=3) for text in pair]
    return Tokenizer.from_file(train_tokenizer(texts, path, 120)).model_proto


def _as_worker(monkeypatch, index, received=None):
    """``TF_CONFIG`` of worker ``index`` of two; `broadcast_from_chief` recorded (and, on the
    non-chief, answering ``received``)."""
    cluster = {"worker": ["a:1", "b:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": "worker", "index": index}}))
    sent = []

    def broadcast(payload, strategy):
        sent.append(payload)
        return payload if payload is not None else received

    monkeypatch.setattr(distribute, "broadcast_from_chief", broadcast)
    return sent


def test_only_the_chief_builds_the_tokenizer_the_others_receive_it(monkeypatch, tmp_path,
                                                                   proto):
    strategy, pairs = object(), [("a b", "c d")]  # any strategy: broadcast is replaced
    path = tmp_path / "tokenizer.model"
    path.write_bytes(proto)  # the chief's (resumed) tokenizer
    checked, lines = [], []
    sent = _as_worker(monkeypatch, 0)
    vocab = Tokenizer(proto).vocab_size
    chief = build_tokenizer(str(path), pairs, 120, lines.append, checked.append,
                            strategy=strategy)
    assert sent == [proto] and chief.vocab_size == vocab and len(checked) == 1

    other_path = tmp_path / "other" / "tokenizer.model"
    sent = _as_worker(monkeypatch, 1, received=proto)
    other = build_tokenizer(str(other_path), pairs, 120, lines.append, checked.append,
                            strategy=strategy)
    assert sent == [None] and other.model_proto == proto and len(checked) == 2
    assert not other_path.parent.exists()  # nothing written
    assert "tokenizer: received from the chief worker" in lines

    _as_worker(monkeypatch, 1, received=b"")  # the chief failed
    with pytest.raises(ValueError, match="chief worker could not build the tokenizer"):
        build_tokenizer(str(other_path), pairs, 120, lines.append, strategy=strategy)


def test_a_chief_that_fails_tells_the_others(monkeypatch, tmp_path, proto):
    path = tmp_path / "tokenizer.model"
    path.write_bytes(proto)
    sent = _as_worker(monkeypatch, 0)

    def reject(tokenizer):
        raise ValueError("no pair fits")

    with pytest.raises(ValueError, match="no pair fits"):
        build_tokenizer(str(path), [], 120, print, reject, strategy=object())
    assert sent == [b""]
    with pytest.raises(ValueError, match="--vocab-size"):  # trained for 120, not 80
        build_tokenizer(str(path), [], 80, print, strategy=object())
    assert sent == [b"", b""]


def test_set_mixed_precision():
    assert set_mixed_precision("bfloat16") == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert set_mixed_precision("float16") == "mixed_float16"
    assert keras.config.dtype_policy().name == "mixed_float16"
    assert set_mixed_precision("none") == "float32"
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(ValueError, match="Received: 'fp16'"):
        set_mixed_precision("fp16")


def test_auto_precision_picks_bfloat16_only_where_it_is_fast():
    from tfx_transformer.training.distribute import fast_bfloat16, resolve_mixed_precision

    amx, avx = {"avx512f", "amx_tile", "amx_bf16"}, {"avx512f", "avx512_bf16"}
    assert fast_bfloat16(cpu_flags=amx, gpus=[]) == "CPU amx_bf16"
    assert fast_bfloat16(cpu_flags=avx, gpus=[]) is None
    hopper, turing = {"compute_capability": (9, 0)}, {"compute_capability": (7, 5)}
    assert fast_bfloat16(cpu_flags=avx, gpus=[hopper]) == "GPU compute capability 9.0"
    assert fast_bfloat16(cpu_flags=amx, gpus=[turing]) is None  # the GPU computes
    assert resolve_mixed_precision("auto", cpu_flags=amx, gpus=[]) == "bfloat16"
    assert resolve_mixed_precision("auto", cpu_flags=avx, gpus=[]) == "none"
    assert resolve_mixed_precision("float16", cpu_flags=avx, gpus=[]) == "float16"
    with pytest.raises(ValueError, match="mixed-precision"):
        resolve_mixed_precision("bf16")
