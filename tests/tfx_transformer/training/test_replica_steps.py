"""NMT's batches padded to a multiple of the replicas, and one `MirroredStrategy` step of each
model on two logical CPUs equal to the single-device step (`tfx_transformer.training.distribute`,
`tfx_transformer.replicas`): a dense layer, NMT's replica-even batches and DETR's set loss, in a
fresh process (the logical devices must be set before TensorFlow starts)."""

import inspect
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from nlp.data.batching import make_batches
from nlp.training.train import count_batches


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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", MIRRORED_STEPS], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.split("\n")[:-1] == ["dense OK", "nmt OK", "detr OK", "ALL OK"], (
        done.stdout)
