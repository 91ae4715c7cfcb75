"""The converter's rule for config fields, checked against transformers itself: every field
MarianMTModel's modeling code reads is read or held at its one value by `nlp.pretrained.marian`, and
every generation setting is read, has no effect on the tokens, or is held at
GenerationConfig's own default. A field outside these is bookkeeping (accepted), except in
generation_config.json, where an unknown field is refused naming that file."""

import importlib.util
import inspect
import re

import pytest

from nlp.pretrained import hf_config, marian

if not importlib.util.find_spec("transformers"):
    pytest.skip("transformers is not installed (make test installs it)", allow_module_level=True)


def test_every_field_marian_modeling_reads_is_read_or_fixed():
    from transformers.models.marian import modeling_marian

    source = inspect.getsource(modeling_marian)
    read = set(re.findall(r"config\.([a-z][a-z_0-9]*)", source))
    read -= {"hidden_size"}  # MarianConfig's attribute_map: d_model
    assert read, "no config field found: the pattern no longer fits the source"
    assert read <= marian.MODEL_FIELDS, sorted(read - marian.MODEL_FIELDS)
    assert marian.MODEL_FIELDS <= marian._READ | set(marian._FIXED)


def test_every_generation_setting_is_read_without_effect_or_at_transformers_default():
    from transformers import GenerationConfig

    fields = GenerationConfig().to_dict()
    known = (hf_config.GENERATION_READ | hf_config.GENERATION_NO_EFFECT
             | set(hf_config.GENERATION_DEFAULTS))
    assert set(fields) <= known, sorted(set(fields) - known)
    # What generate uses for a field left unset (None in the file).
    effective = {**fields, **GenerationConfig._get_default_generation_params()}
    for field, value in hf_config.GENERATION_DEFAULTS.items():
        got = effective.get(field)
        assert got == value or (got is None and value is False), field  # None: a switch off


@pytest.mark.parametrize("config, generation, message", [
    ({"normalize_before": True}, {}, "config.json: normalize_before=True is not supported"),
    ({"encoder_layerdrop": 0.1}, {}, "config.json: encoder_layerdrop=0.1 is not supported"),
    ({}, {"no_repeat_ngram_size": 3},
     "generation_config.json: no_repeat_ngram_size=3 changes the generation"),
    ({"do_sample": True}, {}, "config.json: do_sample=True changes the generation"),
    ({}, {"my_new_penalty": 2}, "generation_config.json: my_new_penalty=2 is a generation "
                                "setting this conversion does not know"),
])
def test_settings_that_change_the_computation_are_refused_naming_the_file(
        config, generation, message):
    base = {"model_type": "marian", "vocab_size": 10, "d_model": 8, "encoder_layers": 1,
            "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
            "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "pad_token_id": 9, "eos_token_id": 0}
    with pytest.raises(ValueError, match=re.escape(message)):
        marian.marian_settings({**base, **config}, generation)


def test_bookkeeping_is_accepted_and_changes_nothing():
    base = {"model_type": "marian", "vocab_size": 10, "d_model": 8, "encoder_layers": 1,
            "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
            "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "pad_token_id": 9, "eos_token_id": 0}
    bookkeeping = {"_num_labels": 3, "classif_dropout": 0.0, "extra_pos_embeddings": 10,
                   "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
                   "torch_dtype": "float16", "_name_or_path": "x", "some_future_note": 1}
    generation = {"_from_model_config": True, "transformers_version": "5.25.0",
                  "output_scores": True, "top_k": 50, "num_beams": 4}
    plain = marian.marian_settings(base, {"num_beams": 4})
    assert marian.marian_settings({**base, **bookkeeping}, generation) == plain
