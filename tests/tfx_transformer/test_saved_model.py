import keras
import numpy as np
import tensorflow as tf

from tfx_transformer.saved_model import write_saved_model


def test_each_endpoint_is_traced_once_and_loads_as_the_model_computes(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.BatchNormalization()])
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b"]), tf.constant([1.0, 2.0])),
        default_value=0.0)
    traces = []

    def scaled(x, key):
        traces.append("scaled")  # runs once per trace
        return {"y": model(x, training=False) * table.lookup(key)[:, None]}

    def plain(x):
        traces.append("plain")
        return {"y": model(x, training=False)}

    specs = [tf.TensorSpec([None, 3], tf.float32, name="x"),
             tf.TensorSpec([None], tf.string, name="key")]
    write_saved_model(tmp_path, model, [("scaled", scaled, specs), ("plain", plain, specs[:1]),
                                        ("also_plain", plain, specs[:1])], resources=[table])
    assert sorted(traces) == ["plain", "scaled"]  # keras' ExportArchive traces each twice

    loaded = tf.saved_model.load(str(tmp_path))
    assert sorted(loaded.signatures) == ["also_plain", "plain", "scaled", "serving_default"]
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    expected = model(x, training=False).numpy()
    keys = tf.constant(["a", "b", "c", "a"])
    np.testing.assert_allclose(loaded.signatures["serving_default"](x=x, key=keys)["y"],
                               expected * np.array([1, 2, 0, 1.0])[:, None], rtol=1e-6)
    np.testing.assert_allclose(loaded.plain(x)["y"], expected, rtol=1e-6)
    np.testing.assert_allclose(loaded.signatures["also_plain"](x=x)["y"], expected, rtol=1e-6)
    assert len(loaded.variables) == len(model.variables) == 6
