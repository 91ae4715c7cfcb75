"""The field sets of published OPUS-MT config.json files, for `reference_marian.py`'s
variants: each variant's config.json holds a published release's fields with the small model's
values (`release_config`)."""

# The field sets of published config.json files (their values here: the small model's), so
# that the converter reads what users bring, not only what save_pretrained writes:
# - en-de: Helsinki-NLP/opus-mt-en-de as the Hub serves it (written by transformers 4.x: the
#   BART-era fields, _num_labels, classif_dropout, label maps, generation defaults
#   bad_words_ids / max_length / num_beams in config.json);
# - en-vi: Helsinki-NLP/opus-mt-en-vi re-saved by transformers 5.x (extra_pos_embeddings,
#   dtype, classifier_dropout, is_decoder);
# - tc-big: Helsinki-NLP/opus-mt-tc-big-* (relu, 16 heads, 1024 positions, eos not 0,
#   torch_dtype float16, no BART-era fields);
# - tatoeba-separate: a Tatoeba model with separate vocabularies
#   (share_encoder_decoder_embeddings false, decoder_vocab_size);
# - fine-tune: what MarianMTModel.save_pretrained writes for a model built from its config, as
#   a fine-tuning script does (generation_config.json with _from_model_config).
LABELS = {"id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
          "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}}
EN_DE = ["_name_or_path", "_num_labels", "activation_dropout", "activation_function",
         "add_bias_logits", "add_final_layer_norm", "architectures", "attention_dropout",
         "bad_words_ids", "bos_token_id", "classif_dropout", "classifier_dropout", "d_model",
         "decoder_attention_heads", "decoder_ffn_dim", "decoder_layerdrop", "decoder_layers",
         "decoder_start_token_id", "decoder_vocab_size", "dropout", "encoder_attention_heads",
         "encoder_ffn_dim", "encoder_layerdrop", "encoder_layers", "eos_token_id",
         "forced_eos_token_id", "gradient_checkpointing", "id2label", "init_std",
         "is_encoder_decoder", "label2id", "max_length", "max_position_embeddings",
         "model_type", "normalize_before", "normalize_embedding", "num_beams",
         "num_hidden_layers", "pad_token_id", "scale_embedding",
         "share_encoder_decoder_embeddings", "static_position_embeddings",
         "transformers_version", "use_cache", "vocab_size"]
EN_VI = ["activation_dropout", "activation_function", "add_bias_logits", "add_final_layer_norm",
         "architectures", "attention_dropout", "bos_token_id", "classif_dropout",
         "classifier_dropout", "d_model", "decoder_attention_heads", "decoder_ffn_dim",
         "decoder_layerdrop", "decoder_layers", "decoder_start_token_id", "decoder_vocab_size",
         "dropout", "dtype", "encoder_attention_heads", "encoder_ffn_dim", "encoder_layerdrop",
         "encoder_layers", "eos_token_id", "extra_pos_embeddings", "id2label", "init_std",
         "is_decoder", "is_encoder_decoder", "label2id", "max_position_embeddings",
         "model_type", "normalize_before", "normalize_embedding", "num_hidden_layers",
         "pad_token_id", "scale_embedding", "share_encoder_decoder_embeddings",
         "static_position_embeddings", "tie_word_embeddings", "transformers_version",
         "use_cache", "vocab_size"]
TC_BIG = ["activation_dropout", "activation_function", "architectures", "attention_dropout",
          "bad_words_ids", "bos_token_id", "classifier_dropout", "d_model",
          "decoder_attention_heads", "decoder_ffn_dim", "decoder_layerdrop", "decoder_layers",
          "decoder_start_token_id", "decoder_vocab_size", "dropout", "encoder_attention_heads",
          "encoder_ffn_dim", "encoder_layerdrop", "encoder_layers", "eos_token_id",
          "forced_eos_token_id", "init_std", "is_encoder_decoder", "max_length",
          "max_position_embeddings", "model_type", "normalize_embedding", "num_beams",
          "num_hidden_layers", "pad_token_id", "scale_embedding",
          "share_encoder_decoder_embeddings", "static_position_embeddings", "torch_dtype",
          "transformers_version", "use_cache", "vocab_size"]
VARIANTS = {"shared": ("en-de", "en-vi", "fine-tune"), "separate": ("tatoeba-separate",),
            "tcbig": ("tc-big",)}


def release_config(name: str, config) -> dict:
    """config.json of the release ``name`` for the small model of ``config``."""
    c = config
    value = {
        "_name_or_path": "Helsinki-NLP/opus-mt-en-de", "_num_labels": 3,
        "activation_dropout": c.activation_dropout, "activation_function": c.activation_function,
        "add_bias_logits": False, "add_final_layer_norm": False,
        "architectures": ["MarianMTModel"], "attention_dropout": c.attention_dropout,
        "bad_words_ids": [[c.pad_token_id]], "bos_token_id": 0, "classif_dropout": 0.0,
        "classifier_dropout": 0.0, "d_model": c.d_model,
        "decoder_attention_heads": c.decoder_attention_heads,
        "decoder_ffn_dim": c.decoder_ffn_dim, "decoder_layerdrop": 0.0,
        "decoder_layers": c.decoder_layers, "decoder_start_token_id": c.decoder_start_token_id,
        "decoder_vocab_size": c.decoder_vocab_size, "dropout": c.dropout, "dtype": "float32",
        "encoder_attention_heads": c.encoder_attention_heads,
        "encoder_ffn_dim": c.encoder_ffn_dim, "encoder_layerdrop": 0.0,
        "encoder_layers": c.encoder_layers, "eos_token_id": c.eos_token_id,
        "extra_pos_embeddings": c.vocab_size, "forced_eos_token_id": c.eos_token_id,
        "gradient_checkpointing": False, "init_std": 0.02, "is_decoder": False,
        "is_encoder_decoder": True, "max_length": 512,
        "max_position_embeddings": c.max_position_embeddings, "model_type": "marian",
        "normalize_before": False, "normalize_embedding": False, "num_beams": 4,
        "num_hidden_layers": c.encoder_layers, "pad_token_id": c.pad_token_id,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": c.share_encoder_decoder_embeddings,
        "static_position_embeddings": True, "tie_word_embeddings": True,
        "torch_dtype": "float16", "use_cache": True, "vocab_size": c.vocab_size, **LABELS}
    fields, version = {"en-de": (EN_DE, "4.22.0.dev0"), "en-vi": (EN_VI, "5.1.0"),
                       "tc-big": (TC_BIG, "4.18.0.dev0"),
                       "tatoeba-separate": (EN_DE, "4.22.0.dev0")}[name]
    value["transformers_version"] = version
    return {k: value[k] for k in fields}
