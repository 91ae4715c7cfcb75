"""A reusable check that a Keras layer behaves like a well-made Keras layer.

``check_layer`` runs, for one layer class and one set of inputs:

1. the config round trip: ``get_config`` -> JSON -> ``from_config`` -> the same config, and
   ``keras.saving`` (de)serialization by registered name;
2. an eager call, compared with the expected output shape;
3. a symbolic call inside a functional ``keras.Model``, whose outputs equal the eager ones
   (a layer returning ``AttentionOutput`` must return the same fields, ``None`` in the same
   places, symbolically and eagerly);
4. one ``fit`` step: finite loss and every kernel updated;
5. ``mixed_float16`` and ``mixed_bfloat16``: the same weights give outputs of the policy's
   compute dtype, finite and close to the float32 outputs (``2e-2`` and ``1e-1`` of
   ``max(1, |output|)``);
6. ``.keras`` save/load of the model with identical outputs.

It uses Keras and NumPy only, so applications can check their own layers with it.
"""

from __future__ import annotations

import json
import os
import tempfile

import keras
import numpy as np

from tfx_transformer.layers.output import AttentionOutput

__all__ = ["check_layer"]

_MIXED_TOLERANCE = {"mixed_float16": 2e-2, "mixed_bfloat16": 1e-1}


def _as_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _fields(result) -> dict:
    """A layer's result by field: the non-``None`` fields of an ``AttentionOutput``, else
    ``{"output": result}``."""
    if isinstance(result, AttentionOutput):
        return {name: value for name, value in result._asdict().items() if value is not None}
    return {"output": result}


def _all_close(actual: dict, expected: dict, tol: float, what: str):
    if sorted(actual) != sorted(expected):
        raise AssertionError(f"{what}: fields {sorted(actual)} != {sorted(expected)}")
    for name in expected:
        _close(actual[name], expected[name], tol, f"{what} ({name})")


def _close(actual, expected, tol: float, what: str):
    actual, expected = _as_numpy(actual).astype("float32"), _as_numpy(expected).astype("float32")
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != {expected.shape}")
    if not np.all(np.isfinite(actual)):
        raise AssertionError(f"{what}: non-finite values")
    err = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    if err > tol * scale:
        raise AssertionError(f"{what}: max abs difference {err:.3g} > {tol * scale:.3g}")


def _config_round_trip(layer_cls, init_kwargs):
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for key, value in init_kwargs.items():
        if key not in config:
            raise AssertionError(f"get_config does not mirror the __init__ argument `{key}`")
        if isinstance(value, (bool, int, float, str, type(None))) and config[key] != value:
            raise AssertionError(
                f"get_config()[{key!r}] = {config[key]!r}, but the layer was built with {value!r}"
            )
    rebuilt = layer_cls.from_config(json.loads(json.dumps(config)))
    if rebuilt.get_config() != config:
        got = rebuilt.get_config()
        raise AssertionError(f"config round trip changed the config:\n{config}\n{got}")
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    if not isinstance(keras.saving.deserialize_keras_object(serialized), layer_cls):
        raise AssertionError(f"{layer_cls.__name__} does not deserialize by its registered name")
    return config


def check_layer(
    layer_cls,
    init_kwargs: dict,
    inputs: dict,
    call_kwargs: dict | None = None,
    expected_output_shape: tuple | None = None,
    run_training: bool = True,
    run_mixed_precision: bool = True,
    tolerance: float = 1e-5,
):
    """Runs the six checks above; raises ``AssertionError`` naming the first that fails.

    Args:
        layer_cls: the layer class.
        init_kwargs: constructor arguments.
        inputs: call arguments that are batched arrays, by name, in call order (the first is
            passed positionally). All share the batch dimension.
        call_kwargs: other call arguments (Python values), e.g. ``{"use_causal_mask": True}``.
        expected_output_shape: the eager output shape, checked when given.
        run_training: run the ``fit`` step (skip for layers without weights).
        run_mixed_precision: run the mixed-precision checks.
        tolerance: absolute tolerance (relative to max(1, |output|)) for float32 comparisons.

    Returns:
        The eager float32 output as a NumPy array (the ``output`` field of an
        ``AttentionOutput``).
    """
    call_kwargs = dict(call_kwargs or {})
    names = list(inputs)
    config = _config_round_trip(layer_cls, init_kwargs)

    def call(layer, tensors):
        first, rest = tensors[names[0]], {n: tensors[n] for n in names[1:]}
        return layer(first, **rest, **call_kwargs)

    # Eager.
    layer = layer_cls(**init_kwargs)
    result = call(layer, inputs)
    eager = {name: _as_numpy(value) for name, value in _fields(result).items()}
    output = eager["output"]
    if expected_output_shape is not None and tuple(output.shape) != tuple(expected_output_shape):
        raise AssertionError(f"output shape {output.shape} != {tuple(expected_output_shape)}")

    # Symbolic, in a functional model sharing the eager layer's weights.
    symbolic = {
        n: keras.Input(shape=np.shape(a)[1:], dtype=str(np.asarray(a).dtype), name=n)
        for n, a in inputs.items()
    }
    out = call(layer, symbolic)
    if isinstance(out, AttentionOutput) != isinstance(result, AttentionOutput):
        raise AssertionError(f"symbolic call returned {type(out)}, eager call {type(result)}")
    out = _fields(out)
    if sorted(out) != sorted(eager):
        raise AssertionError(f"symbolic fields {sorted(out)} != eager fields {sorted(eager)}")
    for name, tensor in out.items():
        want = eager[name].shape
        if len(tensor.shape) != len(want) or any(
            s is not None and s != e for s, e in zip(tensor.shape, want)
        ):
            raise AssertionError(f"symbolic {name} shape {tensor.shape} != eager shape {want}")
    model = keras.Model(symbolic, out)
    _all_close(model(inputs), eager, tolerance, "functional model vs eager call")

    # Mixed precision, with the float32 layer's weights.
    if run_mixed_precision:
        for policy, tol in _MIXED_TOLERANCE.items():
            mixed = layer_cls.from_config({**config, "dtype": policy})
            call(mixed, inputs)
            mixed.set_weights(layer.get_weights())
            result = _fields(call(mixed, inputs))
            want = keras.DTypePolicy(policy).compute_dtype
            if np.issubdtype(output.dtype, np.floating) and keras.backend.standardize_dtype(
                result["output"].dtype
            ) != want:
                raise AssertionError(f"{policy}: output dtype {result['output'].dtype} != {want}")
            _all_close(result, eager, tol, f"{policy} vs float32")

    # One fit step, on the `output` field.
    if run_training and layer.trainable_weights:
        trained = keras.Model(symbolic, out["output"])
        trained.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False)
        trained.optimizer.build(trained.trainable_variables)  # fit traces its step once
        target = np.random.default_rng(0).normal(size=output.shape).astype("float32")
        before = [_as_numpy(w) for w in layer.trainable_weights]
        history = trained.fit(inputs, target, batch_size=len(output), epochs=1, verbose=0)
        if not np.isfinite(history.history["loss"][0]):
            raise AssertionError("fit produced a non-finite loss")
        for w, b in zip(layer.trainable_weights, before):
            if "kernel" in w.path and np.array_equal(_as_numpy(w), b):
                raise AssertionError(f"fit did not update {w.path}")

    # .keras save/load.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    _all_close(loaded(inputs), model(inputs), 1e-6, ".keras save/load")
    return output
