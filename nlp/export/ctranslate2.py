"""A translator as a CTranslate2 model directory (``tfx-export --format ctranslate2``).

`write` reads a finished training work directory or a converted OPUS-MT model directory
(``model.keras``, its tokenizer files and ``export/translator.json``) and writes, through
CTranslate2's spec API (``ctranslate2.specs.TransformerSpec``), a directory that
``ctranslate2.Translator`` loads, with this model's exact layout:

* post-norm layers (``pre_norm=False``; a pre-norm model such as NLLB keeps its final
  LayerNorms);
* the model's own positional table, stored whole (``position_encodings.encodings``): the
  paper's interleaved sines and cosines, Marian's "concat" layout or M2M100's, row 0 being
  the model's first position (0; NLLB: 2);
* every LayerNorm's epsilon (``layer_norm_epsilon`` in its config), the embedding scale
  (√d or 1), the FFN activation;
* one embedding for source, target and output, or separate ones (the output tied to the
  target embedding, or its own projection), and Marian's ``final_logits_bias``;
* the special tokens: unk, eos, and the decoder start (bos; Marian: pad, whose embedding row
  is kept, so the decoder starts from it as the Keras model does);
* float32 weights, or int8 (``quantization="int8"``).

Beside ``model.bin`` and the vocabularies it copies the SentencePiece model(s) and writes
``settings.json`` (`SETTINGS_FILE`): the export's beam size, length penalty, length limit
and convention, and the tokenizer's kind; `nlp.export.ctranslate2_runtime` reads it to translate. An
NLLB model's vocabulary is its fairseq ids (language codes included, ``madeupwordN`` for rows
without a token), and ``settings.json`` names its ``source_lang`` (the first source token)
and ``target_lang`` (CTranslate2's ``target_prefix``, as its own M2M100 converter expects).
What CTranslate2 cannot hold is refused by name (`ValueError`).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

__all__ = ["PATIENCE", "PRECISIONS", "SETTINGS_FILE", "model_spec", "write"]

SETTINGS_FILE = "settings.json"
# float16 needs a CPU (or GPU) with float16 kernels; `write` checks this machine.
PRECISIONS = {"float32": "float32", "int8": "int8", "float16": "float16"}
# Keras activation names → CTranslate2's (the same functions: Keras's gelu is the exact one).
_ACTIVATIONS = {"relu": "RELU", "silu": "SWISH", "swish": "SWISH", "gelu": "GELU",
                "tanh": "Tanh", "sigmoid": "Sigmoid"}
_MARIAN_SPM = ("source.spm", "target.spm")
# CTranslate2's beam patience per convention (`nlp.export.ctranslate2_runtime`): it stops a sentence
# after beam_size * patience finished hypotheses, where ours searches on while a live one may
# still win. GNMT, on a trained tiny model (experiments/README.md): 2 gave the SavedModel's
# translation for all 500 held-out sentences, 1 for 99.2 %. Transformers' rule searches
# longer still: on the random test model 2 missed a longer hypothesis, 4 did not.
PATIENCE = {"gnmt": 2.0, "transformers": 4.0}


def _numpy(variable) -> np.ndarray:
    return np.asarray(variable.numpy(), dtype=np.float32)


def _linear(spec, dense) -> None:
    """A Keras kernel ``(in, out)`` → CTranslate2's ``(out, in)`` weight, and the bias."""
    spec.weight = np.ascontiguousarray(_numpy(dense.kernel).T)
    if dense.bias is not None:
        spec.bias = _numpy(dense.bias).reshape(-1)


def _norm(spec, layer) -> None:
    spec.gamma = _numpy(layer.gamma)
    spec.beta = _numpy(layer.beta)


def _attention(spec, layer, self_attention: bool) -> None:
    """Our query/key/value ``(d, H, Dh)`` kernels → CTranslate2's fused ``linear`` list."""
    parts = [layer.query_dense, layer.key_dense, layer.value_dense]
    kernels = [_numpy(p.kernel) for p in parts]  # (d, H, Dh) each
    weights = [k.reshape(k.shape[0], -1).T for k in kernels]  # (H * Dh, d): CTranslate2's
    biases = [np.zeros(w.shape[0], np.float32) if p.bias is None else _numpy(p.bias).reshape(-1)
              for p, w in zip(parts, weights)]
    groups = [(0, 3)] if self_attention else [(0, 1), (1, 3)]
    for linear, (a, b) in zip(spec.linear, groups):
        linear.weight = np.ascontiguousarray(np.concatenate(weights[a:b]))
        linear.bias = np.concatenate(biases[a:b])
    out = _numpy(layer.output_dense.kernel)  # (H, Dh, d)
    spec.linear[-1].weight = np.ascontiguousarray(out.reshape(-1, out.shape[-1]).T)
    spec.linear[-1].bias = _numpy(layer.output_dense.bias)


def _check(model) -> str:
    """The CTranslate2 activation name of ``model``; refuses what CTranslate2 cannot hold."""
    from nlp.modeling.model import Seq2SeqTransformer

    if not isinstance(model, Seq2SeqTransformer):
        raise ValueError(f"model.keras holds a {type(model).__name__}, not a translator "
                         "(Seq2SeqTransformer)")
    activation = model.activation if isinstance(model.activation, str) else None
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation {model.activation!r}: CTranslate2 has none of that name "
                         f"(it holds {', '.join(sorted(_ACTIVATIONS))})")
    attention = model.encoder.layers[0].self_attention
    if attention.key_dim * model.num_heads != model.d_model \
            or attention.value_dim * model.num_heads != model.d_model:
        raise ValueError(f"attention heads of width {attention.key_dim} x {model.num_heads} "
                         f"heads != d_model {model.d_model}: CTranslate2 needs d/heads")
    return _ACTIVATIONS[activation]


def model_spec(model, source_tokens: list[str], target_tokens: list[str], start_token: str,
               eos_token: str, unk_token: str):
    """The ``ctranslate2.specs.TransformerSpec`` of a ``Seq2SeqTransformer`` (float32).

    Args:
        model: the ``Seq2SeqTransformer``.
        source_tokens, target_tokens: the vocabularies, token ``i`` for id ``i``.
        start_token, eos_token, unk_token: the decoder start, end and unknown tokens.

    Raises:
        ValueError: a setting CTranslate2 cannot hold, or vocabularies of another size.
    """
    import keras
    from ctranslate2.specs import common_spec, transformer_spec

    activation = getattr(common_spec.Activation, _check(model))
    for name, tokens, size in (("source", source_tokens, model.vocab_size),
                               ("target", target_tokens, model.target_vocab_size)):
        if len(tokens) != size:
            raise ValueError(f"the {name} vocabulary has {len(tokens)} tokens, the model "
                             f"{size} ids")
    pre_norm = bool(model.norm_first)
    encoder = transformer_spec.TransformerEncoderSpec(
        model.num_encoder_layers, model.num_heads, pre_norm=pre_norm, activation=activation,
        no_final_norm=model.encoder.norm is None)
    decoder = transformer_spec.TransformerDecoderSpec(
        model.num_decoder_layers, model.num_heads, pre_norm=pre_norm, activation=activation,
        no_final_norm=model.decoder.norm is None)
    d = model.d_model
    table = keras.ops.convert_to_numpy(model.positions(keras.ops.zeros((model.max_positions, d))))
    scale = float(np.sqrt(d)) if model.scale_embedding else 1.0
    target_embedding = model.target_embedding or model.embedding
    for stack_spec, stack, embedding in ((encoder, model.encoder, model.embedding),
                                         (decoder, model.decoder, target_embedding)):
        stack_spec.scale_embeddings = scale
        stack_spec.position_encodings.encodings = np.asarray(table, np.float32)
        (stack_spec.embeddings[0] if stack_spec is encoder else stack_spec.embeddings).weight = \
            _numpy(embedding.embeddings)
        if stack.norm is not None:
            _norm(stack_spec.layer_norm, stack.norm)
        for layer_spec, layer in zip(stack_spec.layer, stack.layers):
            _attention(layer_spec.self_attention, layer.self_attention, self_attention=True)
            _norm(layer_spec.self_attention.layer_norm, layer.self_attention_norm)
            if stack_spec is decoder:
                _attention(layer_spec.attention, layer.cross_attention, self_attention=False)
                _norm(layer_spec.attention.layer_norm, layer.cross_attention_norm)
            _linear(layer_spec.ffn.linear_0, layer.feedforward.inner)
            _linear(layer_spec.ffn.linear_1, layer.feedforward.outer)
            _norm(layer_spec.ffn.layer_norm, layer.feedforward_norm)
    if model.output_projection is not None:
        _linear(decoder.projection, model.output_projection)
    else:
        tied = model.target_embedding if model.tie_output else model.embedding
        decoder.projection.weight = _numpy(tied.embeddings)
        if model.logits_bias is not None:
            decoder.projection.bias = _numpy(model.logits_bias)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    spec.config.unk_token, spec.config.eos_token = unk_token, eos_token
    spec.config.bos_token = spec.config.decoder_start_token = start_token
    spec.register_source_vocabulary(list(source_tokens))
    spec.register_target_vocabulary(list(target_tokens))
    return spec


def _vocabularies(directory: pathlib.Path) -> tuple[list[str], list[str], str]:
    """Source and target tokens (id order) of the tokenizer in ``directory``, and its kind."""
    from nlp.text.marian_tokenizer import MARIAN_FILES, TARGET_VOCAB
    from nlp.text.nllb_tokenizer import INFO_FILE as NLLB_INFO
    from nlp.text.nllb_tokenizer import NllbTokenizer
    from nlp.text.tokenizer import TOKENIZER_FILE

    if (directory / TOKENIZER_FILE).is_file():
        import sentencepiece as spm

        processor = spm.SentencePieceProcessor(model_file=str(directory / TOKENIZER_FILE))
        tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        return tokens, tokens, "sentencepiece"
    if all((directory / name).is_file() for name in MARIAN_FILES):
        vocabs = []
        for name in ("vocab.json", TARGET_VOCAB):
            path = directory / (name if (directory / name).is_file() else "vocab.json")
            vocab = json.loads(path.read_text(encoding="utf-8"))
            vocabs.append(sorted(vocab, key=vocab.get))
        return vocabs[0], vocabs[1], "marian"
    if (directory / NLLB_INFO).is_file():
        tokens = NllbTokenizer.from_directory(directory).tokens()
        return tokens, tokens, "nllb"
    raise ValueError(f"{directory}: no tokenizer ({TOKENIZER_FILE}, or {', '.join(MARIAN_FILES)})")


def _model_directory(model: pathlib.Path) -> pathlib.Path:
    """The directory holding ``model.keras``: ``model`` or, for ``DIR/export``, ``DIR``."""
    for directory in (model, model.parent):
        if (directory / "model.keras").is_file():
            return directory
    if (model / "classes.json").is_file():
        raise ValueError(f"{model}: a detector, not a translator (CTranslate2 takes translators)")
    raise ValueError(f"{model}: no model.keras (a finished translation work directory, a "
                     "tfx-convert-nmt directory or its export/ is expected)")


def _decoding(directory: pathlib.Path) -> dict:
    """The export's decoding settings (``export/translator.json``, else ``model.json``)."""
    info = directory / "export" / "translator.json"
    if info.is_file():
        values = json.loads(info.read_text(encoding="utf-8"))
    elif (directory / "model.json").is_file():
        values = json.loads((directory / "model.json").read_text(encoding="utf-8"))["decoding"]
    else:
        raise ValueError(f"{directory}: neither export/translator.json nor model.json says how "
                         "it decodes")
    defaults = {"convention": "gnmt", "renormalize": True}
    return {key: values.get(key, defaults.get(key)) for key in
            ("beam_size", "length_penalty", "extra_length", "convention", "renormalize")}


def _languages(directory: pathlib.Path, kind: str) -> dict:
    """An NLLB model's language pair: the source's first token and the target prefix."""
    if kind != "nllb":
        return {}
    from nlp.text.nllb_tokenizer import INFO_FILE

    info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    return {"source_lang": info["source_lang"], "target_lang": info["target_lang"]}


def _check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision}: CTranslate2 translators take float32 "
                         "and int8 (float16 where its CPU kernels have it)")
    if precision == "float16":
        import ctranslate2

        if "float16" not in ctranslate2.get_supported_compute_types("cpu"):
            raise ValueError("--precision float16: this CPU has no float16 kernels in "
                             "CTranslate2 (it runs float32 and int8 here)")
    return PRECISIONS[precision]


def write(model: pathlib.Path, out: pathlib.Path, precision: str,
          input_size: int | None) -> dict:
    """Writes the CTranslate2 model directory ``out`` of the translator ``model``.

    Args:
        model: a finished training work directory, a ``tfx-convert-nmt`` directory, or the
            ``export/`` of either.
        out: the directory to write (must not exist yet); written beside it and renamed into
            place at the end.
        precision: ``float32`` or ``int8`` (``float16`` where CTranslate2's CPU kernels
            have it).
        input_size: must be None (a translator takes sentences of any length).

    Returns:
        The settings written to ``out/settings.json``.

    Raises:
        ValueError: ``model`` is no translator, a precision or setting CTranslate2 cannot
            hold, or ``out`` exists.
    """
    model, out = pathlib.Path(model), pathlib.Path(out)
    quantization = _check_precision(precision)
    if input_size is not None:
        raise ValueError(f"--input-size {input_size}: a translator takes no input size")
    if out.exists():
        raise ValueError(f"{out}: already exists; choose a new directory")
    directory = _model_directory(model)
    source_tokens, target_tokens, kind = _vocabularies(directory)
    decoding = _decoding(directory)

    import keras

    import nlp  # noqa: F401  (registers the model class for load_model)
    from nlp.export.translator import SOURCE_LENGTH_MULTIPLE
    from nlp.text.special_ids import UNK_ID

    keras_model = keras.saving.load_model(directory / "model.keras", compile=False)
    _check(keras_model)
    special = {"start": target_tokens[keras_model.decoder_start_id],
               "eos": target_tokens[keras_model.eos_id],
               "unk": target_tokens[UNK_ID] if kind == "sentencepiece" else "<unk>",
               "source_eos": source_tokens[keras_model.eos_id] if kind == "sentencepiece"
               else "</s>",
               "banned": [target_tokens[i] for i in keras_model.banned_ids]}
    spec = model_spec(keras_model, source_tokens, target_tokens, special["start"],
                      special["eos"], special["unk"])
    patience = PATIENCE[decoding["convention"]]
    settings = {"format": "ctranslate2", "precision": precision, "tokenizer": kind,
                **decoding, "patience": patience, "special_tokens": special,
                **_languages(directory, kind),
                "max_source_length": keras_model.max_positions - decoding["extra_length"]
                - SOURCE_LENGTH_MULTIPLE,
                "source": str(directory.resolve())}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".ct2-", dir=out.parent))
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(str(tmp))
        names = {"marian": _MARIAN_SPM,
                 "nllb": ("sentencepiece.bpe.model", "nllb_tokenizer.json")}.get(
                     kind, ("tokenizer.model",))
        for name in names:
            shutil.copyfile(directory / name, tmp / name)
        with open(tmp / SETTINGS_FILE, "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2, ensure_ascii=False)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return settings
