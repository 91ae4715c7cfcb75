"""Every public layer passes the shared layer checks; attention layers return one structure."""

import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfx_transformer as tt
from tfx_transformer.layers.testing import check_layer

B, T, S, D = 2, 5, 7, 16
rng = np.random.default_rng(0)
X = rng.normal(size=(B, T, D)).astype("float32")
MEM = rng.normal(size=(B, S, D)).astype("float32")
POS = rng.normal(size=(B, S, D)).astype("float32")
VALID = np.array([[True] * 4 + [False] * 3, [True] * S])
PIXELS = np.ones((B, 4, 6), bool)
PIXELS[0, 3:, :] = False
PIXELS[0, :, 4:] = False
CACHE = rng.normal(size=(2, B, 4, T, 4)).astype("float32")  # (2, B, H, T, D)

CASES = {
    "mha_self": (tt.MultiHeadAttention, dict(num_heads=4, key_dim=4), {"query": X, "value": X},
                 {"use_causal_mask": True}, (B, T, D)),
    "mha_cross": (tt.MultiHeadAttention, dict(num_heads=2, key_dim=8, value_dim=4, output_dim=12),
                  {"query": X, "value": MEM}, {}, (B, T, 12)),
    "ffn": (tt.FeedForward, dict(hidden_dim=32, dropout=0.1), {"x": X}, {}, (B, T, D)),
    "encoder_layer": (tt.TransformerEncoderLayer, dict(num_heads=4, hidden_dim=32,
                                                       activation_dropout=0.0),
                      {"x": MEM, "padding_mask": VALID, "pos": POS}, {}, (B, S, D)),
    "encoder_prenorm": (tt.TransformerEncoder, dict(num_layers=2, num_heads=4, hidden_dim=32,
                                                    norm_first=True),
                        {"x": MEM, "padding_mask": VALID}, {}, (B, S, D)),
    "decoder_layer": (tt.TransformerDecoderLayer, dict(num_heads=4, hidden_dim=32),
                      {"x": X, "memory": MEM, "memory_mask": VALID},
                      {"use_causal_mask": True}, (B, T, D)),
    "decoder_layer_cross_attention": (tt.TransformerDecoderLayer,
                                      dict(num_heads=4, hidden_dim=32, norm_first=True),
                                      {"x": X, "memory": MEM, "memory_mask": VALID},
                                      {"return_cross_attention": True}, (B, T, D)),
    "decoder_stack": (tt.TransformerDecoder, dict(num_layers=2, num_heads=4, hidden_dim=32,
                                                  norm_first=True),
                      {"x": X, "memory": MEM, "query_pos": X, "memory_pos": POS}, {},
                      (B, T, D)),
    "sinusoidal": (tt.SinusoidalPositionEncoding, dict(max_length=64, layout="concat"),
                   {"inputs": X}, {}, (B, T, D)),
    "learned_position": (tt.LearnedPositionEmbedding, dict(max_length=16), {"inputs": X}, {},
                         (B, T, D)),
    "sine_2d": (tt.SinePositionEmbedding2D, dict(num_pos_feats=8), {"valid": PIXELS}, {},
                (B, 4, 6, 16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_contract(case):
    layer_cls, init_kwargs, inputs, call_kwargs, shape = CASES[case]
    out = check_layer(layer_cls, init_kwargs, inputs, call_kwargs, expected_output_shape=shape)
    assert np.all(np.isfinite(out))


def test_layer_contract_with_scores_and_cache():
    """Every field through the checks (no fit step: the cache write has no gradient)."""
    check_layer(tt.MultiHeadAttention, dict(num_heads=4, key_dim=4),
                {"query": X[:, :2], "value": X[:, :2], "cache": CACHE},
                {"cache_index": 1, "return_attention_scores": True},
                expected_output_shape=(B, 2, D), run_training=False)


def test_check_layer_catches_a_broken_config():
    """The harness itself can fail: a layer whose get_config drops an argument."""

    class Broken(tt.FeedForward):
        def get_config(self):
            config = super().get_config()
            config["hidden_dim"] = 3
            return config

    with pytest.raises(AssertionError, match="hidden_dim"):
        check_layer(Broken, dict(hidden_dim=32), {"x": X})


# The fixed return structure: AttentionOutput(output, attention, cache), None where not asked.

def _assert_structure(result, output, attention, cache):
    """``result`` is an AttentionOutput whose fields have these shapes (None = field is None)."""
    assert type(result) is tt.AttentionOutput
    assert result._fields == ("output", "attention", "cache")
    for name, want in zip(result._fields, (output, attention, cache)):
        got = getattr(result, name)
        if want is None:
            assert got is None, name
        else:
            assert got is not None, name
            assert len(got.shape) == len(want), (name, got.shape, want)
            assert all(g is None or g == w for g, w in zip(got.shape, want)), (name, got.shape)


def _run(mode, layer, args, kwargs):
    """Calls ``layer`` eagerly, inside a tf.function, or on KerasTensors."""
    if mode == "eager":
        return layer(*args, **kwargs)
    if mode == "tf.function":
        return tf.function(lambda *a: layer(*a, **kwargs))(*args)
    symbolic = [keras.Input(shape=a.shape[1:], dtype=str(a.dtype)) for a in args]
    kwargs = {k: keras.Input(shape=v.shape[1:]) if isinstance(v, np.ndarray) else v
              for k, v in kwargs.items()}
    return layer(*symbolic, **kwargs)


MODES = ["eager", "tf.function", "symbolic"]  # each test calls its layer in all three


@pytest.mark.parametrize(
    "scores,cache", list(itertools.product([False, True], [None, "self", "pre"])))
def test_multi_head_attention_always_returns_attention_output(scores, cache):
    layer = tt.MultiHeadAttention(num_heads=4, key_dim=4)
    layer(X, MEM)
    query, value, kwargs, length = X, MEM, {}, S
    if cache == "self":  # one new step at index 3 of a T-slot cache
        query, value, length = X[:, :1], X[:, :1], T
        kwargs = dict(cache=CACHE, cache_index=3)
    elif cache == "pre":
        kwargs = dict(cache=np.asarray(layer.compute_cache(MEM)))
    cache_shape = None if cache is None else kwargs["cache"].shape
    for mode in MODES:  # one layer (built once) in each mode
        result = _run(mode, layer, (query, value), dict(kwargs, return_attention_scores=scores))
        _assert_structure(result, (B, query.shape[1], D), (B, 4, query.shape[1], length)
                          if scores else None, cache_shape)


DECODER_COMBINATIONS = [  # (stack, return_cross_attention, cache, return_intermediate)
    c for c in itertools.product([False, True], repeat=4) if c[0] or not c[3]
]


@pytest.fixture(scope="module")
def decoders():
    """{(stack, return_intermediate): decoder}: one built layer per decoder configuration."""
    kwargs = dict(num_heads=4, hidden_dim=8, dropout=0.0)
    layers = {(False, False): tt.TransformerDecoderLayer(**kwargs)}
    for intermediate in (False, True):
        layers[True, intermediate] = tt.TransformerDecoder(
            2, return_intermediate=intermediate, **kwargs)
    for layer in layers.values():
        layer(X, MEM)
    return layers


@pytest.mark.parametrize("stack,cross,cache,intermediate", DECODER_COMBINATIONS)
def test_decoders_always_return_attention_output(decoders, stack, cross, cache, intermediate):
    layer = decoders[stack, intermediate]
    x, call = X, dict(return_cross_attention=cross, memory_mask=VALID)
    if cache:
        x = X[:, :1]
        call.update(cache=np.asarray(layer.empty_cache(B, T)), cache_index=2)
    t = x.shape[1]
    output = (2, B, t, D) if intermediate else (B, t, D)
    attention = ((2,) if stack else ()) + (B, 4, t, S) if cross else None
    for mode in MODES:  # one layer (built once) in each mode
        result = _run(mode, layer, (x, MEM), call)
        _assert_structure(result, output, attention, call["cache"].shape if cache else None)


def test_attention_output_keeps_its_structure_through_keras_tree():
    x = np.ones((2, 3), "float32")
    result = tt.AttentionOutput(x, None, x)
    assert keras.tree.flatten(result) == [x, x]  # None fields are not outputs
    again = keras.tree.map_structure(lambda t: t * 2, result)
    assert type(again) is tt.AttentionOutput and again.attention is None
    np.testing.assert_array_equal(again.cache, 2 * x)


@keras.saving.register_keras_serializable(package="test_layer_contract")
class ToyTranslator(keras.Model):
    """A subclassed model reading the decoder's ``output`` field."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = tt.TransformerEncoder(1, num_heads=2, hidden_dim=8, name="encoder")
        self.decoder = tt.TransformerDecoder(1, num_heads=2, hidden_dim=8, name="decoder")

    def call(self, inputs, training=None):
        x, memory = inputs
        memory = self.encoder(memory, training=training)
        return self.decoder(x, memory, use_causal_mask=True, training=training).output


@pytest.mark.parametrize("jit_compile", [False, True])
def test_subclassed_model_fits_and_reloads(jit_compile, tmp_path):
    model = ToyTranslator()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit_compile)
    before = np.asarray(model((X, MEM)))
    model.optimizer.build(model.trainable_variables)  # fit traces (XLA: compiles) its step once
    history = model.fit((X, MEM), X, epochs=2, batch_size=B, verbose=0)
    assert history.history["loss"][1] < history.history["loss"][0]
    after = np.asarray(model((X, MEM)))
    assert not np.allclose(before, after)
    if not jit_compile:  # the same save and load either way (XLA changes the train step only)
        return
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)((X, MEM)), after, atol=1e-6)
