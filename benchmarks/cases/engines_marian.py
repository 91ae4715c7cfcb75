"""The model of the `engines` case: an OPUS-MT-layout ``MarianMTModel`` of random weights,
built by transformers in the ``build`` child of `engines_stages` (a process without
TensorFlow), and the fine-tuning batches.

`build` writes into the job's folder:

- ``opus/``: what a Helsinki-NLP/opus-mt-* folder holds, made as
  ``tests/nlp/pretrained/reference_marian.py`` makes its folders (its config, its random
  weights, its file writers), in the case's dimensions: two SentencePiece models (unigram,
  ``pieces`` each, a soft limit) trained on the embedded corpus's training pairs, a shared
  ``vocab.json`` (the union of their pieces) padded with unused pieces to ``vocab_size``
  entries (0: not padded), whose ``final_logits_bias`` is `FILLER_BIAS`: computed at every
  step, never chosen; the ``<pad>`` row (the decoder start) zeros, as in OPUS-MT's models
  (CTranslate2 starts Marian decoders from a zero embedding and drops ``<pad>``); the eos bias
  set by bisection so that greedy translations of 32 sources are about as long as the
  sources (random weights would otherwise run to the length limit);
- ``ct2/``: CTranslate2's own conversion of that folder (``ct2-transformers-converter``'s
  converter, float32);
- ``pairs.json``: the sources to translate (the first ``sentences`` held-out ones);
- ``train_batches.npz``: the training pairs' ids run together and cut into rows of
  ``train_length`` tokens (source, target_in, target_out; no padding).
"""

from __future__ import annotations

import io
import json
import os
import time

FILLER_BIAS = -30.0


def reference():
    """``(reference_marian, opus_vocab)``: the parity tests' config, random weights and file
    writers, and OPUS-MT's vocab.json layout."""
    import harness

    folder = "tests/nlp/pretrained"
    return (harness.test_module(f"{folder}/reference_marian.py"),
            harness.test_module(f"{folder}/reference_marian_text.py").opus_vocab)


def count_generated(row, eos: int) -> int:
    """Generated tokens of a ``generate`` row, eos included, the decoder start not."""
    ids = row[1:].tolist()
    return ids.index(eos) + 1 if eos in ids else len(ids)


def _spm(lines, path: str, pieces: int):
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
        vocab_size=pieces, hard_vocab_limit=False, character_coverage=1.0, num_threads=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return sentencepiece.SentencePieceProcessor(model_file=path)


def _kept(processor) -> list:
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not (processor.is_unknown(i) or processor.is_control(i))]


def _calibrate(model, tokenizer, sources: list, steps: int) -> dict:
    """Bisects the eos bias so that greedy translations of 32 sources are, on average, as
    long as those sources."""
    import numpy as np
    import torch

    probe = tokenizer(sources[:32], padding=True, return_tensors="pt")
    target_length = float(probe["attention_mask"].sum(1).float().mean())
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    base = float(model.final_logits_bias[0, eos])
    low, high, lengths = 0.0, 40.0, []
    for _ in range(steps):
        mid = (low + high) / 2
        with torch.no_grad():
            model.final_logits_bias[0, eos] = base + mid
        with torch.inference_mode():
            out = model.generate(**probe, num_beams=1, max_new_tokens=int(target_length * 3),
                                 bad_words_ids=[[pad]])
        length = float(np.mean([count_generated(row, eos) for row in out]))
        lengths.append((round(mid, 2), round(length, 1)))
        low, high = (mid, high) if length > target_length else (low, mid)
    with torch.no_grad():
        model.final_logits_bias[0, eos] = base + (low + high) / 2
    return {"eos_bias_added": round((low + high) / 2, 2), "probe_source_length": target_length,
            "bisection": lengths}


def _train_batches(job: dict, train: list, tokenizer, pad: int, path: str) -> None:
    import numpy as np

    n, length = job["train_batch"] * (job["warmup_steps"] + job["train_steps"]), \
        job["train_length"]
    src_ids, tgt_ids = [], []
    for s, t in train:
        if len(src_ids) >= n * length and len(tgt_ids) >= n * length:
            break
        src_ids += tokenizer(s)["input_ids"]
        tgt_ids += tokenizer(text_target=t)["input_ids"]
    if min(len(src_ids), len(tgt_ids)) < n * length:
        raise ValueError(f"{len(train)} training pairs give fewer than {n} x {length} tokens")
    source = np.array(src_ids[:n * length], np.int32).reshape(n, length)
    target_out = np.array(tgt_ids[:n * length], np.int32).reshape(n, length)
    target_in = np.concatenate([np.full((n, 1), pad, np.int32), target_out[:, :-1]], 1)
    np.savez(path, source=source, target_in=target_in, target_out=target_out)


def build(job: dict) -> dict:
    """Writes the job's folder (see the module's docstring); returns what it built."""
    import ctranslate2
    import sentencepiece
    import torch
    import transformers

    from nlp.data import embedded

    started = time.time()
    ref, opus_vocab = reference()
    torch.manual_seed(0)
    torch.set_num_threads(job["threads"])
    sentencepiece.set_min_log_level(2)
    home = job["home"]
    folder = os.path.join(home, "opus")
    os.makedirs(folder, exist_ok=True)
    # load_pairs("embedded", ...)'s pairs (a prefix of the full split), without TensorFlow
    train = embedded.generate_pairs(job["train_pairs"], 0, "train")
    sources = [s for s, _ in embedded.generate_pairs(job["sentences"], 0, "valid")]
    with open(os.path.join(home, "pairs.json"), "w", encoding="utf-8") as f:
        json.dump({"sources": sources}, f, ensure_ascii=False)

    source_spm = _spm([s for s, _ in train], f"{folder}/source.spm", job["pieces"])
    target_spm = _spm([t for _, t in train], f"{folder}/target.spm", job["pieces"])
    pieces = _kept(source_spm)
    pieces += [p for p in _kept(target_spm) if p not in set(pieces)]
    real = len(opus_vocab(pieces))  # "</s>", "<unk>", the pieces, "<pad>"
    vocab = opus_vocab(pieces + [f"▁unused{i}" for i in range(job["vocab_size"] - real)])
    ref.write_json(f"{folder}/vocab.json", vocab)
    ref.write_json(f"{folder}/tokenizer_config.json", {
        "source_lang": "en", "target_lang": "de", "separate_vocabs": False,
        "model_max_length": 512})
    ref.write_json(f"{folder}/special_tokens_map.json",
                   {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})

    config = ref.marian_config("shared", len(vocab), len(vocab))
    config.encoder_layers = config.decoder_layers = job["layers"]
    config.encoder_attention_heads = config.decoder_attention_heads = job["heads"]
    config.encoder_ffn_dim = config.decoder_ffn_dim = job["ffn"]
    config.d_model, config.activation_function = job["d_model"], "swish"
    model = transformers.MarianMTModel(config).eval()
    ref.randomize(model, ref.SCALES["shared"])
    pad = config.pad_token_id
    with torch.no_grad():
        model.final_logits_bias[0, real - 1:pad] = FILLER_BIAS  # the fillers, if any
        model.get_input_embeddings().weight[pad] = 0.0
    tokenizer = transformers.MarianTokenizer(
        source_spm=f"{folder}/source.spm", target_spm=f"{folder}/target.spm",
        vocab=f"{folder}/vocab.json", source_lang="en", target_lang="de")
    calibration = _calibrate(model, tokenizer, sources, job["calibration_steps"])
    model.save_pretrained(folder)
    ref.write_json(f"{folder}/generation_config.json", ref.generation_config(pad))
    _train_batches(job, train, tokenizer, pad, os.path.join(home, "train_batches.npz"))
    ct2_started = time.time()
    ctranslate2.converters.TransformersConverter(folder).convert(os.path.join(home, "ct2"),
                                                                 force=True)
    return {"vocab_size": len(vocab), "real_vocab": real, "train_pairs": len(train),
            "source_pieces": source_spm.get_piece_size(),
            "target_pieces": target_spm.get_piece_size(),
            "parameters": sum(p.numel() for p in model.parameters()), **calibration,
            "ct2_convert_seconds": round(time.time() - ct2_started, 1),
            "seconds": round(time.time() - started, 1)}
