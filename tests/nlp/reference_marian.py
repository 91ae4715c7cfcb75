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
import io
import json
import os
import shutil

import numpy as np
import sentencepiece
import torch
import transformers

SEED = 0
SPM_PIECES = 320  # each SentencePiece model's size
LEFT_OUT = 5  # pieces of each spm model that vocab.json leaves out on purpose
LANGUAGE_CODES = (">>fra<<", ">>deu<<")  # in the shared vocab.json only, as multilingual OPUS-MT's
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

EN_WORDS = (
    "the a an this that my your our house car tree river city night day time year people man "
    "woman child friend teacher doctor student book letter table window door water bread coffee "
    "music game garden street station train school office market price is are was were be have "
    "has had do does did will would can could should may must go goes went see saw make made "
    "take took give gave find found think know want need open close read write send call come "
    "leave stay work play buy sell pay help new old good bad big small long short red green "
    "blue black white happy quiet early late and or but because if when while before after with "
    "without from into over under very not never always often today tomorrow yesterday here "
    "there now again please thanks file files user users error message page button settings "
    "download upload"
).split()
DE_WORDS = (
    "der die das ein eine dieser mein dein unser Haus Auto Baum Fluss Stadt Nacht Tag Zeit Jahr "
    "Leute Mann Frau Kind Freund Lehrer Arzt Student Buch Brief Tisch Fenster Tür Wasser Brot "
    "Kaffee Musik Spiel Garten Straße Bahnhof Zug Schule Büro Markt Preis ist sind war waren "
    "sein haben hat hatte macht machte wird würde kann könnte soll muss geht ging sieht sah "
    "nimmt nahm gibt gab findet fand denkt weiß will braucht öffnen schließen lesen schreiben "
    "schicken rufen kommen bleiben arbeiten spielen kaufen verkaufen zahlen helfen neu alt gut "
    "schlecht groß klein lang kurz rot grün blau schwarz glücklich ruhig früh spät und oder "
    "aber weil wenn während vor nach mit ohne von in über unter sehr nicht nie immer oft heute "
    "morgen gestern hier dort jetzt wieder bitte danke Größe Übung Äpfel Datei Dateien Benutzer "
    "Fehler Nachricht Seite Einstellungen herunterladen hochladen"
).split()
ACCENTED = {"en": ["café", "naïve", "résumé", "façade", "jalapeño", "Zürich", "São", "Ångström"],
            "de": ["Café", "Müller", "Köln", "Zürich", "Crème", "Señor", "Ørsted", "Łódź"]}
FOREIGN = ["привет", "мир", "спасибо", "καλημέρα", "κόσμε", "東京", "日本語", "北京", "مرحبا",
           "🙂", "👍"]
PLACEHOLDERS = ["%s", "%d", "{name}", "{0}", "%(count)d", "%(name)s", "{{user}}", "$1", "%1$s"]
TAGS = [("<b>", "</b>"), ("<i>", "</i>"), ('<a href="x">', "</a>"), ("<br/>", "")]
QUOTES = {"en": ('"', '"'), "de": ("„", "“")}
ASCII_LINE = "0 1 2 3 4 5 6 7 8 9 . , ; : ! ? ' \" ( ) [ ] { } < > / \\ - _ + = * & % $ # @ ~ ^ |"

SENTENCES = [  # the parity batch: clearly different lengths (5 to ~28 tokens with eos)
    "Hi.",
    "My house is old.",
    "The teacher and the doctor were here.",
    "Send %s to {name}!",
    "<b>The</b> %(count)d files were open.",
    "Привет! The café in Zürich is open; is that good?",
    "The doctor saw 3 people at the station, but the train was late!",
    "The students took the early train to the city, but the school was closed.",
]


def number(rng) -> str:
    forms = ["{}", "{}.{:02d}", "{},{:03d}", "{}%", "{}:{:02d}", "19{:02d}", "20{:02d}"]
    form = forms[rng.integers(len(forms))]
    return form.format(*(int(x) for x in rng.integers(0, 100, form.count("{"))))


def sentence(rng, lang: str) -> str:
    """A line of English- or German-like text with digits, placeholders, tags and other scripts."""
    vocab = EN_WORDS if lang == "en" else DE_WORDS
    words = []
    for _ in range(int(rng.integers(2, 16))):
        u = rng.random()
        if u < 0.06:
            words.append(number(rng))
        elif u < 0.10:
            words.append(PLACEHOLDERS[rng.integers(len(PLACEHOLDERS))])
        elif u < 0.13:
            words.append(ACCENTED[lang][rng.integers(len(ACCENTED[lang]))])
        elif u < 0.145:
            words.append(FOREIGN[rng.integers(len(FOREIGN))])
        else:  # Zipf-like: the frequent words become whole pieces
            weights = 1.0 / np.arange(2, len(vocab) + 2)
            words.append(vocab[rng.choice(len(vocab), p=weights / weights.sum())])
    words[0] = words[0][:1].upper() + words[0][1:]
    if rng.random() < 0.3 and len(words) > 3:
        words[int(rng.integers(1, len(words) - 1))] += ","
    if rng.random() < 0.12:
        i = int(rng.integers(len(words)))
        start, end = TAGS[rng.integers(len(TAGS))]
        words[i] = start + words[i] + end
    if rng.random() < 0.1:
        i = int(rng.integers(len(words)))
        words[i] = QUOTES[lang][0] + words[i] + QUOTES[lang][1]
    if rng.random() < 0.05:
        words[-1] = "(" + words[-1] + ")"
    return " ".join(words) + [".", ".", ".", "!", "?", "...", ":", ""][rng.integers(8)]


def corpus(rng, lang: str, n: int = 400) -> list:
    return [sentence(rng, lang) for _ in range(n)] + [ASCII_LINE] * 5


def train_spm(lines: list, path: str) -> sentencepiece.SentencePieceProcessor:
    """A unigram model with SentencePiece's default ids (unk 0, <s> 1, </s> 2): OPUS-MT's."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
        vocab_size=SPM_PIECES, character_coverage=0.995, num_threads=1)
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return sentencepiece.SentencePieceProcessor(model_file=path)


def pieces(spm, rng) -> tuple:
    """The spm model's pieces but <unk>/<s>/</s> and LEFT_OUT others, in a shuffled order."""
    kept = [spm.id_to_piece(i) for i in range(spm.get_piece_size())
            if not (spm.is_unknown(i) or spm.is_control(i))]
    left_out = set(rng.choice(kept[10:150], LEFT_OUT, replace=False))  # frequent enough to show up
    return [kept[i] for i in rng.permutation(len(kept)) if kept[i] not in left_out], left_out


def opus_vocab(middle: list, tc_big: bool = False) -> dict:
    """OPUS-MT's vocab.json: "</s>" 0, "<unk>" 1, the pieces, "<pad>" last; ``tc_big``: as the
    Tatoeba tc-big releases, "</s>" and "<unk>" among the pieces (eos far from 0)."""
    if tc_big:
        middle = list(dict.fromkeys(middle))
        third = len(middle) // 3
        middle = middle[:third] + ["<unk>"] + middle[third:2 * third] + ["</s>"] \
            + middle[2 * third:]
        vocab = {}
    else:
        vocab = {"</s>": 0, "<unk>": 1}
    for piece in middle:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def write_json(path: str, content) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, ensure_ascii=False, indent=2)


def write_tokenizer(folder: str, shared: bool, rng, tc_big: bool = False) -> tuple:
    """source.spm, target.spm, vocab.json (+ target_vocab.json), tokenizer_config.json."""
    source = train_spm(corpus(rng, "en"), f"{folder}/source.spm")
    target = train_spm(corpus(rng, "de"), f"{folder}/target.spm")
    source_pieces, source_out = pieces(source, rng)
    target_pieces, target_out = pieces(target, rng)
    if shared:
        seen = set(source_pieces)
        union = source_pieces + [p for p in target_pieces if p not in seen]
        middle = [p for p in union if p not in source_out | target_out] + list(LANGUAGE_CODES)
        source_vocab = target_vocab = opus_vocab(middle, tc_big)
    else:
        source_vocab, target_vocab = opus_vocab(source_pieces), opus_vocab(target_pieces)
        write_json(f"{folder}/target_vocab.json", target_vocab)
    write_json(f"{folder}/vocab.json", source_vocab)
    write_json(f"{folder}/tokenizer_config.json", {
        "source_lang": "en", "target_lang": "de", "separate_vocabs": not shared,
        "model_max_length": 512})
    write_json(f"{folder}/special_tokens_map.json",
               {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    return source_vocab, target_vocab


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


def tokenization_strings(rng) -> list:
    edge = [
        "", " ", "   leading spaces", "trailing spaces   ", "multiple    spaces   inside",
        "tab\there", "new\nline", "no\xa0break space", "ﬁne ligature", "ＦＵＬＬ ｗｉｄｔｈ １２３",
        "e\u0301 decomposed", "zero\u200bwidth", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 letters", "ภาษาไทย", "עברית",
        "emoji 🙂👍🏽🎉", "%s %d {name} %(count)d", "{0} and {1} of %1$s",
        "<b>bold</b> and <i>italic</i>", "a<br/>b", '<a href="x">link</a>', "100% sure",
        "1,234.56", "3.14159", "€5 £3 ¥7", "“quotes” ‘single’ «guillemets»", "— – -", "…",
        "C++ & C#", "user@example.com", "https://example.com/a?b=c&d=e", "...", "!!!",
        "???", "ALL CAPS SENTENCE", "MiXeD cAsE", "don't can't won't", "e.g. i.e. etc.",
        "Mr. Smith", "Straße, Größe, Äpfel, Übung", "Привет, мир!", "Καλημέρα κόσμε",
        "東京と北京", "مرحبا بالعالم", ">>fra<< Hello world", ">>deu<<Guten Tag", ">>fra<<",
        " >>fra<< after a space", "a >>fra<< b", ">>xyz<< unknown code", ">> not a code",
        ">>fra<< %s {name}", "<<fra>> reversed", "><", ">><<", ">>fra<<>>deu<< two codes",
        " ".join(EN_WORDS[i] for i in rng.integers(0, len(EN_WORDS), 90)) + ".",
    ]
    generated = [sentence(rng, "en") for _ in range(170)] + [sentence(rng, "de") for _ in range(40)]
    alphabet = sorted(set("".join(generated + edge)) | set("ЖЩΩλ字あ😀ñ\u00a0"))
    scrambled = ["".join(rng.choice(alphabet, int(rng.integers(1, 25)))) for _ in range(40)]
    texts = edge + generated + scrambled
    return [t for t in texts if not any(s in t for s in ("</s>", "<unk>", "<pad>", "<s>"))]


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


def text_outputs(tokenizer, target_size: int, rng) -> dict:
    texts = tokenization_strings(rng)
    sequences = []
    for _ in range(50):
        ids = rng.integers(0, target_size - 1, int(rng.integers(1, 21)))  # never pad
        ids[rng.random(len(ids)) < 0.08] = tokenizer.eos_token_id  # some eos
        ids[rng.random(len(ids)) < 0.08] = tokenizer.unk_token_id  # some unk
        sequences.append(ids.tolist())
    return {
        "tokenization": [{"text": t, "input_ids": tokenizer(t)["input_ids"]} for t in texts],
        "detokenization": [{"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True),
                            "text_with_special": tokenizer.decode(ids)} for ids in sequences]}


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
