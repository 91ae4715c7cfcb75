"""`tfx_transformer.layers.projection`: a Dense layer's call as one 2-D matrix product."""

import keras
import numpy as np
import tensorflow as tf

from tfx_transformer.layers.projection import dense_call


def _op_types(fn):
    spec = tf.TensorSpec([None, None, 4], tf.float32)  # batch and length unknown
    return [op.type for op in tf.function(fn, input_signature=[spec])
            .get_concrete_function().graph.get_operations()]


def test_dense_call_is_the_layers_call_in_one_product():
    dense = keras.layers.Dense(6, activation="relu", bias_initializer="glorot_uniform")
    dense.build((None, None, 4))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype("float32")
    np.testing.assert_allclose(dense_call(dense, x), dense(x), rtol=1e-6, atol=1e-7)
    # Traced where not even the last axis is known (the detector's sine embedding).
    unknown = tf.function(lambda t: dense_call(dense, t),
                          input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    np.testing.assert_allclose(unknown(x), dense(x), rtol=1e-6, atol=1e-7)
    ours, keras_own = _op_types(lambda t: dense_call(dense, t)), _op_types(dense)
    shape_arithmetic = {"GatherV2", "Prod", "ConcatV2", "Transpose"}  # tf.tensordot's
    assert ours.count("MatMul") == 1 and not shape_arithmetic & set(ours), ours
    assert shape_arithmetic <= set(keras_own) and len(ours) < len(keras_own), keras_own


def test_a_lora_layer_keeps_its_own_call():
    dense = keras.layers.Dense(6)
    dense.build((None, None, 4))
    dense.enable_lora(2)
    dense.lora_kernel_b.assign(np.ones(dense.lora_kernel_b.shape, "float32"))  # B starts at 0
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    plain = x @ keras.ops.convert_to_numpy(dense._kernel) + keras.ops.convert_to_numpy(dense.bias)
    np.testing.assert_allclose(dense_call(dense, x), dense(x), rtol=1e-6)
    assert not np.allclose(keras.ops.convert_to_numpy(dense(x)), plain, atol=1e-3)
