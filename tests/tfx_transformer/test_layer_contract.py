"""Every public layer passes the shared layer checks of ``tfx_transformer.testing``."""

import numpy as np
import pytest

import tfx_transformer as tt
from tfx_transformer.testing import check_layer

B, T, S, D = 2, 5, 7, 16
rng = np.random.default_rng(0)
X = rng.normal(size=(B, T, D)).astype("float32")
MEM = rng.normal(size=(B, S, D)).astype("float32")
POS = rng.normal(size=(B, S, D)).astype("float32")
VALID = np.array([[True] * 4 + [False] * 3, [True] * S])
PIXELS = np.ones((B, 4, 6), bool)
PIXELS[0, 3:, :] = False
PIXELS[0, :, 4:] = False

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


def test_check_layer_catches_a_broken_config():
    """The harness itself can fail: a layer whose get_config drops an argument."""

    class Broken(tt.FeedForward):
        def get_config(self):
            config = super().get_config()
            config["hidden_dim"] = 3
            return config

    with pytest.raises(AssertionError, match="hidden_dim"):
        check_layer(Broken, dict(hidden_dim=32), {"x": X})
