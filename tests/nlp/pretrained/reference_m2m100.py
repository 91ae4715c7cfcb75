"""An NLLB-200-shaped M2M100ForConditionalGeneration of random weights, saved as the Hub has it,
and its outputs.

``python reference_m2m100.py FOLDER`` writes into FOLDER what a facebook/nllb-200-* folder holds:
sentencepiece.bpe.model (a SentencePiece BPE model trained here on generated English-/German-like
text; ids unk 0, <s> 1, </s> 2, as NLLB's; nmt_nfkc; character_coverage 0.995, so rare characters
are unknown), tokenizer_config.json (the Hub's field set: added_tokens_decoder with <s> 0, <pad> 1,
</s> 2, <unk> 3, then LANGUAGES, a few of NLLB's real codes, after the pieces, then <mask>;
additional_special_tokens; legacy_behaviour false), special_tokens_map.json, tokenizer.json
(written by transformers' NllbTokenizer from those), config.json (save_pretrained's, plus the fields
nllb-200-distilled-600M's config.json has that v5 no longer writes: max_length, tokenizer_class,
torch_dtype, num_hidden_layers), model.safetensors, generation_config.json (the Hub's: no
num_beams), and FOLDER/bin/: the same with pytorch_model.bin (the whole state_dict, every alias of
the tied embedding). The model is nllb-200's layout shrunk: d_model 32, 2+2 layers, 4 heads, ffn
64, relu, the embedding MADE_UP rows longer than the tokenizer (nllb-200's has 2). Every weight is
random, LayerNorms too; the last decoder LayerNorm's shift leans towards the </s> row so that
translations end at varied lengths. FOLDER/expected.npz: input_ids, attention_mask,
encoder_output, decoder_input_ids, logits, positions (the encoder's sinusoidal table from position
2 on); FOLDER/expected.json: sentences, generate_batch / greedy_batch (max_new_tokens M),
generate_single (max_new_tokens = source length + EXTRA, the export's limit), their decoded
strings, tokenization (source ids), target_tokenization, detokenization, and training (per pair:
input_ids, decoder_input_ids, labels and the summed cross-entropy of the labels, as fine-tuning
computes them). Generated ids leave out the decoder start token and end at the first eos; the
forced first token (the target language) is kept. Runs without TensorFlow, on one torch thread.

What a converter must reproduce (transformers 5.x; file: function):
- modeling_m2m_100.py M2M100SinusoidalPositionalEmbedding.get_embedding: half = d/2, w_i =
  exp(-i * ln(10000) / (half - 1)), table[p] = [sin(p w), cos(p w)] (sines, then cosines); row
  padding_idx (1) zero. create_position_ids_from_input_ids: position = cumsum(id != pad) + pad, so
  the first real token (encoder and decoder, the start token included) is at 2 and pads at 1.
- M2M100Encoder/Decoder.forward: embed_tokens (M2M100ScaledWordEmbedding: times sqrt(d_model) with
  scale_embedding) + positions; no embedding LayerNorm; layer_norm after the last layer of each.
- M2M100EncoderLayer/DecoderLayer.forward: pre-norm, x + f(LayerNorm(x)) for self-attention,
  cross-attention (decoder; the encoder output is not normalized again), FFN (fc1, relu, fc2);
  nn.LayerNorm's eps 1e-5.
- M2M100Attention: q/k/v/out projections with bias, scaling head_dim ** -0.5.
- M2M100ForConditionalGeneration: lm_head tied to model.shared (no bias, no final_logits_bias);
  safetensors keeps model.shared.weight only, the .bin every alias.
- tokenization_nllb.py NllbTokenizer (legacy_behaviour False): source = [src_lang] + pieces +
  [</s>], target (text_target) = [tgt_lang] + pieces + [</s>]; pieces by a tokenizers BPE built
  from the SentencePiece model (ids = spm id + 1, unknown -> 3), normalizer Precompiled(charsmap)
  + collapse of runs of spaces, pre-tokenizer Metaspace(prepend "always", split): a trailing space
  is a "▁" piece of its own. decode(skip_special_tokens=True) drops <s> <pad> </s> <unk>, the codes
  and <mask>; the Metaspace decoder turns "▁" into spaces and drops the first; v5 ignores
  clean_up_tokenization_spaces for BPE.
- generation: decoder_start_token_id 2 (</s>); forced_bos_token_id -> ForcedBOSTokenLogitsProcessor
  (step 1: every id -inf but the target language, log-probability 0); no bad_words_ids, so <pad>
  and the made-up rows may be generated; beam score log p / generated tokens (the forced one and
  eos included) ** length_penalty (1.0); early_stopping False. NLLB's generation_config.json has
  no forced_eos_token_id: at max_new_tokens a hypothesis is cut without </s>. The recorded
  generations pass forced_eos_token_id=2 (ForcedEOSTokenLogitsProcessor: the last step may only
  give </s>), the converted search's rule at a sentence's limit; generate_batch_unforced is the
  beam search without it.
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import sentencepiece
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_marian_text import (  # noqa: E402
    ASCII_LINE,
    sentence,
    tokenization_strings,
    write_json,
)

SEED = 0
SPM_PIECES = 400
LANGUAGES = ("deu_Latn", "eng_Latn", "fra_Latn", "ita_Latn", "spa_Latn", "zho_Hans")  # NLLB's order
SOURCE, TARGET = "eng_Latn", "deu_Latn"
MADE_UP = 2  # embedding rows past the last token (nllb-200's config: 256206 rows, 256204 tokens)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
SCALES = {"embed": 0.25, "qk": 0.8, "vo": 0.3, "fc": 1.0}
EOS_LEAN = 2.4  # the final decoder LayerNorm's shift towards the </s> row
M = 20  # max_new_tokens of the batch generations
EXTRA = 50  # generate_single: max_new_tokens = source length (with eos) + EXTRA, the export's

SENTENCES = [  # the parity batch: clearly different lengths
    "Hi.",
    "My house is old.",
    "The teacher and the doctor were here.",
    "Send %s to {name}!",
    "Привет! The café in Zürich is open; is that good?",
    "The doctor saw 3 people at the station, but the train was late!",
    "The students took the early train to the city, but the school was closed.",
]
PAIRS = [("My house is old.", "Mein Haus ist alt."),
         ("The train was late!", "Der Zug war spät!"),
         ("Send %s to {name}.", "Schicken %s an {name}.")]
EDGE = ["ends with a space ", "ends with a tab\t", "ends with a newline\n", " ", "\t", "\u3000",
        "no-break space at the end\xa0", "zero width at the end\u200b", "control \x01",
        "two  spaces  inside", "spaces then a control \x07", "ＦＵＬＬ ｗｉｄｔｈ", "ﬁ ligature "]


def added_tokens(pieces: int) -> dict:
    """id -> token after the specials: the codes after the pieces, then <mask> (fairseq's order)."""
    tokens = {i: token for i, token in enumerate(SPECIALS)}
    for i, code in enumerate(LANGUAGES):
        tokens[pieces + 1 + i] = code
    tokens[pieces + 1 + len(LANGUAGES)] = "<mask>"
    return tokens


def write_tokenizer(folder: str, rng) -> int:
    """sentencepiece.bpe.model, tokenizer_config.json, special_tokens_map.json, tokenizer.json;
    returns the number of tokens."""
    lines = [sentence(rng, lang) for lang in ("en", "de") for _ in range(400)] + [ASCII_LINE] * 5
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=f"{folder}/sentencepiece.bpe",
        model_type="bpe", vocab_size=SPM_PIECES, character_coverage=0.995, num_threads=1)
    os.remove(f"{folder}/sentencepiece.bpe.vocab")
    tokens = added_tokens(SPM_PIECES)

    def entry(token):
        mask = token == "<mask>"
        return {"content": token, "lstrip": mask, "normalized": mask, "rstrip": False,
                "single_word": False, "special": True}

    write_json(f"{folder}/tokenizer_config.json", {
        "added_tokens_decoder": {str(i): entry(t) for i, t in sorted(tokens.items())},
        "additional_special_tokens": list(LANGUAGES), "bos_token": "<s>",
        "clean_up_tokenization_spaces": True, "cls_token": "<s>", "eos_token": "</s>",
        "legacy_behaviour": False, "mask_token": "<mask>", "model_max_length": 1024,
        "pad_token": "<pad>", "sep_token": "</s>", "sp_model_kwargs": {}, "src_lang": None,
        "tgt_lang": None, "tokenizer_class": "NllbTokenizer", "unk_token": "<unk>"})
    write_json(f"{folder}/special_tokens_map.json", {
        "additional_special_tokens": list(LANGUAGES), "bos_token": "<s>", "cls_token": "<s>",
        "eos_token": "</s>", "mask_token": {"content": "<mask>", "lstrip": True,
                                            "normalized": True, "rstrip": False,
                                            "single_word": False},
        "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>"})
    with tempfile.TemporaryDirectory() as tmp:
        transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(tmp)
        shutil.copy(f"{tmp}/tokenizer.json", f"{folder}/tokenizer.json")
    return max(tokens) + 1


def m2m100_config(vocab_size: int):
    """nllb-200-distilled-600M's config.json, shrunk (d_model 32, 2+2 layers, ffn 64)."""
    return transformers.M2M100Config(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=1024, activation_function="relu",
        dropout=0.1, attention_dropout=0.1, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, init_std=0.02, scale_embedding=True, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, use_cache=True,
        is_encoder_decoder=True, tie_word_embeddings=True,
        architectures=["M2M100ForConditionalGeneration"])


def randomize(model) -> None:
    """Every parameter random (LayerNorms too); the last LayerNorm's shift leans to </s>."""
    with torch.no_grad():
        for name, param in model.named_parameters():  # each tied parameter once
            if "layer_norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0.0, 0.05)
            elif "q_proj" in name or "k_proj" in name:
                param.normal_(0.0, SCALES["qk"])
            elif "v_proj" in name or "out_proj" in name:
                param.normal_(0.0, SCALES["vo"])
            elif "shared" in name or "embed_tokens" in name:
                param.normal_(0.0, SCALES["embed"])
            else:  # fc1, fc2
                param.normal_(0.0, SCALES["fc"])
        row = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias += EOS_LEAN * row / (row @ row)


def save_model(folder: str, model) -> None:
    """model.safetensors, config.json, generation_config.json; bin/: pytorch_model.bin."""
    model.save_pretrained(folder)
    config = json.load(open(f"{folder}/config.json"))
    config.update(max_length=200, tokenizer_class="NllbTokenizer", torch_dtype="float32",
                  num_hidden_layers=2, _name_or_path="nllb-200-tiny")
    write_json(f"{folder}/config.json", config)
    write_json(f"{folder}/generation_config.json", {
        "_from_model_config": True, "bos_token_id": 0, "decoder_start_token_id": 2,
        "eos_token_id": 2, "max_length": 200, "pad_token_id": 1,
        "transformers_version": "4.27.0.dev0"})
    os.makedirs(f"{folder}/bin")
    torch.save(dict(model.state_dict()), f"{folder}/bin/pytorch_model.bin")
    for name in os.listdir(folder):
        if os.path.isfile(f"{folder}/{name}") and name != "model.safetensors":
            shutil.copy(f"{folder}/{name}", f"{folder}/bin/{name}")


def check_reload(folder: str, model):
    """Both saved layouts load back to the very same weights."""
    expected = model.state_dict()
    loaded = []
    for sub in (folder, f"{folder}/bin"):
        again = transformers.M2M100ForConditionalGeneration.from_pretrained(sub).eval()
        for name, value in again.state_dict().items():
            assert torch.equal(value, expected[name]), (sub, name)
        loaded.append(again)
    return loaded[0]


def strip_generated(row) -> list:
    """Without the decoder start token, cut after the first eos."""
    ids = row[1:].tolist()
    return ids[:ids.index(2) + 1] if 2 in ids else ids


def reference_outputs(model, tokenizer, rng) -> tuple:
    forced = tokenizer.convert_tokens_to_ids(TARGET)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    decoder_input_ids = torch.from_numpy(rng.integers(4, SPM_PIECES, (len(SENTENCES), 12)))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    decoder_input_ids[:, 1] = forced
    # forced_eos_token_id: the last step allowed may only give </s>, as the converted search
    # ends a sentence at its length limit; NLLB's generation_config.json sets none, and then
    # transformers cuts a hypothesis there without </s> (generate_batch_unforced).
    generate = dict(forced_bos_token_id=forced, forced_eos_token_id=2, early_stopping=False,
                    length_penalty=1.0)
    with torch.no_grad():
        encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       decoder_input_ids=decoder_input_ids).logits
        beams = model.generate(**batch, num_beams=4, max_new_tokens=M, **generate)
        greedy = model.generate(**batch, num_beams=1, max_new_tokens=M, **generate)
        unforced = model.generate(**batch, num_beams=4, max_new_tokens=M,
                                  **{**generate, "forced_eos_token_id": None})
        single = []
        for ids in input_ids:
            ids = ids[ids != tokenizer.pad_token_id][None]
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=4,
                                 max_new_tokens=ids.shape[1] + EXTRA, **generate)
            single.append(strip_generated(out[0]))
        positions = model.model.encoder.embed_positions.weights[2:2 + 64]
    arrays = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy(),
              "encoder_output": encoder_output.last_hidden_state.numpy(),
              "decoder_input_ids": decoder_input_ids.numpy(), "logits": logits.numpy(),
              "positions": positions.numpy()}
    results = {"sentences": SENTENCES, "max_new_tokens": M, "extra_length": EXTRA,
               "source_lang": SOURCE, "target_lang": TARGET,
               "generate_batch": [strip_generated(row) for row in beams],
               "greedy_batch": [strip_generated(row) for row in greedy],
               "generate_batch_unforced": [strip_generated(row) for row in unforced],
               "generate_single": single,
               "generate_single_decoded": tokenizer.batch_decode(single, skip_special_tokens=True)}
    generated = [i for rows in (results["generate_batch"], results["greedy_batch"], single)
                 for row in rows for i in row]
    # A generated <pad> would get transformers' pad position (computed from the ids), which a
    # search that counts positions does not give it: the parity data must not hold one.
    assert tokenizer.pad_token_id not in generated
    return arrays, results


def training_outputs(model, tokenizer) -> list:
    """Per pair what fine-tuning computes: the ids and the summed cross-entropy of the labels."""
    out = []
    for source, target in PAIRS:
        batch = tokenizer(source, text_target=target, return_tensors="pt")
        labels = batch["labels"]
        decoder_input_ids = transformers.models.m2m_100.modeling_m2m_100.shift_tokens_right(
            labels, model.config.pad_token_id, model.config.decoder_start_token_id)
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=decoder_input_ids).logits
        loss = torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="sum")
        out.append({"source": source, "target": target, "input_ids": batch["input_ids"][0].tolist(),
                    "decoder_input_ids": decoder_input_ids[0].tolist(),
                    "labels": labels[0].tolist(), "loss_sum": float(loss)})
    return out


def text_outputs(tokenizer, vocab_size: int, rng) -> dict:
    specials = (*SPECIALS, "<mask>", *LANGUAGES)
    texts = [t for t in tokenization_strings(rng) + EDGE
             if not any(s in t for s in specials)]
    sequences = []
    for _ in range(60):
        ids = rng.integers(0, vocab_size - MADE_UP, int(rng.integers(1, 21)))
        ids[rng.random(len(ids)) < 0.1] = 2  # some eos
        ids[rng.random(len(ids)) < 0.05] = 3  # some unk
        sequences.append(ids.tolist())
    return {
        "tokenization": [{"text": t, "input_ids": tokenizer(t)["input_ids"]} for t in texts],
        "target_tokenization": [{"text": t, "input_ids": tokenizer(text_target=t)["input_ids"]}
                                for t in texts[:40] + EDGE],
        "detokenization": [{"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True)}
                           for ids in sequences]}


def main(folder: str) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # 2 threads spin-wait on a loaded 2-core machine
    rng = np.random.default_rng(SEED)
    os.makedirs(folder, exist_ok=True)
    sentencepiece.set_min_log_level(2)
    tokens = write_tokenizer(folder, rng)
    model = transformers.M2M100ForConditionalGeneration(m2m100_config(tokens + MADE_UP)).eval()
    randomize(model)
    save_model(folder, model)
    model = check_reload(folder, model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, src_lang=SOURCE,
                                                           tgt_lang=TARGET)
    assert [tokenizer.convert_tokens_to_ids(t) for t in added_tokens(SPM_PIECES).values()] == \
        sorted(added_tokens(SPM_PIECES))
    arrays, results = reference_outputs(model, tokenizer, rng)
    results["training"] = training_outputs(model, tokenizer)
    results.update(text_outputs(tokenizer, tokens + MADE_UP, rng))
    results["transformers_version"] = transformers.__version__
    np.savez(f"{folder}/expected.npz", **arrays)
    write_json(f"{folder}/expected.json", results)


if __name__ == "__main__":
    main(sys.argv[1])
