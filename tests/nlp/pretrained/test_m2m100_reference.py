"""Converted NLLB-200 (M2M100) models against transformers' ``M2M100ForConditionalGeneration``
and ``NllbTokenizer`` themselves.

``reference_m2m100.py`` builds, at random weights (LayerNorms included), nllb-200's layout shrunk
to width 32 (2+2 layers, pre-norm with final LayerNorms, fairseq positions from 2, a tied
embedding two rows longer than the tokenizer, a few real language codes after a SentencePiece
BPE vocabulary), saves it as the Hub serves an NLLB folder and records transformers' numbers
with eng_Latn -> deu_Latn. The folder, read by `nlp.pretrained.m2m100.read_m2m100`, must give the
same: positions, encoder output and logits within 1e-4; beam-search (4) and greedy tokens; source,
target and decoded strings; the ids and loss fine-tuning trains on. `tfx-convert-nmt` (the
command users run) writes the model directory, whose export must translate plain strings as
``generate`` does, as must its CTranslate2 export (run with CTranslate2's ``target_prefix``),
and whose model fine-tunes with ``--init-from``. Needs torch and transformers.
"""

import importlib.util
import json
import os
import re
import shutil
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.xdist_group("torch_reference")  # its fixtures are built once

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("torch and transformers are not installed (make test installs them)",
                allow_module_level=True)

import keras  # noqa: E402

import tfx_transformer as tt  # noqa: E402
from nlp.pretrained import m2m100  # noqa: E402
from nlp.pretrained.hf_config import read_weights  # noqa: E402
from nlp.pretrained.m2m100 import read_m2m100  # noqa: E402
from nlp.pretrained.model_dir import read_model_dir  # noqa: E402
from nlp.search.decoding import DecodingSettings, search  # noqa: E402

SOURCE, TARGET = "eng_Latn", "deu_Latn"
EOS = 2


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def reference(torch_references):
    """(folder, expected arrays, expected json) of reference_m2m100.py (`torch_references`)."""
    folder = torch_references["m2m100"]
    return (folder, dict(np.load(folder / "expected.npz")),
            json.loads((folder / "expected.json").read_text()))


@pytest.fixture(scope="module")
def converted(reference):
    """(model, tokenizer, decoding) of the folder."""
    return read_m2m100(reference[0], source_lang=SOURCE, target_lang=TARGET, log=_quiet)


@pytest.fixture(scope="module")
def model_dir(reference):
    """The folder converted by the command users run, in this process."""
    from nlp.commands.convert import main

    folder = reference[0]
    out = folder.parent / f"{folder.name}-converted"
    assert main([str(folder), "--out", str(out), "--source-lang", SOURCE,
                 "--target-lang", TARGET]) == 0
    return out


def _rows(ids, eos=EOS):
    """Each row up to and including its first eos, as lists."""
    return [row[:row.index(eos) + 1] if eos in row else row for row in np.asarray(ids).tolist()]


def test_positions_are_m2m100s_sinusoidal_table_from_position_2(reference):
    _, arrays, _ = reference
    table = arrays["positions"]  # transformers' rows 2, 3, ...
    x = np.zeros((1, len(table), table.shape[1]), "float32")
    ours = tt.SinusoidalPositionEncoding(layout="tensor2tensor", offset=2)
    np.testing.assert_allclose(np.asarray(ours(x))[0], table, atol=1e-5)
    # The layer's config round trip keeps both settings.
    again = tt.SinusoidalPositionEncoding.from_config(ours.get_config())
    np.testing.assert_allclose(np.asarray(again(x, start_index=5))[0, :-5], table[5:], atol=1e-5)
    # Counter-checks: the paper's frequencies, or no offset, are far off.
    for other in (tt.SinusoidalPositionEncoding(layout="concat", offset=2),
                  tt.SinusoidalPositionEncoding(layout="tensor2tensor")):
        assert np.abs(np.asarray(other(x))[0] - table).max() > 0.1


def test_encoder_output_and_logits_of_every_position_equal_transformers(reference, converted):
    _, arrays, _ = reference
    model = converted[0]
    memory, mask = model.encode(arrays["input_ids"])
    valid = arrays["attention_mask"].astype(bool)
    np.testing.assert_array_equal(np.asarray(mask), valid)
    np.testing.assert_allclose(np.asarray(memory)[valid], arrays["encoder_output"][valid],
                               atol=1e-4)
    logits = model.decode(arrays["decoder_input_ids"], memory, mask)
    np.testing.assert_allclose(np.asarray(logits), arrays["logits"], atol=1e-4)


def test_beam_search_and_greedy_equal_transformers_generate_token_for_token(reference,
                                                                            converted):
    _, arrays, expected = reference
    model, tokenizer, decoding = converted
    assert (decoding.beam_size, decoding.convention, decoding.forced_bos_id) == \
        (4, "transformers", tokenizer.target_lang_id)
    limit = expected["max_new_tokens"]
    beam = _rows(search(model, arrays["input_ids"], decoding, max_length=limit))
    assert beam == expected["generate_batch"]
    greedy = _rows(search(model, arrays["input_ids"], decoding.greedy(), max_length=limit))
    assert greedy == expected["greedy_batch"]
    # Every translation starts with the target language; hypotheses of several lengths compete.
    assert {row[0] for row in beam + greedy} == {tokenizer.target_lang_id}
    assert len({len(row) for row in beam}) >= 3
    # NLLB's own generation_config (no forced_eos_token_id) differs only where the limit is hit.
    for ours, unforced in zip(beam, expected["generate_batch_unforced"]):
        assert ours == unforced or limit in (len(ours), len(unforced))


def test_source_and_target_tokenization_equal_nllb_tokenizer(reference, converted):
    _, _, expected = reference
    tokenizer = converted[1]
    cases = expected["tokenization"]
    assert len(cases) >= 250
    texts = [case["text"] for case in cases]
    in_graph = tokenizer.tokenize(tf.constant(texts)).to_list()
    differ = []
    for case, graph in zip(cases, in_graph):
        python = tokenizer.encode(case["text"])
        assert graph == python, case["text"]
        if python + [EOS] != case["input_ids"]:
            differ.append(case["text"])
    # The one known difference: a combining mark after a character NFKC changes.
    assert len(differ) <= len(cases) // 50, differ
    for text in differ:
        assert any(unicodedata.category(c) == "Mn" for c in text), text
    assert any(case["input_ids"][-2] == tokenizer.space_id for case in cases)  # trailing space
    assert any(3 in case["input_ids"] for case in cases)  # unknown characters
    targets = expected["target_tokenization"]
    graph = tokenizer.tokenize_target(tf.constant([c["text"] for c in targets])).to_list()
    for case, ids in zip(targets, graph):
        if not any(unicodedata.category(c) == "Mn" for c in case["text"]):
            assert ids + [EOS] == case["input_ids"] == tokenizer.encode_target(case["text"]) \
                + [EOS], case["text"]


def test_detokenization_equals_nllb_tokenizer_decode(reference, converted):
    _, _, expected = reference
    tokenizer = converted[1]
    cases = expected["detokenization"]
    ids = [case["ids"] for case in cases]
    width = max(map(len, ids))
    padded = [row + [tokenizer.pad_id] * (width - len(row)) for row in ids]
    in_graph = [t.decode() for t in tokenizer.detokenize(tf.constant(padded)).numpy()]
    for case, text in zip(cases, in_graph):
        assert text == case["text"] == tokenizer.decode(case["ids"]), case["ids"]
    assert any(i in tokenizer.added for case in cases for i in case["ids"])  # codes dropped


def test_fine_tuning_batches_and_loss_equal_transformers_labels(reference, converted):
    # What --init-from trains on: the data pipeline's source, decoder input and labels are
    # transformers' (source = [src_lang] + pieces + </s>, labels = [tgt_lang] + pieces + </s>,
    # decoder input = </s> + labels[:-1]), and the model's summed cross-entropy is theirs.
    from nlp.data.batching import make_batches

    _, _, expected = reference
    model, tokenizer, _ = converted
    records = {tuple(r["input_ids"]): r for r in expected["training"]}
    pairs = tf.data.Dataset.from_tensor_slices(([r["source"] for r in expected["training"]],
                                                [r["target"] for r in expected["training"]]))
    batches, _ = make_batches(pairs, tokenizer, batch_tokens=4096, shuffle=False)
    seen = 0
    for inputs, target_out in batches:
        logits = model(inputs)
        losses = keras.ops.sparse_categorical_crossentropy(target_out, logits, from_logits=True)
        for row in range(len(target_out)):
            source = [i for i in inputs["source"][row].numpy().tolist() if i != tokenizer.pad_id]
            record = records[tuple(source)]
            n = len(record["labels"])
            assert inputs["target_in"][row, :n].numpy().tolist() == record["decoder_input_ids"]
            assert target_out[row, :n].numpy().tolist() == record["labels"]
            np.testing.assert_allclose(float(np.sum(losses[row, :n])), record["loss_sum"],
                                       rtol=1e-5)
            seen += 1
    assert seen == len(records)


def test_the_export_translates_plain_strings_as_generate_does(reference, model_dir):
    # The tokenizer adds the source language, the search forces the target language: a client
    # sends plain text. Each sentence decodes at most its source length + extra_length tokens,
    # as generate does with max_new_tokens set so.
    _, _, expected = reference
    info = json.loads((model_dir / "export" / "translator.json").read_text())
    assert (info["source_lang"], info["target_lang"]) == (SOURCE, TARGET)
    assert json.loads((model_dir / "model.json").read_text())["target_lang"] == TARGET
    assert expected["extra_length"] == DecodingSettings().extra_length == info["extra_length"]
    translator = tf.saved_model.load(str(model_dir / "export"))
    out = translator.signatures["serving_default"](text=tf.constant(expected["sentences"]))
    got = [s.decode() for s in out["translation"].numpy()]
    assert got == expected["generate_single_decoded"]
    assert len(set(got)) == len(got)


def test_the_ctranslate2_export_translates_as_generate_with_the_target_prefix(
        reference, model_dir, tmp_path):
    # CTranslate2 as its users run an NLLB model, through
    # `nlp.export.ctranslate2_runtime.Ct2Translator` (what `tfx-translate --model CT2DIR` runs):
    # the source starts with the source language, the target language is the target prefix. Its
    # score leaves the prefix's log-probability out and counts the prefix in the length, as
    # transformers' forced first token; a beam cut at the limit is ours with </s> (log-probability
    # 0) added.
    if importlib.util.find_spec("ctranslate2") is None:
        pytest.skip("ctranslate2 is not installed")
    from nlp.export import ctranslate2
    from nlp.export.ctranslate2_runtime import Ct2Translator

    _, _, expected = reference
    settings = ctranslate2.write(model_dir, tmp_path / "ct2", "float32", None)
    assert (settings["tokenizer"], settings["source_lang"], settings["target_lang"]) == \
        ("nllb", SOURCE, TARGET)
    _, tokenizer, _, _ = read_model_dir(model_dir)
    translator = Ct2Translator(tmp_path / "ct2", threads=1)
    vocab = {token: i for i, token in enumerate(tokenizer.tokens())}
    for case in expected["tokenization"]:  # its pieces are the export's ids (else <unk>)
        pieces = translator.text.tokenize(case["text"])
        ids = [vocab.get(piece, tokenizer.unk_id) for piece in pieces]
        assert ids == tokenizer.encode(case["text"]), case["text"]
    sources = [translator.text.tokenize(text) for text in expected["sentences"]]
    got = [[vocab[t] for t in nbest[0][1]] + [tokenizer.eos_id]
           for nbest in translator.translate_tokens(sources)]
    # CTranslate2 never ends right after the prefix: an empty translation is out of its reach.
    empty = [i for i, ids in enumerate(expected["generate_single"]) if len(ids) == 2]
    same = [i for i, (a, b) in enumerate(zip(got, expected["generate_single"])) if a == b]
    assert sorted(same + empty) == list(range(len(got))), (same, empty)
    assert len(same) >= len(got) - 1
    texts = translator.translate(expected["sentences"])
    assert all(texts[i] == expected["generate_single_decoded"][i] for i in same)


@pytest.mark.slow
def test_fine_tuning_the_converted_model_with_init_from(reference, model_dir, tmp_path, capsys):
    from nlp.commands.train import main

    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{r['source']}\t{r['target']}\n"
                            for r in reference[2]["training"] * 8), encoding="utf-8")
    work = tmp_path / "work"
    assert main(["--init-from", str(model_dir), "--data", f"tsv:{data}", "--workdir", str(work),
                 "--max-steps", "2", "--batch-tokens", "256", "--eval-limit", "4",
                 "--valid-sentences", "0"]) == 0
    for name in ("sentencepiece.bpe.model", "nllb_tokenizer.json"):  # its tokenizer, not new
        assert (work / name).read_bytes() == (model_dir / name).read_bytes()
    info = json.loads((work / "export" / "translator.json").read_text())
    converted = json.loads((model_dir / "export" / "translator.json").read_text())
    for key in ("source_lang", "target_lang", "convention", "renormalize", "vocab_size"):
        assert info[key] == converted[key], key
    capsys.readouterr()


def test_the_pytorch_model_bin_layout_reads_to_the_same_weights(reference, converted):
    # transformers v4's pytorch_model.bin holds every alias of the tied embedding.
    folder = reference[0]
    arrays = read_weights(folder / "bin")
    assert {"model.shared.weight", "lm_head.weight"} <= set(arrays)
    model = read_m2m100(folder / "bin", SOURCE, TARGET, log=_quiet)[0]
    for a, b in zip(model.weights, converted[0].weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _copy(reference, tmp_path, config=None, generation=None, tokenizer_config=None,
          drop=()):
    """The reference folder without its weights' copies, with edited JSON files."""
    folder = tmp_path / "nllb"
    shutil.copytree(reference[0], folder, ignore=shutil.ignore_patterns("bin", "expected.*"))
    for name, change in (("config.json", config), ("generation_config.json", generation),
                         ("tokenizer_config.json", tokenizer_config)):
        if change:
            path = folder / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    for name in drop:
        (folder / name).unlink()
    return folder


@pytest.mark.parametrize("languages, message", [
    ((None, TARGET), "--source-lang is required for an NLLB / M2M100 model: one of its 6 "
                     "language codes, e.g. eng_Latn, deu_Latn, fra_Latn"),
    ((SOURCE, "xyz_Latn"), "--target-lang xyz_Latn: not a language code of this model"),
    ((SOURCE, "<mask>"), "--target-lang <mask>: not a language code"),
])
def test_a_missing_or_unknown_language_names_the_flag(reference, languages, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read_m2m100(reference[0], *languages, log=_quiet)


@pytest.mark.parametrize("change, message", [
    (dict(config={"encoder_layerdrop": 0.05}), "config.json: encoder_layerdrop=0.05 is not "
                                               "supported"),
    (dict(config={"tie_word_embeddings": False}), "config.json: tie_word_embeddings=False"),
    (dict(generation={"no_repeat_ngram_size": 3}), "generation_config.json: "
                                                   "no_repeat_ngram_size=3 changes the generation"),
    (dict(tokenizer_config={"legacy_behaviour": True}), "legacy_behaviour=true"),
    (dict(tokenizer_config={"tokenizer_class": "M2M100Tokenizer"}),
     "tokenizer_class 'M2M100Tokenizer' is not supported"),
    (dict(drop=["sentencepiece.bpe.model"]), "no sentencepiece.bpe.model"),
    (dict(drop=["tokenizer_config.json", "tokenizer.json"]), "neither tokenizer_config.json"),
])
def test_read_m2m100_names_what_it_refuses(reference, tmp_path, change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read_m2m100(_copy(reference, tmp_path, **change), SOURCE, TARGET, log=_quiet)


def test_bookkeeping_fields_are_accepted(reference, tmp_path):
    folder = _copy(reference, tmp_path, config={"_num_labels": 3, "id2label": {"0": "A"},
                                                 "label2id": {"A": 0}, "some_future_note": 1},
                   generation={"output_scores": True, "top_k": 50})
    model = read_m2m100(folder, SOURCE, TARGET, log=_quiet)[0]
    assert model.position_offset == 2 and model.norm_first


def test_every_field_m2m100_modeling_reads_is_read_or_fixed():
    # The installed source, read as text (importing it would import torch here).
    package = importlib.util.find_spec("transformers").submodule_search_locations[0]
    path = os.path.join(package, "models", "m2m_100", "modeling_m2m_100.py")
    with open(path, encoding="utf-8") as f:
        read = set(re.findall(r"config\.([a-z][a-z_0-9]*)", f.read()))
    assert read, "no config field found: the pattern no longer fits the source"
    assert read <= m2m100.MODEL_FIELDS, sorted(read - m2m100.MODEL_FIELDS)
    assert m2m100.MODEL_FIELDS <= m2m100._READ | set(m2m100._FIXED)
