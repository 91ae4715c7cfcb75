"""Converted OPUS-MT (Marian) models against transformers' ``MarianMTModel`` itself.

``reference_marian.py`` builds, at random weights (LayerNorms and ``final_logits_bias``
included), OPUS-MT's own layout shrunk to width 32 (``shared``: 6+6 layers, swish, one
tied vocabulary) and one with separate source and target vocabularies (``separate``), saves
each as the Hub serves an OPUS-MT folder, and records transformers' encoder output, logits,
``generate`` results and ``MarianTokenizer`` ids. Each folder, read by
`nlp.pretrained.marian.read_marian`, must give the same numbers: encoder output and logits within
1e-4, the same beam-search and greedy tokens, the same source ids and decoded strings. The
``separate`` folder is also converted by the command users run (``scripts/convert_nmt.py``'s `main`,
by its Hub id), and its export must translate as ``generate`` does in a process with only TensorFlow
and TF-Text. Needs torch and transformers (``make test`` installs them).
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.xdist_group("torch_reference")  # its fixtures are built once

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("torch and transformers are not installed (make test installs them)",
                allow_module_level=True)

from nlp.pretrained.marian import marian_settings, read_marian  # noqa: E402
from nlp.search.decoding import DecodingSettings, search  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


CONFIGS = ("shared", "separate", "tcbig")


@pytest.fixture(scope="module")
def references(torch_references):
    """``reference(config)``: (folder, expected arrays, expected json) of reference_marian.py
    (`torch_references`: one process imports torch and transformers for every reference)."""

    def reference(config):
        folder = torch_references[f"marian_{config}"]
        return (folder, dict(np.load(folder / "expected.npz")),
                json.loads((folder / "expected.json").read_text()))

    return reference


@pytest.fixture(scope="module", params=CONFIGS)
def converted(request, references):
    """(expected arrays, expected json, model, tokenizer, decoding) of each config."""
    folder, arrays, expected = references(request.param)
    model, tokenizer, decoding = read_marian(folder, log=lambda *_: None)
    return arrays, expected, model, tokenizer, decoding


HUB_ID = "Helsinki-NLP/opus-mt-en-xx"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root, folder, repo_id=HUB_ID, commit=COMMIT):
    """A Hugging Face Hub cache at ``root`` holding ``folder``'s files as ``repo_id`` at
    ``commit`` (its main branch), laid out as huggingface_hub writes it."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in folder.iterdir():
        if path.is_file() and not path.name.startswith("expected"):
            (snapshot / path.name).write_bytes(path.read_bytes())
    return root


@pytest.fixture(scope="module")
def exported(references):
    """The separate vocabularies' folder (two vocabulary files, the smaller model) converted
    by the command users run (scripts/convert_nmt.py is `main`; run in this process, which
    has TensorFlow loaded already), by its Hub id from a Hub cache with HF_HUB_OFFLINE=1, the
    revision pinned: (expected json, DIR)."""
    from huggingface_hub import constants

    from nlp.commands.convert import main

    folder, _, expected = references("separate")
    cache = hub_cache(folder.parent / f"{folder.name}-hub", folder)
    out = folder.parent / f"{folder.name}-converted"
    with pytest.MonkeyPatch.context() as patch:
        # As a process started with these variables sees them (huggingface_hub reads them
        # once, at its import, into `constants`, which it consults at each call).
        for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", "1")):
            patch.setenv(name, value)
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        assert main([HUB_ID, "--revision", COMMIT, "--out", str(out)]) == 0
    return expected, out


@pytest.mark.parametrize("env, says", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1 and the Hub cache"),
    ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "the Hub could not be reached"),  # no network
])
def test_a_hub_id_that_cannot_be_had_is_one_error_line(tmp_path, env, says):
    done = subprocess.run([sys.executable, os.path.join(_ROOT, "scripts", "convert_nmt.py"),
                           "Helsinki-NLP/opus-mt-no-such", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_CACHE": str(tmp_path), **env})
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr[-2000:]
    assert "Helsinki-NLP/opus-mt-no-such" in done.stderr and says in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def _rows(ids, eos):
    """Each row up to and including its first eos, as lists."""
    rows = []
    for row in np.asarray(ids).tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def test_encoder_output_and_logits_of_every_position_equal_transformers(converted):
    arrays, _, model, _, _ = converted
    memory, mask = model.encode(arrays["input_ids"])
    valid = arrays["attention_mask"].astype(bool)
    np.testing.assert_array_equal(np.asarray(mask), valid)
    np.testing.assert_allclose(np.asarray(memory)[valid], arrays["encoder_output"][valid],
                               atol=1e-4)
    logits = model.decode(arrays["decoder_input_ids"], memory, mask)
    np.testing.assert_allclose(np.asarray(logits), arrays["logits"], atol=1e-4)


def test_beam_search_and_greedy_equal_transformers_generate_token_for_token(converted):
    arrays, expected, model, tokenizer, decoding = converted
    assert decoding.convention == "transformers" and decoding.beam_size == 4
    source = arrays["input_ids"]
    limit = expected["max_new_tokens"]
    beam = search(model, source, decoding, max_length=limit)
    assert _rows(beam, tokenizer.eos_id) == expected["generate_batch"]
    greedy = search(model, source, decoding.greedy(), max_length=limit)
    assert _rows(greedy, tokenizer.eos_id) == expected["greedy_batch"]
    # Hypotheses of several lengths compete: the test would not see a length penalty.
    assert len({len(row) for row in expected["generate_batch"]}) >= 3


# A fresh process, as users run the converter's outputs: first the export with only TensorFlow
# and TF-Text (no module of this project imported), then what a Keras user does with
# model.keras: `import nlp`, then load it. One process for both (one TensorFlow start).
_OUTSIDE = """
import json, sys, numpy as np, tensorflow as tf, tensorflow_text
export, model_file, inputs, logits, sentences = sys.argv[1:5] + [json.loads(sys.argv[5])]
t = tf.saved_model.load(export)
out = t.signatures['serving_default'](text=tf.constant(sentences))
nbest = t.signatures['translate_nbest'](text=tf.constant(sentences))
mods = [m for m in sys.modules if m.split('.')[0] in ('nlp', 'tfx_transformer')]
translations = [s.decode() for s in out['translation'].numpy()]
best = [h.decode() for h in nbest['hypotheses'].numpy()[:, 0]]
import nlp, keras
model = keras.saving.load_model(model_file)
inputs = np.load(inputs)
memory, mask = model.encode(inputs['source'])
np.save(logits, keras.ops.convert_to_numpy(model.decode(inputs['target'], memory, mask)))
print(json.dumps([translations, best, mods]))
"""


@pytest.fixture(scope="module")
def outside(exported, references, tmp_path_factory):
    """What `_OUTSIDE` got from the converted folder: (translations of the reference
    sentences by the serving and the n-best signatures, modules of this project loaded by
    then, model.keras's logits of the reference inputs)."""
    expected, out = exported
    _, arrays, _ = references("separate")
    tmp = tmp_path_factory.mktemp("outside")
    np.savez(tmp / "inputs.npz", source=arrays["input_ids"],
             target=arrays["decoder_input_ids"])
    done = subprocess.run([sys.executable, "-c", _OUTSIDE, str(out / "export"),
                           str(out / "model.keras"), str(tmp / "inputs.npz"),
                           str(tmp / "logits.npy"), json.dumps(expected["sentences"])],
                          capture_output=True, text=True, cwd=tmp, check=True)
    translations, best, mods = json.loads(done.stdout.strip().splitlines()[-1])
    return translations, best, mods, np.load(tmp / "logits.npy")


def test_the_export_translates_a_batch_as_generate_does_each_sentence(exported, outside):
    # The export decodes each sentence at most its source length + extra_length tokens, as
    # transformers' generate does with max_new_tokens set so, sentence by sentence.
    # The export runs in a process with only TensorFlow and TF-Text (no module of this
    # project), its best n-best hypotheses and its translations alike.
    expected, out = exported
    info = json.loads((out / "export" / "translator.json").read_text())
    assert info["convention"] == "transformers"
    assert json.loads((out / "model.json").read_text())["source"] == f"{HUB_ID}@{COMMIT}"
    # transformers' generate, sentence by sentence, decoded by MarianTokenizer
    texts = expected["generate_single_decoded"]
    assert len(texts) == len(expected["sentences"]) == len(set(texts))
    assert expected["extra_length"] == DecodingSettings().extra_length
    translations, best, mods, _ = outside
    assert (best, translations, mods) == (texts, texts, [])


def test_the_converted_model_keras_loads_after_import_nlp_with_the_references_logits(
        outside, references):
    # What a Keras user does with the converter's model.keras: `import nlp`, then load it.
    _, arrays, _ = references("separate")
    np.testing.assert_allclose(outside[3], arrays["logits"], atol=1e-4)


VARIANTS = [(config, name) for config, names in
            (("shared", ("en-de", "en-vi", "fine-tune")), ("separate", ("tatoeba-separate",)),
             ("tcbig", ("tc-big",))) for name in names]


def _settings(folder):
    generation = folder / "generation_config.json"
    return marian_settings(json.loads((folder / "config.json").read_text()),
                           json.loads(generation.read_text()) if generation.exists() else {})


@pytest.mark.parametrize("config, name", VARIANTS)
def test_every_release_field_set_converts_and_equals_transformers(references, config, name):
    # The same weights under the field sets of published config.json files (and a folder
    # that transformers' save_pretrained wrote for a fine-tuned model): each converts, and its
    # logits and generate results equal what transformers computed from that very folder.
    # Where the folder decodes with the reference folder's settings, transformers generated
    # what it generated there, which the search matches in the test above; else (the
    # fine-tune's generation_config.json: no renormalize_logits) the search runs here.
    folder, arrays, base = references(config)
    variant = folder / "variants" / name
    expected = json.loads((variant / "expected.json").read_text())
    model, tokenizer, decoding = read_marian(variant, log=lambda *_: None)
    memory, mask = model.encode(arrays["input_ids"])
    logits = model.decode(arrays["decoder_input_ids"], memory, mask)
    np.testing.assert_allclose(np.asarray(logits), np.load(variant / "expected.npz")["logits"],
                               atol=1e-4)
    assert (decoding.beam_size, decoding.convention) == (4, "transformers")
    if decoding == _settings(folder)[1]:
        assert expected["generate_batch"] == base["generate_batch"]
        assert expected["greedy_batch"] == base["greedy_batch"]
    else:
        beam = search(model, arrays["input_ids"], decoding, max_length=expected["max_new_tokens"])
        assert _rows(beam, tokenizer.eos_id) == expected["generate_batch"]


def test_tc_big_shape_is_read_as_published(references):
    # relu, 16 heads, 1024 positions, eos far from 0 and pad the last id: as tc-big models.
    folder, _, _ = references("tcbig")
    kwargs, _ = _settings(folder / "variants" / "tc-big")
    vocab = json.loads((folder / "vocab.json").read_text())
    assert (kwargs["activation"], kwargs["num_heads"], kwargs["max_positions"]) == \
        ("relu", 16, 1024)
    assert kwargs["eos_id"] == vocab["</s>"] > 100
    assert kwargs["pad_id"] == vocab["<pad>"] == kwargs["vocab_size"] - 1


def test_source_tokenization_equals_marian_tokenizer(converted):
    _, expected, _, tokenizer, _ = converted
    cases = expected["tokenization"]
    assert len(cases) >= 200
    texts = [case["text"] for case in cases]
    ragged = tokenizer.tokenize(tf.constant(texts)).to_list()
    eos = tokenizer.source_eos_id
    for case, in_graph in zip(cases, ragged):
        assert in_graph + [eos] == case["input_ids"], case["text"]
        assert tokenizer.encode(case["text"]) + [eos] == case["input_ids"], case["text"]
    assert any(tokenizer.vocab["<unk>"] in case["input_ids"] for case in cases)


def test_detokenization_equals_marian_tokenizer_decode(converted):
    _, expected, _, tokenizer, _ = converted
    cases = expected["detokenization"]
    ids = [case["ids"] for case in cases]
    width = max(map(len, ids))
    padded = [row + [tokenizer.pad_id] * (width - len(row)) for row in ids]
    in_graph = [t.decode() for t in tokenizer.detokenize(tf.constant(padded)).numpy()]
    for case, text in zip(cases, in_graph):
        assert text == case["text"], case["ids"]
        assert tokenizer.decode(case["ids"]) == case["text"], case["ids"]
