"""Tests for tfx_transformer.distribute and tfx_transformer.precision."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

from tfx_transformer.distribute import get_strategy, is_chief, task_index, tf_config
from tfx_transformer.precision import set_mixed_precision


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


def test_mirrored_on_two_logical_cpus_matches_single_device():
    code = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        two = [tf.config.LogicalDeviceConfiguration()] * 2
        tf.config.set_logical_device_configuration(cpu, two)
        import keras
        from tfx_transformer.distribute import get_strategy
        x = np.linspace(0, 1, 32, dtype="float32").reshape(8, 4); y = x.sum(1, keepdims=True)
        def one_step(strategy):
            with strategy.scope():
                keras.utils.set_random_seed(1)
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                model.compile(keras.optimizers.SGD(0.1), loss="mse")
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
            return model.get_weights()
        mirrored = get_strategy("mirrored")
        assert mirrored.num_replicas_in_sync == 2, mirrored.extended.worker_devices
        for a, b in zip(one_step(mirrored), one_step(tf.distribute.get_strategy())):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        print("OK", mirrored.num_replicas_in_sync)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK 2")


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
    from tfx_transformer.precision import fast_bfloat16, resolve_mixed_precision

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
