"""NLLB-200 (``facebook/nllb-200-*`` as the Hugging Face Hub serves it), transformers'
``M2M100ForConditionalGeneration``, as a ``Seq2SeqTransformer``.

A folder holds ``config.json`` (``model_type`` ``m2m_100``), the weights
(``model.safetensors``, or ``pytorch_model.bin``, which needs torch),
``sentencepiece.bpe.model``, ``tokenizer_config.json`` and/or ``tokenizer.json`` (the ids of
the language codes) and usually ``generation_config.json``. `read_m2m100` turns it into the
model, its tokenizer (`nlp.text.nllb_tokenizer.NllbTokenizer`, for one language pair) and the
decoding settings that translate as ``generate`` does with ``forced_bos_token_id`` = the
target language.

What the model computes, as ``modeling_m2m_100.py`` does: pre-norm layers (``x +
f(LayerNorm(x))``) and a final LayerNorm after each stack (``norm_first=True``); token
embeddings times √d; fairseq's sinusoidal positions, sines then cosines with frequencies
``exp(-i · ln(10000) / (d/2 - 1))``, the first token at ``pad_token_id + 1`` = 2
(``position_layout="tensor2tensor"``, ``position_offset=2``; transformers counts positions
over the non-pad ids: the same for every real token of a right-padded batch); relu; LayerNorm
epsilon 1e-5; one embedding for source, target and output (``lm_head`` tied to ``shared``), no
logits bias; decoding from ``</s>``, the target language forced first. A config field that
changes any of this and is not implemented is refused by name and file; bookkeeping is
accepted (`nlp.pretrained.hf_config.check_fields`).

One difference remains, at a sentence's length limit (source length + ``extra_length`` tokens
here, ``max_length`` there): the search's last step may only give ``</s>``, at
log-probability 0, which is transformers' ``forced_eos_token_id`` = ``</s>``; NLLB's
``generation_config.json`` sets none, and transformers then cuts a hypothesis at its limit
without ``</s>``. Where no hypothesis reaches the limit, the two translate alike.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from nlp.modeling.model import Seq2SeqTransformer
from nlp.pretrained.hf_config import GENERATION_READ, WEIGHT_FILES, check_fields, read_weights
from nlp.pretrained.marian import ACTIVATIONS
from nlp.search.decoding import DecodingSettings
from tfx_transformer.hf_files import read_json

__all__ = ["MODEL_FIELDS", "m2m100_settings", "read_m2m100", "set_weights"]

# Every field modeling_m2m_100.py reads from its config, and tie_word_embeddings (read by
# PreTrainedModel): each is read below or has its one value (tests check the set against the
# installed source).
MODEL_FIELDS = {"activation_dropout", "activation_function", "attention_dropout", "d_model",
                "decoder_attention_heads", "decoder_ffn_dim", "decoder_layerdrop",
                "decoder_layers", "decoder_start_token_id", "dropout",
                "encoder_attention_heads", "encoder_ffn_dim", "encoder_layerdrop",
                "encoder_layers", "max_position_embeddings", "pad_token_id", "scale_embedding",
                "vocab_size", "tie_word_embeddings", "is_encoder_decoder", "is_decoder"}
# Model fields with the one value implemented here (LayerDrop would skip layers while
# fine-tuning; an untied lm_head has no place here), and fields of BART-family configs that
# M2M100 does not read but that, set otherwise, describe another model.
_FIXED = {"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "tie_word_embeddings": True,
          "is_encoder_decoder": True, "is_decoder": False, "normalize_before": True,
          "add_final_layer_norm": True, "normalize_embedding": False, "add_bias_logits": False,
          "static_position_embeddings": True}
_READ = (MODEL_FIELDS - set(_FIXED)) | GENERATION_READ


def _check_folder(folder: str) -> None:
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: not a directory (an NLLB / M2M100 model folder is "
                         "expected)")
    from nlp.text.nllb_tokenizer import SPM_FILE  # TensorFlow: only once a folder is read

    names = set(os.listdir(folder))
    for name in ("config.json", SPM_FILE):
        if name not in names:
            raise ValueError(f"{folder}: no {name} (an NLLB folder has config.json, "
                             f"model.safetensors, {SPM_FILE}, tokenizer_config.json)")
    if not names & set(WEIGHT_FILES):
        raise ValueError(f"{folder}: no weights: neither {' nor '.join(WEIGHT_FILES)}")


def m2m100_settings(config: dict, generation: dict) -> tuple[dict, DecodingSettings]:
    """``Seq2SeqTransformer`` arguments and decoding settings (no forced first token yet) of an
    M2M100 ``config.json`` (``generation``: its ``generation_config.json``, whose fields win).

    Raises:
        ValueError: a field this conversion does not implement, or a value it does not
            support; the message names the file and the field.
    """
    if config.get("model_type") != "m2m_100":
        raise ValueError(f"config.json: model_type {config.get('model_type')!r} is not "
                         "'m2m_100'")
    check_fields(config, generation, MODEL_FIELDS, _FIXED, _READ)
    merged = {**config, **generation}
    get = merged.get

    def file_of(field):
        return "generation_config.json" if field in generation else "config.json"

    activation = get("activation_function", "relu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"config.json: activation_function {activation!r} is not supported "
                         f"(one of {sorted(ACTIVATIONS)})")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(a) != get(b):
            raise ValueError(f"config.json: {a}={get(a)} and {b}={get(b)} differ; one value "
                             "for both stacks is supported")
    eos, pad = get("eos_token_id", 2), get("pad_token_id", 1)
    if isinstance(eos, list):
        if len(eos) != 1:
            raise ValueError(f"{file_of('eos_token_id')}: eos_token_id={eos!r}: one end id is "
                             "supported")
        eos = eos[0]
    forced = get("forced_eos_token_id", eos)
    if forced not in (None, eos, [eos]):
        raise ValueError(f"{file_of('forced_eos_token_id')}: forced_eos_token_id={forced!r} "
                         f"differs from eos_token_id={eos}: not supported")
    start = get("decoder_start_token_id", eos)
    bad = get("bad_words_ids") or []
    if any(len(ids) != 1 for ids in bad):
        raise ValueError(f"{file_of('bad_words_ids')}: bad_words_ids of more than one token "
                         "are not supported")
    banned = tuple(sorted({i for ids in bad for i in ids}))
    kwargs = dict(
        vocab_size=get("vocab_size"), num_encoder_layers=get("encoder_layers"),
        num_decoder_layers=get("decoder_layers"), d_model=get("d_model"),
        num_heads=get("encoder_attention_heads"), ffn_dim=get("encoder_ffn_dim"),
        dropout=float(get("dropout", 0.1)), attention_dropout=float(get("attention_dropout", 0.1)),
        activation_dropout=float(get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[activation], layer_norm_epsilon=1e-5,
        max_positions=get("max_position_embeddings", 1024), position_layout="tensor2tensor",
        position_offset=pad + 1, scale_embedding=bool(get("scale_embedding", True)),
        norm_first=True, tie_embeddings=True, pad_id=pad, decoder_start_id=start, eos_id=eos,
        banned_ids=banned)
    decoding = DecodingSettings(beam_size=int(get("num_beams") or 4),
                                length_penalty=float(get("length_penalty", 1.0)),
                                convention="transformers",
                                renormalize=bool(get("renormalize_logits", False)))
    return kwargs, decoding


def _added_tokens(folder: str, config: dict) -> dict[int, str]:
    """The added tokens of an NLLB folder past the four specials (id → token: the language
    codes and ``<mask>``), from tokenizer_config.json or tokenizer.json."""
    path = os.path.join(folder, "tokenizer_config.json")
    settings = read_json(path) if os.path.isfile(path) else {}
    for file, name in ((path, settings.get("tokenizer_class")),
                       ("config.json", config.get("tokenizer_class"))):
        if name not in (None, "NllbTokenizer", "NllbTokenizerFast"):
            raise ValueError(f"{file}: tokenizer_class {name!r} is not supported (only "
                             "NllbTokenizer: sentencepiece.bpe.model, codes such as eng_Latn)")
    if settings.get("legacy_behaviour"):
        raise ValueError(f"{path}: legacy_behaviour=true (the language code after </s>) is "
                         "not supported")
    found = {path: [(i, e.get("content") if isinstance(e, dict) else e)
                    for i, e in (settings.get("added_tokens_decoder") or {}).items()]}
    json_path = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(json_path):
        found[json_path] = [(t.get("id"), t.get("content")) for t in
                            read_json(json_path).get("added_tokens") or [] if isinstance(t, dict)]
    try:
        found = {source: {int(i): str(t) for i, t in entries}
                 for source, entries in found.items() if entries}
    except (TypeError, ValueError):
        raise ValueError(f"{folder}: added tokens without integer ids") from None
    if not found:
        raise ValueError(f"{folder}: the language codes' ids are in neither "
                         "tokenizer_config.json's added_tokens_decoder nor tokenizer.json's "
                         "added_tokens")
    (first, added), *others = found.items()
    for other, tokens in others:
        if tokens != added:
            raise ValueError(f"{first} and {other} give the added tokens different ids")
    from nlp.text.nllb_tokenizer import SPECIAL_TOKENS

    for i, token in enumerate(SPECIAL_TOKENS):
        if added.get(i, token) != token:
            raise ValueError(f"{first}: id {i} is {added[i]!r}, not NLLB's {token!r}")
    return {i: t for i, t in added.items() if i >= len(SPECIAL_TOKENS)}


def _language(flag: str, lang: str | None, languages: list[str]) -> str:
    few = ", ".join([c for c in ("eng_Latn", "deu_Latn", "fra_Latn") if c in languages]
                    or languages[:3])
    if lang is None:
        raise ValueError(f"{flag} is required for an NLLB / M2M100 model: one of its "
                         f"{len(languages)} language codes, e.g. {few}")
    if lang not in languages:
        raise ValueError(f"{flag} {lang}: not a language code of this model (it has "
                         f"{len(languages)}, e.g. {few})")
    return lang


def set_weights(model: Seq2SeqTransformer, arrays: dict[str, np.ndarray]) -> None:
    """Copies transformers' ``M2M100ForConditionalGeneration`` weights into ``model``.

    Raises:
        ValueError: a weight is missing, has another shape, is left over (a part this model
            does not have), a tied copy differs, or a stored positional table is not the one
            the model computes.
    """
    arrays = {k[len("model."):] if k.startswith("model.") else k: v for k, v in arrays.items()}
    assignments, used = [], set()

    def take(name):
        if name not in arrays:
            raise ValueError(f"the weights have no {name}")
        used.add(name)
        return np.asarray(arrays[name], "float32")

    def put(variable, name, transpose=False, split=False):
        value = take(name).T if transpose else take(name)  # torch's Linear: (out, in)
        if split and value.size == math.prod(variable.shape):  # (.., d) -> (.., H, D)
            value = value.reshape(variable.shape)
        if tuple(variable.shape) != value.shape:
            raise ValueError(f"{name}: shape {value.shape} does not fit {variable.path} "
                             f"{tuple(variable.shape)}")
        assignments.append((variable, value))

    def attention(layer, prefix):
        for ours, theirs in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                             ("value_dense", "v_proj"), ("output_dense", "out_proj")):
            dense = getattr(layer, ours)
            put(dense.kernel, f"{prefix}.{theirs}.weight", transpose=True, split=True)
            put(dense.bias, f"{prefix}.{theirs}.bias", split=ours != "output_dense")

    def norm(layer, prefix):
        put(layer.gamma, f"{prefix}.weight")
        put(layer.beta, f"{prefix}.bias")

    def feedforward(layer, prefix):
        for ours, theirs in (("inner", "fc1"), ("outer", "fc2")):
            dense = getattr(layer.feedforward, ours)
            put(dense.kernel, f"{prefix}.{theirs}.weight", transpose=True)
            put(dense.bias, f"{prefix}.{theirs}.bias")
        norm(layer.feedforward_norm, f"{prefix}.final_layer_norm")

    for stack, name in ((model.encoder, "encoder"), (model.decoder, "decoder")):
        for i, layer in enumerate(stack.layers):
            prefix = f"{name}.layers.{i}"
            attention(layer.self_attention, f"{prefix}.self_attn")
            norm(layer.self_attention_norm, f"{prefix}.self_attn_layer_norm")
            if name == "decoder":
                attention(layer.cross_attention, f"{prefix}.encoder_attn")
                norm(layer.cross_attention_norm, f"{prefix}.encoder_attn_layer_norm")
            feedforward(layer, prefix)
        norm(stack.norm, f"{name}.layer_norm")

    # One embedding, stored under one name (safetensors) or under each tied alias (.bin).
    names = [n for n in ("shared.weight", "encoder.embed_tokens.weight",
                         "decoder.embed_tokens.weight", "lm_head.weight") if n in arrays]
    if not names:
        raise ValueError("the weights have no shared.weight (nor a tied copy of it)")
    for name in names[1:]:
        if not np.array_equal(take(name), take(names[0])):
            raise ValueError(f"{name} differs from {names[0]}: an untied embedding or lm_head "
                             "is not supported")
    put(model.embedding.embeddings, names[0])
    for name in (n for n in arrays if n.endswith("embed_positions.weights")):
        _check_positions(model, name, take(name))
    left = sorted(set(arrays) - used)
    if left:
        raise ValueError(f"the weights hold {', '.join(left[:5])}"
                         f"{' ...' if len(left) > 5 else ''}: parts this conversion does not "
                         "have (refused rather than ignored)")
    for variable, value in assignments:
        variable.assign(value)


def _check_positions(model: Seq2SeqTransformer, name: str, table: np.ndarray) -> None:
    """A stored positional table (older checkpoints keep it) must be the one computed."""
    import keras

    rows = min(len(table), model.max_positions + model.position_offset) - model.position_offset
    ours = keras.ops.convert_to_numpy(model.positions(keras.ops.zeros((1, rows, model.d_model))))
    stored = table[model.position_offset:model.position_offset + rows]
    if table.shape[-1] != model.d_model or np.abs(stored - ours[0]).max() > 1e-4:
        raise ValueError(f"{name} is not the sinusoidal table M2M100 computes; learned "
                         "positions are not supported")


def read_m2m100(folder: str | os.PathLike, source_lang: str | None = None,
                target_lang: str | None = None, log=print):
    """An NLLB / M2M100 folder, for one language pair, as ``(model, tokenizer, decoding)``.

    Args:
        folder: the model folder.
        source_lang, target_lang: language codes of its tokenizer (``eng_Latn``...): the
            sources' and the translations' (forced as their first token).
        log: where the notes and the one-line summary go.

    Raises:
        ValueError: a missing or unreadable file, a field not implemented, weights that do
            not fit, a language missing or unknown; the message names the file, field or
            flag (``--source-lang``, ``--target-lang``).
    """
    folder = os.fspath(folder)
    _check_folder(folder)
    config = read_json(os.path.join(folder, "config.json"))
    generation_path = os.path.join(folder, "generation_config.json")
    generation = read_json(generation_path) if os.path.isfile(generation_path) else {}
    kwargs, decoding = m2m100_settings(config, generation)
    from nlp.text.nllb_tokenizer import SPM_FILE, NllbTokenizer

    with open(os.path.join(folder, SPM_FILE), "rb") as f:
        proto = f.read()
    added = _added_tokens(folder, config)
    languages = [t for _, t in sorted(added.items()) if t != "<mask>"]
    source_lang = _language("--source-lang", source_lang, languages)
    target_lang = _language("--target-lang", target_lang, languages)
    try:
        tokenizer = NllbTokenizer(proto, added, source_lang, target_lang, kwargs["vocab_size"])
    except ValueError as error:
        raise ValueError(f"{folder}: {error} (config.json's vocab_size, "
                         f"{SPM_FILE}, the added tokens)") from None
    for field, key, ours in (("pad_token_id", "pad_id", tokenizer.pad_id),
                             ("eos_token_id", "eos_id", tokenizer.eos_id),
                             ("decoder_start_token_id", "decoder_start_id", tokenizer.bos_id)):
        if kwargs[key] != ours:
            raise ValueError(f"config.json: {field}={kwargs[key]} is not NLLB's {ours}")
    merged = {**config, **generation}
    forced = merged.get("forced_bos_token_id")
    if forced is not None and forced != tokenizer.target_lang_id:
        log(f"note: the folder forces {tokenizer.id_to_piece(forced)!r} as the first token; "
            f"--target-lang {target_lang} is forced instead")
    if merged.get("num_beams") is None:
        log("note: the folder sets no num_beams: the export searches with a beam of 4 "
            "(transformers' generate would search greedily)")
    decoding = dataclasses.replace(decoding, forced_bos_id=tokenizer.target_lang_id)
    model = Seq2SeqTransformer(**kwargs)
    set_weights(model, read_weights(folder))
    params = model.count_params()
    log(f"read {folder}: M2M100 {kwargs['num_encoder_layers']}+{kwargs['num_decoder_layers']} "
        f"layers, d {kwargs['d_model']}, {kwargs['activation']}, vocabulary "
        f"{kwargs['vocab_size']}, {len(languages)} languages ({source_lang} -> {target_lang}), "
        f"{params:,} parameters ({math.ceil(params * 4 / 2**20)} MiB)")
    return model, tokenizer, decoding
