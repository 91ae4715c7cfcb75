"""Tests for tfx_transformer.training.distribute and tfx_transformer.replicas, and for what the
two applications need under a strategy: NMT's replica-even batches and chief-only tokenizer.

One `MirroredStrategy` step of each model against the single-device step:
tests/tfx_transformer/training/test_replica_steps.py; two real workers of
`MultiWorkerMirroredStrategy`: tests/test_multi_worker.py.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfx_transformer.training.distribute as distribute
from nlp.data.embedded import generate_pairs
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import train_tokenizer
from nlp.training.train import build_tokenizer
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
