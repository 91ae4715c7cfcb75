"""An OPUS-MT-style MarianMTModel of random weights, saved as the Hub has it, and its outputs.

``python reference_marian.py FOLDER --config shared|separate`` writes into FOLDER what a
Helsinki-NLP/opus-mt-* folder holds (``FOLDER1 FOLDER2 --config shared --config separate``: both,
in one process): source.spm and target.spm (SentencePiece unigram models trained
here on generated English-/German-like text; default ids unk 0, <s> 1, </s> 2, no pad; nmt_nfkc;
character_coverage 0.995, so rare characters are unknown), vocab.json ("</s>" 0, "<unk>" 1, the
pieces in a shuffled order, "<pad>" last; 5 pieces of each spm model left out on purpose, so they
encode to <unk>; `shared`: the union of both models' pieces plus ">>fra<<" and ">>deu<<",
`separate`: the source pieces, with the target pieces in target_vocab.json, both of the same size as
OPUS-MT's converter requires), tokenizer_config.json, special_tokens_map.json, config.json +
model.safetensors (save_pretrained), generation_config.json (as the Hub's), and FOLDER/bin/: the
same with pytorch_model.bin (transformers v4's layout: the whole state_dict, every alias of the tied
embedding, less the two sinusoidal tables) instead of model.safetensors. `shared` is opus-mt-en-de's
config (6+6 layers, 8 heads, swish, shared and tied embeddings) at d_model 32, ffn 64; `separate`
has separate encoder/decoder embeddings (lm_head tied to the decoder's), 2+3 layers, 4 heads, relu;
`tcbig` is a Tatoeba tc-big's shape (relu, 16 heads, FFN 4 d, 1024 positions, eos not 0) at d_model
64 and 3+3 layers (tc-big has 6+6; shared checks that depth). Every weight is random,
final_logits_bias too (plus a bias on eos, for beams of varied lengths, and on pad, so that not
renormalizing after banning pad shows). FOLDER/expected.npz: input_ids, attention_mask,
encoder_output, decoder_input_ids, logits; FOLDER/expected.json: sentences, generate_batch,
greedy_batch (max_new_tokens), generate_single (extra_length; `separate` only: the folder the tests
export) and generate_single_decoded, generate_batch_decoded, tokenization, detokenization,
sacremoses_installed. Generated ids leave out the decoder start token and end at the first eos. Runs
in a process without TensorFlow, on one torch thread (two spin-wait on a loaded two-core machine),
in a few seconds.

What a converter must reproduce (transformers 5.x; file: function):
- modeling_marian.py MarianSinusoidalPositionalEmbedding.create_weight: table[p, j] = sin(p * w_j)
  for j < d/2 and cos(p * w_(j-d/2)) for j >= d/2, w_i = 10000 ** (-2i / d): not interleaved.
  Positions start at 0 in encoder and decoder (the decoder start token is position 0), no padding
  offset; the tables are never saved (MarianMTModel._keys_to_ignore_on_save).
- MarianEncoder/MarianDecoder.forward: token embeddings times sqrt(d_model) (scale_embedding), then
  + positions; no embedding LayerNorm, no final LayerNorm of either stack.
- MarianEncoderLayer/MarianDecoderLayer.forward: post-norm (x = LayerNorm(x + sublayer(x))),
  nn.LayerNorm's eps 1e-5; decoder order self-attention, cross-attention, FFN; "swish" is nn.SiLU.
- MarianAttention: q/k/v/out projections all with bias, q scaled by head_dim ** -0.5; padded source
  keys are masked, padded query rows are computed anyway (encoder_output holds them).
- MarianMTModel.forward: logits = lm_head(h) + final_logits_bias; lm_head has no bias and is the
  (tied) decoder embedding, not scaled. model.safetensors (v5) keeps one name per tied tensor
  (shared: model.shared.weight only; separate: model.encoder/decoder.embed_tokens.weight, no
  lm_head.weight); pytorch_model.bin has all aliases (model.shared,
  model.encoder/decoder.embed_tokens, lm_head). OPUS-MT's converter gives the <pad> row zeros and
  bias 0; here it is random.
- tokenization_marian.py MarianTokenizer._tokenize: remove_language_code, then the SOURCE spm's
  encode(out_type=str); _convert_token_to_id: a piece missing from vocab.json is <unk> (1), never
  its spm id; spm turns a run of characters it does not know into one piece (its surface text),
  hence one <unk>. build_inputs_with_special_tokens appends eos (0) only, no bos; padding is on the
  right with <pad> (V-1). "" encodes to [0].
- remove_language_code: a text starting with ">>" and containing "<<" gives its prefix up to "<<" as
  one token (vocab.json's id, or <unk>: ">>xyz<<", ">><<"), for shared and separate vocabs alike;
  the rest is spm-encoded with its own dummy prefix; only the first code, not after a space.
- tokenization_python.py PreTrainedTokenizer.tokenize: the special-token strings "</s>", "<unk>",
  "<pad>" in the text are split out (trie) and become their ids; the pieces between are encoded
  separately. (None of the recorded strings contains one.)
- MarianTokenizer.normalize (sacremoses' Moses punctuation normalizer) is never called when
  encoding or decoding: whether sacremoses is installed changes nothing (it is not, here).
- MarianTokenizer._decode: use_source_tokenizer defaults to `not separate_vocabs`: shared vocabs
  decode with the SOURCE spm (target-only pieces pass through verbatim), separate with target.spm
  and target_vocab.json. convert_tokens_to_string: skip_special_tokens drops eos, unk and pad ids
  alike; kept specials are written verbatim plus " "; other runs go through spm decode_pieces
  (pieces the spm does not know come back verbatim); then "▁" -> " " and strip(). Without
  specials this is "".join(pieces).replace("▁", " ").strip(). clean_up_tokenization_spaces is
  off (v5's default; older v4 releases defaulted to on).
- generation_config.json: bad_words_ids [[pad]], decoder_start_token_id pad, eos 0, forced_eos 0,
  max_length 512, num_beams 4, pad, bos 0, renormalize_logits true (added to the Hub's opus-mt
  configs after transformers PR #25459, Aug 2023, which replaced Marian's "pad logit = -inf before
  log_softmax" hack; read from the PR and a public copy of opus-mt-en-jap's, not from the Hub).
- generation/utils.py _get_logits_processor with it: NoBadWordsLogitsProcessor (pad -> -inf),
  ForcedEOSTokenLogitsProcessor (at cur_len == max_length - 1, max_length = 1 + max_new_tokens:
  everything -inf but eos 0), LogitNormalization (log_softmax again; last). _beam_search applies
  log_softmax BEFORE the processors, so with renormalization pad is as if masked before the
  softmax; without it the log-probs no longer sum to 1 and some beams here change. Score of a
  finished beam: sum of log-probs / (tokens generated, eos included, start token not) ** 1.0
  (length_penalty); early_stopping False; 2 * num_beams candidates a step, an eos candidate
  finishes only if among the top num_beams. Greedy (_sample): processors on the raw logits, argmax.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import sentencepiece
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_marian_releases import VARIANTS, release_config  # noqa: E402
from reference_marian_text import (  # noqa: E402
    SENTENCES,
    text_outputs,
    write_json,
    write_tokenizer,
)

SEED = 0
# The std of the random weights, and the bias added to final_logits_bias[eos], per config: sharp
# attention (large q/k), small value/output projections and small biases keep the random decoder
# from collapsing onto one token; the eos bias ends the beams at varied lengths.
SCALES = {"shared": {"embed": 0.12, "qk": 0.8, "vo": 0.1, "fc": 0.2, "eos": 2.15},
          "tcbig": {"embed": 0.07, "qk": 0.4, "vo": 0.12, "fc": 0.12, "eos": 1.6},
          "separate": {"embed": 0.15, "qk": 1.0, "vo": 0.1, "fc": 0.35, "eos": 1.3}}
PAD_BIAS = 4.0  # added to final_logits_bias[pad]: banning pad without renormalizing shows
M = 12  # max_new_tokens of the batch generations
M_UNBANNED = 6  # the fine-tune variant's (pad not banned, no renormalize_logits)
EXTRA = 50  # generate_single: max_new_tokens = source length (with eos) + EXTRA, the export's

def marian_config(config: str, vocab_size: int, decoder_vocab_size: int, eos: int = 0):
    """Helsinki-NLP/opus-mt-en-de's config.json, shrunk (d_model 32, ffn 64); ``tcbig``: a
    Tatoeba tc-big's (relu, 16 heads, FFN 4 d, 1024 positions, eos not 0) at d_model 64."""
    pad = vocab_size - 1  # OPUS-MT: one pad id, both vocabs have the same size
    shared = config != "separate"
    width = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=512)
    if config == "shared":
        layout = dict(encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                      decoder_attention_heads=8, activation_function="swish")
    elif config == "tcbig":  # tc-big has 6+6; 3+3 here (the layer count is shared's to check)
        layout = dict(encoder_layers=3, decoder_layers=3, encoder_attention_heads=16,
                      decoder_attention_heads=16, activation_function="relu")
        width = dict(d_model=64, encoder_ffn_dim=256, decoder_ffn_dim=256,
                     max_position_embeddings=1024)
    else:
        layout = dict(encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                      decoder_attention_heads=4, activation_function="relu")
    return transformers.MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=decoder_vocab_size, scale_embedding=True,
        share_encoder_decoder_embeddings=shared, tie_word_embeddings=True, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=eos, forced_eos_token_id=eos, bos_token_id=0,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, init_std=0.02,
        static_position_embeddings=True, normalize_embedding=False, normalize_before=False,
        add_final_layer_norm=False, add_bias_logits=False, architectures=["MarianMTModel"],
        **width, **layout)


def generation_config(pad: int, eos: int = 0) -> dict:
    """Helsinki-NLP/opus-mt-*'s generation_config.json (renormalize_logits: since PR #25459)."""
    return {"bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad,
            "eos_token_id": eos, "forced_eos_token_id": eos, "max_length": 512, "num_beams": 4,
            "pad_token_id": pad, "renormalize_logits": True}


def randomize(model, scales: dict) -> None:
    """Every parameter random (the sinusoidal tables excepted), final_logits_bias too."""
    with torch.no_grad():
        for name, param in model.named_parameters():  # each tied parameter once
            if "embed_positions" in name:
                continue
            if "layer_norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0.0, 0.05)
            elif "q_proj" in name or "k_proj" in name:
                param.normal_(0.0, scales["qk"])
            elif "v_proj" in name or "out_proj" in name:
                param.normal_(0.0, scales["vo"])
            elif "embed_tokens" in name or "shared" in name:
                param.normal_(0.0, scales["embed"])
            else:  # fc1, fc2
                param.normal_(0.0, scales["fc"])
        bias = model.final_logits_bias
        bias.normal_(0.0, 0.5)
        bias[0, model.config.eos_token_id] += scales["eos"]
        bias[0, model.config.decoder_start_token_id] += PAD_BIAS


def save_model(folder: str, model, pad: int, eos: int = 0) -> None:
    """model.safetensors, config.json, generation_config.json; bin/: v4's pytorch_model.bin."""
    model.save_pretrained(folder)
    write_json(f"{folder}/generation_config.json", generation_config(pad, eos))
    os.makedirs(f"{folder}/bin", exist_ok=True)
    # transformers v4's save_pretrained(safe_serialization=False): the whole state_dict, tied
    # aliases included (model.shared/encoder/decoder.embed_tokens, lm_head), less
    # _keys_to_ignore_on_save (the two sinusoidal tables).
    state = {k: v for k, v in model.state_dict().items() if "embed_positions" not in k}
    torch.save(state, f"{folder}/bin/pytorch_model.bin")
    for name in os.listdir(folder):
        if os.path.isfile(f"{folder}/{name}") and name != "model.safetensors":
            shutil.copy(f"{folder}/{name}", f"{folder}/bin/{name}")


def check_reload(folder: str, model):
    """Both saved layouts load back to the very same weights, sinusoidal tables included."""
    expected = model.state_dict()
    loaded = []
    for sub in (folder, f"{folder}/bin"):
        again = transformers.MarianMTModel.from_pretrained(sub).eval()
        for name, value in again.state_dict().items():
            assert torch.equal(value, expected[name]), (sub, name)
        loaded.append(again)
    return loaded[0]


def strip_generated(row, eos: int = 0) -> list:
    """Without the decoder start token, cut after the first eos."""
    ids = row[1:].tolist()
    return ids[:ids.index(eos) + 1] if eos in ids else ids


def reference_outputs(model, tokenizer, target_size: int, rng, singles: bool = True) -> tuple:
    """``singles``: also generate_single (each sentence alone, the export's length limit)."""
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    decoder_input_ids = torch.from_numpy(rng.integers(0, target_size - 1, (len(SENTENCES), 12)))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       decoder_input_ids=decoder_input_ids).logits
        beams = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4,
                               max_new_tokens=M)
        greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1,
                                max_new_tokens=M)
        single = []
        for ids in input_ids if singles else ():
            ids = ids[ids != pad][None]
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=4,
                                 max_new_tokens=ids.shape[1] + EXTRA)
            single.append(strip_generated(out[0], eos))
    arrays = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy(),
              "encoder_output": encoder_output.last_hidden_state.numpy(),
              "decoder_input_ids": decoder_input_ids.numpy(), "logits": logits.numpy()}
    generate_batch = [strip_generated(row, eos) for row in beams]
    results = {"sentences": SENTENCES, "max_new_tokens": M, "extra_length": EXTRA,
               "generate_batch": generate_batch, "generate_single": single,
               "generate_single_decoded": [tokenizer.decode(ids, skip_special_tokens=True)
                                           for ids in single],
               "greedy_batch": [strip_generated(row, eos) for row in greedy],
               "generate_batch_decoded": [tokenizer.decode(ids, skip_special_tokens=True)
                                          for ids in generate_batch]}
    return arrays, results


def write_variants(folder: str, model, tokenizer, arrays: dict, config: str) -> None:
    """FOLDER/variants/NAME/: the same weights and tokenizer under each release's field set,
    loaded back by transformers, with its logits and generate results (expected.npz/json)."""
    eos = model.config.eos_token_id
    for name in VARIANTS[config]:
        out = f"{folder}/variants/{name}"
        os.makedirs(out)
        for file in os.listdir(folder):
            if file.endswith((".spm", ".json")) and not file.startswith("expected"):
                shutil.copy(f"{folder}/{file}", out)
        if name == "fine-tune":  # a model built from its config and saved, as a trainer does
            again = transformers.MarianMTModel(
                transformers.MarianConfig.from_pretrained(folder)).eval()
            again.load_state_dict(model.state_dict())
            again.save_pretrained(out)
            assert json.load(open(f"{out}/generation_config.json"))["_from_model_config"]
        else:
            shutil.copy(f"{folder}/model.safetensors", out)
            write_json(f"{out}/config.json", release_config(name, model.config))
        loaded = transformers.MarianMTModel.from_pretrained(out, dtype=torch.float32).eval()
        inputs = {k: torch.from_numpy(arrays[k]) for k in ("input_ids", "attention_mask")}
        limit = M_UNBANNED if name == "fine-tune" else M
        with torch.no_grad():
            logits = loaded(**inputs, decoder_input_ids=torch.from_numpy(
                arrays["decoder_input_ids"])).logits
            beams = loaded.generate(**inputs, num_beams=4, max_new_tokens=limit)
            greedy = loaded.generate(**inputs, num_beams=1, max_new_tokens=limit)
        np.savez(f"{out}/expected.npz", logits=logits.numpy())
        write_json(f"{out}/expected.json", {
            "max_new_tokens": limit, "generate_batch": [strip_generated(row, eos) for row in beams],
            "greedy_batch": [strip_generated(row, eos) for row in greedy]})


def main(folder: str, config: str) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # 2 threads spin-wait on a loaded 2-core machine: 10x slower
    rng = np.random.default_rng(SEED)
    os.makedirs(folder, exist_ok=True)
    sentencepiece.set_min_log_level(2)
    shared = config != "separate"
    source_vocab, target_vocab = write_tokenizer(folder, shared, rng, tc_big=config == "tcbig")
    assert len(source_vocab) == len(target_vocab)  # as the OPUS-MT converter requires
    eos = target_vocab["</s>"]
    model = transformers.MarianMTModel(
        marian_config(config, len(source_vocab), len(target_vocab), eos)).eval()
    randomize(model, SCALES[config])
    save_model(folder, model, model.config.pad_token_id, eos)
    model = check_reload(folder, model)
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token_id == eos
    # Each sentence alone at the export's limit: only the folder the tests convert and export.
    arrays, results = reference_outputs(model, tokenizer, len(target_vocab), rng,
                                        singles=config == "separate")
    results.update(text_outputs(tokenizer, len(target_vocab), rng))
    try:
        import sacremoses  # noqa: F401  (MarianTokenizer never calls its normalizer when encoding)
        results["sacremoses_installed"] = True
    except ImportError:
        results["sacremoses_installed"] = False
    results.update(config=config, transformers_version=transformers.__version__)
    np.savez(f"{folder}/expected.npz", **arrays)
    write_json(f"{folder}/expected.json", results)
    write_variants(folder, model, tokenizer, arrays, config)


if __name__ == "__main__":
    # Several folders, one --config each (in order), are written by one process: torch and
    # transformers are imported once. Each config's numbers are those of a process of its own.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="+")
    parser.add_argument("--config", choices=("shared", "separate", "tcbig"), required=True,
                        action="append")
    args = parser.parse_args()
    if len(args.folder) != len(args.config):
        parser.error("give one --config per FOLDER")
    for folder, config in zip(args.folder, args.config):
        main(folder, config)
