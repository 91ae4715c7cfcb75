"""NMTConfig: presets, validation messages, decoding overrides, `model_kwargs` wiring."""

import dataclasses

import pytest

from nlp.config import PRESETS, NMTConfig, preset
from nlp.modeling.model import build_model
from nlp.search.decoding import DecodingSettings


def _expected_params(config: NMTConfig, vocab_size: int) -> int:
    """Parameter count of the paper's Transformer, written out from the config."""
    d, f, v = config.d_model, config.ffn_dim, vocab_size
    attention = 4 * d * d + 4 * d  # q, k, v, output kernels and biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    final_norms = 2 * norm if config.norm_first else 0  # encoder and decoder
    embeddings = v * d if config.tie_embeddings else 2 * v * d + d * v + v
    return (embeddings + config.num_encoder_layers * encoder_layer
            + config.num_decoder_layers * decoder_layer + final_norms)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_apply_their_overrides_to_the_defaults(name):
    config = preset(name)
    overrides = {"name": name, **PRESETS[name]}
    for field in dataclasses.fields(NMTConfig):
        want = overrides.get(field.name, getattr(NMTConfig(), field.name))
        assert getattr(config, field.name) == want, field.name
    assert preset(name, dropout=0.2).dropout == 0.2


@pytest.mark.parametrize("name, overrides", [
    ("tiny", {}),
    ("tiny", dict(tie_embeddings=False, norm_first=True, num_decoder_layers=1)),
    ("base", {}),
])
def test_build_model_follows_the_config(name, overrides):
    config = preset(name, **overrides)
    model = build_model(config, vocab_size=100)
    got = model.get_config()
    for key, value in config.model_kwargs().items():
        assert got[key] == (100 if key == "vocab_size" else value), key
    assert model.count_params() == _expected_params(config, 100)


def test_decoding_overrides_are_routed_into_decoding():
    config = preset("tiny", beam_size=2, extra_length=7, dropout=0.0)
    assert config.decoding == DecodingSettings(beam_size=2, length_penalty=0.6, extra_length=7)
    assert config.dropout == 0.0
    base = DecodingSettings(beam_size=5, length_penalty=1.0)
    config = preset("tiny", decoding=base, length_penalty=0.2)
    assert config.decoding == DecodingSettings(beam_size=5, length_penalty=0.2)
    assert preset("base") == NMTConfig()  # the defaults are the base model
    with pytest.raises(ValueError, match="preset"):
        preset("huge")
    with pytest.raises(ValueError, match="d_modle"):
        preset("tiny", d_modle=3)
    with pytest.raises(ValueError, match="extra_decode_length"):
        preset("tiny", extra_decode_length=3)  # the old name of `extra_length`


@pytest.mark.parametrize("field, value, message", [
    ("name", "", "`NMTConfig.name` must be a non-empty string. Received: name=''"),
    ("vocab_size", 4, "`NMTConfig.vocab_size` must be an integer >= 5. Received: vocab_size=4"),
    ("num_encoder_layers", 0, "`NMTConfig.num_encoder_layers` must be a positive integer. "
                              "Received: num_encoder_layers=0"),
    ("num_decoder_layers", 1.0, "num_decoder_layers=1.0"),
    ("d_model", "512", "`NMTConfig.d_model` must be a positive integer. Received: d_model='512'"),
    ("num_heads", -1, "num_heads=-1"),
    ("ffn_dim", True, "ffn_dim=True"),
    ("dropout", 1.0, "`NMTConfig.dropout` must be a number in [0, 1). Received: dropout=1.0"),
    ("activation_dropout", -0.5, "activation_dropout=-0.5"),
    ("label_smoothing", None, "label_smoothing=None"),
    ("max_length", 1, "`NMTConfig.max_length` must be an integer >= 2. Received: max_length=1"),
    ("max_positions", 0, "max_positions=0"),
    ("warmup_steps", 0, "warmup_steps=0"),
    ("lr_scale", 0.0, "`NMTConfig.lr_scale` must be a positive number. Received: lr_scale=0.0"),
    ("batch_tokens", 0, "batch_tokens=0"),
    ("norm_first", "yes", "`NMTConfig.norm_first` must be True or False. Received: "
                          "norm_first='yes'"),
    ("tie_embeddings", 1, "tie_embeddings=1"),
    ("d_model", 500, "`NMTConfig.d_model` must be even and divisible by `num_heads`. "
                     "Received: d_model=500, num_heads=8"),
    ("max_length", 4096, "`NMTConfig.max_length` must be <= `max_positions`. "
                         "Received: max_length=4096, max_positions=2048"),
])
def test_bad_values_name_the_field_and_the_value(field, value, message):
    with pytest.raises(ValueError) as info:
        NMTConfig(**{field: value})
    assert message in str(info.value)


def test_decoding_must_be_decoding_settings_and_is_validated():
    with pytest.raises(TypeError, match=r"`NMTConfig.decoding` must be a DecodingSettings"):
        NMTConfig(decoding={"beam_size": 4})
    with pytest.raises(ValueError, match=r"`DecodingSettings.beam_size`.*beam_size=0"):
        preset("tiny", beam_size=0)


def test_config_is_frozen():
    config = preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 64


def test_clip_norm_flag_clips_the_global_gradient_norm(monkeypatch, capsys):
    import nlp.commands.train as command
    from nlp.training.train import compile_model
    from tfx_transformer.replicas import GlobalClipAdam

    seen = {}
    monkeypatch.setattr(command, "train_nmt",
                        lambda data, workdir, config, run, **_: seen.update(config=config) or {})
    assert command.main(["--workdir", "unused", "--clip-norm", "0.5"]) == 0
    config = seen["config"]
    assert (config.clip_norm, preset("tiny").clip_norm) == (0.5, None)  # default: none
    model = build_model(preset("tiny", vocab_size=40, num_encoder_layers=1,
                               num_decoder_layers=1, clip_norm=0.5))
    compile_model(model, config, jit_compile=False)
    assert isinstance(model.optimizer, GlobalClipAdam)
    assert model.optimizer.global_clipnorm == 0.5
    with pytest.raises(SystemExit) as exit:
        command.main(["--workdir", "unused", "--clip-norm", "0"])
    assert exit.value.code == 2
    assert "error: argument --clip-norm: must be" in capsys.readouterr().err
