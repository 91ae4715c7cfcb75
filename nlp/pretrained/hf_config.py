"""What the converters of transformers folders (`nlp.pretrained.marian`, `nlp.pretrained.m2m100`)
share: reading the folder's JSON files and weights, and the rule for config fields.

Which config fields are read, and which are only bookkeeping, is decided by what transformers
itself reads (tests/nlp/pretrained/test_marian_fields.py checks these sets against its installed
source and ``GenerationConfig``):

- the model fields (each converter's ``MODEL_FIELDS``: every field its modeling file reads):
  each is read or has its one value;
- generation fields (generation_config.json, or config.json in older releases):
  `GENERATION_READ` are read; the others must hold ``GenerationConfig``'s default, which
  changes nothing (`GENERATION_DEFAULTS`), or change nothing whatever their value
  (`GENERATION_NO_EFFECT`: what generate returns, not which tokens);
- every other field of config.json is bookkeeping that no computation reads (names, label
  maps, _num_labels, classif_dropout, extra_pos_embeddings, dtype...): accepted.

A field of generation_config.json that is none of these is refused: it is a generation setting
this conversion does not know.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["GENERATION_DEFAULTS", "GENERATION_NO_EFFECT", "GENERATION_READ", "WEIGHT_FILES",
           "check_fields", "read_weights"]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
GENERATION_READ = {"num_beams", "length_penalty", "max_length", "max_new_tokens",
                   "bad_words_ids", "forced_eos_token_id", "forced_bos_token_id",
                   "renormalize_logits", "decoder_start_token_id", "eos_token_id",
                   "pad_token_id", "bos_token_id"}
GENERATION_DEFAULTS = {
    "do_sample": False, "num_return_sequences": 1, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None,
    "early_stopping": False, "diversity_penalty": 0.0, "num_beam_groups": 1,
    "temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "min_p": None,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "penalty_alpha": None,
    "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "force_words_ids": None,
    "forced_decoder_ids": None, "remove_invalid_values": False, "guidance_scale": None,
    "max_time": None, "stop_strings": None, "constraints": None, "token_healing": False,
    "dola_layers": None, "watermarking_config": None, "top_h": None,
}
GENERATION_NO_EFFECT = {"_from_model_config", "transformers_version", "use_cache",
                        "output_scores", "output_logits", "output_attentions",
                        "output_hidden_states", "return_dict_in_generate",
                        "num_assistant_tokens", "num_assistant_tokens_schedule",
                        "assistant_confidence_threshold", "prompt_lookup_num_tokens",
                        "max_matching_ngram_size", "assistant_early_exit",
                        "assistant_lookbehind", "target_lookbehind", "cache_implementation",
                        "cache_config", "return_legacy_cache", "low_memory",
                        "compile_config", "disable_compile", "is_assistant",
                        "generation_kwargs", "trust_remote_code", "assistant_ensemble_weight",
                        "speculation_type", "use_mtp", "continuous_batching_config",
                        "max_cache_len", "prefill_chunk_size"}

def check_fields(config: dict, generation: dict, model_fields: set, fixed: dict,
                 read: set) -> None:
    """Refuses, by name and file, a field that would change what the model computes or
    generates and that this conversion neither reads (``read``) nor implements at its one
    value (``fixed``); accepts bookkeeping (see the comment above `MODEL_FIELDS`).

    Raises:
        ValueError: naming the file, the field and its value.
    """
    def refuse(file, field, value, why):
        raise ValueError(f"{file}: {field}={value!r} {why}")

    for file, fields in (("config.json", config), ("generation_config.json", generation)):
        for field, value in sorted(fields.items()):
            if field in fixed:
                if value is not None and value != fixed[field]:
                    refuse(file, field, value, f"is not supported (only {fixed[field]!r})")
            elif field in read or field in GENERATION_NO_EFFECT:
                continue
            elif field in GENERATION_DEFAULTS:  # None: unset, which is the default
                if value is not None and value != GENERATION_DEFAULTS[field]:
                    refuse(file, field, value, "changes the generation and is not implemented "
                           f"by this conversion (only {GENERATION_DEFAULTS[field]!r})")
            elif field in model_fields:
                refuse(file, field, value, "is not implemented by this conversion (refused "
                       "rather than ignored)")
            elif file == "generation_config.json" and not field.startswith("_"):
                refuse(file, field, value, "is a generation setting this conversion does not "
                       "know (refused rather than ignored)")


def read_weights(folder: str) -> dict[str, np.ndarray]:
    """The folder's weights by transformers' names (``model.safetensors``, else
    ``pytorch_model.bin`` read with torch)."""
    path = os.path.join(folder, "model.safetensors")
    if os.path.isfile(path):
        from safetensors.numpy import load_file

        try:
            return dict(load_file(path))
        except Exception as error:  # a truncated or foreign file
            raise ValueError(f"{path}: not readable safetensors ({error})") from None
    path = os.path.join(folder, "pytorch_model.bin")
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading a .bin needs torch (pip install torch), or take "
                         "the model's model.safetensors") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: not a readable PyTorch state dict ({error})") from None
    return {k: v.float().numpy() for k, v in state.items()}
