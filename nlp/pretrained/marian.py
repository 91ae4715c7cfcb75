"""OPUS-MT's Marian models (``Helsinki-NLP/opus-mt-*`` as the Hugging Face Hub serves them) as
``Seq2SeqTransformer``s.

A folder holds ``config.json``, the weights (``model.safetensors``, or ``pytorch_model.bin``,
which needs torch), ``source.spm``, ``target.spm`` and ``vocab.json`` (plus
``target_vocab.json`` with separate vocabularies) and usually ``generation_config.json``.
`read_marian` turns it into the model, its tokenizer (`nlp.text.marian_tokenizer.MarianTokenizer`)
and the decoding settings that translate as transformers' ``generate`` does.

What a Marian model computes, as transformers' ``MarianMTModel`` does, and how it maps here:
post-norm encoder and decoder layers without a final LayerNorm (``norm_first=False``); the FFN
activation ``activation_function`` (``swish`` in OPUS-MT); sinusoidal positions from 0 with
the sines in the first half of each vector and the cosines in the second
(``position_layout="concat"``, frequencies ``1 / 10000^(2i/d)``); token embeddings times √d
(``scale_embedding``); LayerNorm epsilon 1e-5 (``torch.nn.LayerNorm``'s, which Marian uses;
its config has no field for it); one embedding matrix for source, target and output
(``share_encoder_decoder_embeddings``), or a source and a target one with the output tied to
the target one; ``final_logits_bias`` added to the logits (a buffer: not trained); decoding
from ``decoder_start_token_id`` (the pad id); sources end with ``</s>``; ``bad_words_ids``
(the pad id) never generated, and ``<unk>`` may be. A config field that changes any of this
and is not implemented here is refused by name.
"""

from __future__ import annotations

import math
import os

import numpy as np

from nlp.modeling.model import Seq2SeqTransformer
from nlp.pretrained.hf_config import GENERATION_READ, WEIGHT_FILES, check_fields, read_weights
from nlp.search.decoding import DecodingSettings
from tfx_transformer.hf_files import read_json

__all__ = ["ACTIVATIONS", "MODEL_FIELDS", "marian_settings", "read_marian", "set_weights"]

# transformers' activation names → Keras's (the same functions).
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu",
               "tanh": "tanh", "sigmoid": "sigmoid"}
# Every field modeling_marian.py reads from its config (plus tie_word_embeddings, read by
# PreTrainedModel): each is read below or has its one value
# (`nlp.pretrained.hf_config.check_fields`; tests/nlp/pretrained/test_marian_fields.py checks the
# set against the installed source).
MODEL_FIELDS = {"activation_dropout", "activation_function", "attention_dropout", "d_model",
                "decoder_attention_heads", "decoder_ffn_dim", "decoder_layerdrop",
                "decoder_layers", "decoder_start_token_id", "decoder_vocab_size", "dropout",
                "encoder_attention_heads", "encoder_ffn_dim", "encoder_layerdrop",
                "encoder_layers", "is_decoder", "is_encoder_decoder", "max_position_embeddings",
                "pad_token_id", "scale_embedding", "share_encoder_decoder_embeddings",
                "tie_word_embeddings", "vocab_size"}
# Model fields with the one value implemented here; and the fields of BART-era Marian configs
# that transformers' MarianMTModel no longer reads but that, set otherwise, say the model was
# trained as neither transformers nor this conversion computes it (pre-norm, a final
# LayerNorm, learned positions...).
_FIXED = {"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "is_decoder": False,
          "is_encoder_decoder": True, "normalize_before": False, "normalize_embedding": False,
          "add_final_layer_norm": False, "add_bias_logits": False,
          "static_position_embeddings": True}
_READ = (MODEL_FIELDS - set(_FIXED)) | GENERATION_READ


def _check_folder(folder: str) -> None:
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: not a directory (an OPUS-MT model folder is expected)")
    names = set(os.listdir(folder))
    if "source.spm" not in names and any(n.endswith(".bpe") or n.startswith("bpe")
                                         for n in names):
        found = sorted(n for n in names if n.endswith(".bpe") or n.startswith("bpe"))
        raise ValueError(f"{folder}: a BPE model ({', '.join(found)}), not SentencePiece; "
                         "only OPUS-MT models with source.spm and target.spm convert")
    from nlp.text.marian_tokenizer import MARIAN_FILES  # TensorFlow: only once a folder is read

    for name in ("config.json", *MARIAN_FILES):
        if name not in names:
            raise ValueError(f"{folder}: no {name} (an OPUS-MT folder has config.json, "
                             f"model.safetensors, {', '.join(MARIAN_FILES)})")
    if not any(name in names for name in WEIGHT_FILES):
        extra = " (tf_model.h5 is not read: take the folder's model.safetensors)" \
            if "tf_model.h5" in names else ""
        raise ValueError(f"{folder}: no weights: neither {' nor '.join(WEIGHT_FILES)}{extra}")


def marian_settings(config: dict, generation: dict) -> tuple[dict, DecodingSettings]:
    """``Seq2SeqTransformer`` arguments and decoding settings of a Marian ``config.json``
    (``generation``: its ``generation_config.json``, whose fields win).

    Raises:
        ValueError: a field this conversion does not implement, or a value it does not
            support; the message names the file and the field.
    """
    if config.get("model_type", "marian") != "marian":
        raise ValueError(f"config.json: model_type {config['model_type']!r} is not 'marian'")
    check_fields(config, generation, MODEL_FIELDS, _FIXED, _READ)
    merged = {**config, **generation}
    get = merged.get

    def file_of(field):
        return "generation_config.json" if field in generation else "config.json"

    activation = get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise ValueError(f"config.json: activation_function {activation!r} is not supported "
                         f"(one of {sorted(ACTIVATIONS)})")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        if get(a) != get(b):
            raise ValueError(f"config.json: {a}={get(a)} and {b}={get(b)} differ; one value "
                             "for both stacks is supported")
    eos, pad = get("eos_token_id", 0), get("pad_token_id")
    if isinstance(eos, list):
        if len(eos) != 1:
            raise ValueError(f"{file_of('eos_token_id')}: eos_token_id={eos!r}: one end id is "
                             "supported")
        eos = eos[0]
    forced = get("forced_eos_token_id", eos)
    if forced not in (eos, [eos]):
        raise ValueError(f"{file_of('forced_eos_token_id')}: forced_eos_token_id={forced!r} "
                         f"differs from eos_token_id={eos}: not supported")
    forced_bos = get("forced_bos_token_id")
    start = get("decoder_start_token_id", pad)
    banned = sorted({i for ids in (get("bad_words_ids") or []) for i in ids})
    if any(len(ids) != 1 for ids in (get("bad_words_ids") or [])):
        raise ValueError(f"{file_of('bad_words_ids')}: bad_words_ids of more than one token "
                         "are not supported")
    shared = bool(get("share_encoder_decoder_embeddings", True))
    tied = bool(get("tie_word_embeddings", True))
    vocab = get("vocab_size")
    target_vocab = vocab if shared else (get("decoder_vocab_size") or vocab)
    kwargs = dict(
        vocab_size=vocab, target_vocab_size=target_vocab,
        num_encoder_layers=get("encoder_layers"), num_decoder_layers=get("decoder_layers"),
        d_model=get("d_model"), num_heads=get("encoder_attention_heads"),
        ffn_dim=get("encoder_ffn_dim"), dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation_dropout=float(get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[activation], layer_norm_epsilon=1e-5,
        max_positions=get("max_position_embeddings", 512), position_layout="concat",
        scale_embedding=bool(get("scale_embedding", False)), norm_first=False,
        tie_embeddings=shared and tied, tie_output=tied and not shared, output_bias=True,
        pad_id=pad, decoder_start_id=start, eos_id=eos, banned_ids=tuple(banned))
    if not shared and not tied:
        kwargs["output_bias"] = False  # the Dense projection's bias holds final_logits_bias
    decoding = DecodingSettings(beam_size=int(get("num_beams") or 4),
                                length_penalty=float(get("length_penalty", 1.0)),
                                convention="transformers",
                                renormalize=bool(get("renormalize_logits", False)),
                                forced_bos_id=forced_bos)
    return kwargs, decoding


def _table(arrays: dict, *names: str) -> np.ndarray:
    for name in names:
        if name in arrays:
            return arrays[name]
    raise ValueError(f"the weights have none of {', '.join(names)}")


def set_weights(model: Seq2SeqTransformer, arrays: dict[str, np.ndarray]) -> None:
    """Copies transformers' ``MarianMTModel`` weights into ``model``.

    Raises:
        ValueError: a weight is missing or has another shape, or the stored positional
            table is not the sinusoidal one this model computes.
    """
    arrays = {k[len("model."):] if k.startswith("model.") else k: v for k, v in arrays.items()}
    d, heads = model.d_model, model.num_heads
    assignments = []

    def put(variable, value, name):
        value = np.asarray(value, "float32")
        if tuple(variable.shape) != value.shape:
            raise ValueError(f"{name}: shape {value.shape} does not fit {variable.path} "
                             f"{tuple(variable.shape)}")
        assignments.append((variable, value))

    def attention(layer, prefix):
        for ours, theirs in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                             ("value_dense", "v_proj")):
            dense = getattr(layer, ours)
            w = _table(arrays, f"{prefix}.{theirs}.weight")  # (out, in)
            put(dense.kernel, w.T.reshape(d, heads, d // heads), f"{prefix}.{theirs}.weight")
            put(dense.bias, _table(arrays, f"{prefix}.{theirs}.bias").reshape(heads, -1),
                f"{prefix}.{theirs}.bias")
        w = _table(arrays, f"{prefix}.out_proj.weight")
        put(layer.output_dense.kernel, w.T.reshape(heads, d // heads, d),
            f"{prefix}.out_proj.weight")
        put(layer.output_dense.bias, _table(arrays, f"{prefix}.out_proj.bias"),
            f"{prefix}.out_proj.bias")

    def norm(layer, prefix):
        put(layer.gamma, _table(arrays, f"{prefix}.weight"), f"{prefix}.weight")
        put(layer.beta, _table(arrays, f"{prefix}.bias"), f"{prefix}.bias")

    def feedforward(layer, prefix):
        for ours, theirs in (("inner", "fc1"), ("outer", "fc2")):
            dense = getattr(layer.feedforward, ours)
            put(dense.kernel, _table(arrays, f"{prefix}.{theirs}.weight").T,
                f"{prefix}.{theirs}.weight")
            put(dense.bias, _table(arrays, f"{prefix}.{theirs}.bias"), f"{prefix}.{theirs}.bias")
        norm(layer.feedforward_norm, f"{prefix}.final_layer_norm")

    for i, layer in enumerate(model.encoder.layers):
        prefix = f"encoder.layers.{i}"
        attention(layer.self_attention, f"{prefix}.self_attn")
        norm(layer.self_attention_norm, f"{prefix}.self_attn_layer_norm")
        feedforward(layer, prefix)
    for i, layer in enumerate(model.decoder.layers):
        prefix = f"decoder.layers.{i}"
        attention(layer.self_attention, f"{prefix}.self_attn")
        norm(layer.self_attention_norm, f"{prefix}.self_attn_layer_norm")
        attention(layer.cross_attention, f"{prefix}.encoder_attn")
        norm(layer.cross_attention_norm, f"{prefix}.encoder_attn_layer_norm")
        feedforward(layer, prefix)

    bias = _table(arrays, "final_logits_bias").reshape(-1)
    if model.tie_embeddings:
        put(model.embedding.embeddings,
            _table(arrays, "shared.weight", "encoder.embed_tokens.weight", "lm_head.weight"),
            "shared.weight")
    else:
        put(model.embedding.embeddings, _table(arrays, "encoder.embed_tokens.weight"),
            "encoder.embed_tokens.weight")
        put(model.target_embedding.embeddings,
            _table(arrays, "decoder.embed_tokens.weight", "lm_head.weight"),
            "decoder.embed_tokens.weight")
    if model.output_projection is not None:
        put(model.output_projection.kernel, _table(arrays, "lm_head.weight").T, "lm_head.weight")
        put(model.output_projection.bias, bias, "final_logits_bias")
    else:
        put(model.logits_bias, bias, "final_logits_bias")
    _check_positions(model, arrays)
    for variable, value in assignments:
        variable.assign(value)


def _check_positions(model: Seq2SeqTransformer, arrays: dict) -> None:
    """A stored positional table must be the sinusoidal one the model computes."""
    for name in ("encoder.embed_positions.weight", "decoder.embed_positions.weight"):
        if name not in arrays:
            continue  # transformers does not save them: they are computed
        table = np.asarray(arrays[name], "float64")
        n, d = table.shape
        angles = np.arange(n)[:, None] / np.power(10000.0, 2 * np.arange(d // 2) / d)[None]
        expected = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
        if np.abs(table - expected).max() > 1e-4 or d != model.d_model:
            raise ValueError(f"{name} is not the sinusoidal table (sines, then cosines) "
                             "that Marian models use; learned positions are not supported")


def read_marian(folder: str | os.PathLike, log=print):
    """An OPUS-MT folder as ``(model, tokenizer, decoding)``.

    Raises:
        ValueError: a missing or unreadable file, a field not implemented, weights that do
            not fit; the message names the file or field.
    """
    folder = os.fspath(folder)
    _check_folder(folder)
    config = read_json(os.path.join(folder, "config.json"))
    generation_path = os.path.join(folder, "generation_config.json")
    generation = read_json(generation_path) if os.path.isfile(generation_path) else {}
    generation = {k: v for k, v in generation.items() if k != "transformers_version"}
    kwargs, decoding = marian_settings(config, generation)
    from nlp.text.marian_tokenizer import MarianTokenizer

    tokenizer = MarianTokenizer.from_directory(folder)
    for side, ours, theirs in (("source", tokenizer.vocab_size, kwargs["vocab_size"]),
                               ("target", tokenizer.target_vocab_size,
                                kwargs["target_vocab_size"])):
        if ours != theirs:
            raise ValueError(f"{folder}: the {side} vocabulary has {ours} pieces but "
                             f"config.json says {theirs}")
    if kwargs["pad_id"] != tokenizer.pad_id or kwargs["eos_id"] != tokenizer.eos_id:
        raise ValueError(f"{folder}: config.json's pad/eos ids ({kwargs['pad_id']}, "
                         f"{kwargs['eos_id']}) are not the vocabulary's <pad> and </s> "
                         f"({tokenizer.pad_id}, {tokenizer.eos_id})")
    kwargs["source_pad_id"] = tokenizer.source_pad_id
    model = Seq2SeqTransformer(**kwargs)
    set_weights(model, read_weights(folder))
    params = model.count_params()
    log(f"read {folder}: Marian {kwargs['num_encoder_layers']}+{kwargs['num_decoder_layers']} "
        f"layers, d {kwargs['d_model']}, {kwargs['activation']}, vocabulary "
        f"{kwargs['vocab_size']}" + ("" if tokenizer.target_vocab is None else
                                     f" + {kwargs['target_vocab_size']}") +
        f", {params:,} parameters ({math.ceil(params * 4 / 2**20)} MiB)")
    return model, tokenizer, decoding
