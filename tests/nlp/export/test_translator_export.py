"""The Translator SavedModel (`nlp.export.translator` writes it, `nlp.export.load` loads it):
translator.json, loading, n-best lists, what is refused, atomicity."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from nlp.config import DECODING_FIELDS
from nlp.data.embedded import generate_pairs
from nlp.export import load, translator
from nlp.modeling.model import Seq2SeqTransformer
from nlp.search.decoding import DecodingSettings, search
from nlp.text.special_ids import EOS_ID
from nlp.training.evaluate import nbest_all, translate_all

pytestmark = pytest.mark.xdist_group("translator_export")  # its module fixtures are built once

DECODING = DecodingSettings(beam_size=3, length_penalty=0.6, extra_length=6)
TEXTS = ["I have three apples.", "", "She is twenty-one years old."]


@pytest.fixture(scope="module")
def exported(nmt_export):
    """(model, tokenizer, export path) of a tiny untrained translator (tests/conftest.py)."""
    return nmt_export


@pytest.fixture(scope="module")
def loaded(exported):
    """The export, loaded for beam search and for greedy search (loading takes seconds)."""
    path = exported[2]
    return load.load_translator(path), load.load_translator(path, beam_size=1)


def _reference(model, tokenizer, texts, decoding):
    """Translations computed without `make_translate_fn`: Python tokenization, then `search`."""
    sources = [tokenizer.encode(text) + [EOS_ID] for text in texts]
    width = max(len(s) for s in sources)
    batch = np.array([s + [0] * (width - len(s)) for s in sources], "int32")
    ids = np.asarray(search(model, batch, decoding))
    return [tokenizer.decode(row.tolist()) for row in ids]


def _texts(translate):
    return [t.decode("utf-8") for t in translate(tf.constant(TEXTS)).numpy()]


def _snapshot(directory):
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, directory)] = f.read()
    return files


def test_translator_json_records_decoding_and_signatures(exported):
    _, tokenizer, path = exported
    assert not (path / "stale.txt").exists()  # the directory was replaced, not merged
    info = json.loads((path / load.INFO_FILE).read_text())
    assert info == load.read_info(path)
    assert DecodingSettings(**{k: info[k] for k in DECODING_FIELDS}) == DECODING
    assert info["signatures"] == {
        load.SERVING: {"beam_size": 3}, load.GREEDY: {"beam_size": 1},
        load.NBEST: {"beam_size": 3, "output_keys": ["hypotheses", "scores"]}}
    assert (info["input_key"], info["output_key"]) == (load.INPUT_KEY, load.OUTPUT_KEY)
    assert info["vocab_size"] == tokenizer.vocab_size
    assert info["format_version"] == 2 and load.nbest_size(info) == 3
    # The SavedModel's signatures, as saved_model.pb lists them for a server (no load: seconds).
    saved = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    signatures = {name: (set(signature.inputs), set(signature.outputs))
                  for name, signature in saved.meta_graphs[0].signature_def.items()
                  if not name.startswith("__")}  # (not the initializer of its tables)
    translation = ({load.INPUT_KEY}, {load.OUTPUT_KEY})
    assert signatures == {load.SERVING: translation, load.GREEDY: translation,
                          load.NBEST: ({load.INPUT_KEY},
                                          {load.HYPOTHESES_KEY, load.SCORES_KEY})}


def test_loaded_translator_equals_in_process_decoding(exported, loaded):
    model, tokenizer, _ = exported
    beam = _reference(model, tokenizer, TEXTS, DECODING)
    greedy = _reference(model, tokenizer, TEXTS, DECODING.greedy())
    assert beam[0] and greedy[0]  # the untrained model still writes something
    in_process = translator.make_translate_fn(model, tokenizer, DECODING, jit_compile=False)
    assert _texts(in_process) == beam
    assert _texts(loaded[0]) == beam
    assert _texts(loaded[1]) == greedy


def test_an_empty_batch_translates_to_an_empty_result(loaded):
    # The loaded translators call the signatures SERVING, GREEDY and NBEST as they are (the
    # module's loads: each load, and each loaded signature's first call, costs a second).
    translator, greedy = loaded
    empty = tf.zeros([0], tf.string)
    for translate in (translator, greedy):
        out = translate(empty)
        assert (tuple(out.shape), out.dtype) == ((0,), tf.string)
    hypotheses, scores = translator.translate_nbest(empty)  # (its output keys: the test above)
    assert [(tuple(v.shape), v.dtype) for v in (hypotheses, scores)] == [
        ((0, DECODING.beam_size), tf.string), ((0, DECODING.beam_size), tf.float32)]


def _reference_nbest(model, tokenizer, texts, decoding):
    """n-best lists computed without the export: Python tokenization, then `search`."""
    sources = [tokenizer.encode(text) + [EOS_ID] for text in texts]
    width = max(len(s) for s in sources)
    batch = np.array([s + [0] * (width - len(s)) for s in sources], "int32")
    ids, scores = search(model, batch, decoding, nbest=True)
    return ([[tokenizer.decode(hypothesis.tolist()) for hypothesis in row]
             for row in np.asarray(ids)], np.asarray(scores))


def test_nbest_signature_lists_the_beam_best_first(exported, loaded):
    model, tokenizer, _ = exported
    translator, greedy = loaded
    assert translator.nbest_size == 3 and translator.beam_size == 3
    hypotheses, scores = translator.translate_nbest(tf.constant(TEXTS))
    assert hypotheses.dtype == tf.string and scores.dtype == tf.float32
    assert hypotheses.shape == (3, 3) and scores.shape == (3, 3)
    hypotheses = [[h.decode("utf-8") for h in row] for row in hypotheses.numpy()]
    scores = scores.numpy()
    want, want_scores = _reference_nbest(model, tokenizer, TEXTS, DECODING)
    assert hypotheses == want
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    assert all(len(set(row)) == 3 for row in hypotheses)  # K different translations
    assert np.all(np.diff(scores, axis=1) <= 0) and np.all(scores < 0)
    assert [row[0] for row in hypotheses] == _texts(translator)  # the first = the translation
    # Loaded for greedy search, the translator still lists the export's beam.
    assert greedy.beam_size == 1 and greedy.nbest_size == 3
    np.testing.assert_allclose(greedy.translate_nbest(tf.constant(TEXTS))[1], scores)


def test_sorted_batches_translate_as_one_sentence_at_a_time(loaded):
    translator = loaded[0]
    texts = [s for s, _ in generate_pairs(5, seed=3)] + TEXTS
    one_by_one = [_texts_of(translator, [text])[0] for text in texts]
    assert translate_all(translator, texts, batch_size=4, progress=False) == one_by_one
    assert len(set(one_by_one)) > 1
    lists = nbest_all(translator.translate_nbest, texts, nbest=2, batch_size=3, progress=False)
    for text, got in zip(texts, lists):
        hypotheses, scores = translator.translate_nbest(tf.constant([text]))
        want = [(float(s), h.decode()) for s, h in zip(scores.numpy()[0], hypotheses.numpy()[0])]
        assert [h for _, h in got] == [h for _, h in want[:2]]
        np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want[:2]], rtol=1e-5)
    assert [row[0][1] for row in lists] == one_by_one


def _texts_of(translate, texts):
    return [t.decode("utf-8") for t in translate(tf.constant(texts)).numpy()]


def test_load_translator_errors(exported, tmp_path):
    _, _, path = exported
    with pytest.raises(ValueError, match=r"beam_size=2: this export decodes with beam_size=3"):
        load.load_translator(path, beam_size=2)
    with pytest.raises(ValueError, match="beam_size=0"):
        load.load_translator(path, beam_size=0)
    with pytest.raises(load.NotATranslatorError) as info:
        load.load_translator(tmp_path / "nothing")
    assert str(info.value) == f"{tmp_path / 'nothing'} does not exist (expected DIR/export of " \
                              "a trained translator)"


def _signature_module(input_name, dtype):
    module = tf.Module()
    module.f = tf.function(lambda x: {"out": x}, input_signature=[tf.TensorSpec([None], dtype,
                                                                               name=input_name)])
    return module


@pytest.mark.parametrize("layout, reason", [
    ("file", "is a file, not an export directory"),
    ("empty", "has no saved_model.pb, so it is no export (expected DIR/export"),
    ("workdir", "has no saved_model.pb, so it is no export (a work directory? its export is "),
    ("detector", "is a detector export (has classes.json), not a translator"),
    ("no_info", "has no translator.json, so it is no translator export (expected DIR/export"),
    ("images", "has no 'text' signature input (its 'serving_default' takes ['images'])"),
    ("other_signature", "has no 'serving_default' signature (it has ['other'])"),
    ("no_nbest", "has no 'translate_nbest' signature (it has ['greedy', 'serving_default'])"),
    ("corrupt", "saved_model.pb"),
])
def test_what_is_not_a_translator_is_named(exported, tmp_path, layout, reason):
    path = tmp_path / "model"
    if layout == "file":
        path.write_text("x")
    elif layout == "workdir":
        shutil.copytree(exported[2], path / "export")
    elif layout == "detector":
        path.mkdir()
        (path / "saved_model.pb").write_bytes(b"whatever")
        (path / "classes.json").write_text('{"class_names": ["cat"], "category_ids": null}')
    elif layout == "no_info":
        shutil.copytree(exported[2], path)
        (path / load.INFO_FILE).unlink()
    elif layout in ("images", "other_signature"):
        module = _signature_module("images", tf.uint8)
        name = "serving_default" if layout == "images" else "other"
        tf.saved_model.save(module, str(path), signatures={name: module.f})
    elif layout == "no_nbest":  # translator.json lists translate_nbest, the SavedModel lacks it
        module = tf.Module()
        upper = tf.function(lambda text: {"translation": tf.strings.upper(text)},
                            input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        tf.saved_model.save(module, str(path), signatures={"serving_default": upper,
                                                           "greedy": upper})
    elif layout == "corrupt":
        path.mkdir()
        (path / "saved_model.pb").write_bytes(b"\x00garbage\xff" * 10)
    else:
        path.mkdir()
    if layout in ("images", "other_signature", "no_nbest", "corrupt"):
        shutil.copy(exported[2] / load.INFO_FILE, path)  # past read_info, to the SavedModel
    with pytest.raises(load.NotATranslatorError) as info:
        load.load_translator(path)
    assert info.value.path == str(path) and reason in info.value.reason
    assert str(info.value).startswith(f"{path} ")


@pytest.mark.parametrize("change, message", [
    (lambda info: "{", "translator.json is not valid JSON"),
    (lambda info: [info], "must hold a JSON object with an integer 'beam_size' >= 1"),
    (lambda info: {**info, "beam_size": "3"}, "must hold a JSON object with an integer"),
    (lambda info: {**info, "signatures": {k: v for k, v in info["signatures"].items()
                                          if k != "translate_nbest"}},
     "must list the 'translate_nbest' signature with an integer 'beam_size' >= 1 under "
     "'signatures'. Received: signatures={\"serving_default\""),
    (lambda info: {**info, "signatures": {**info["signatures"],
                                          "translate_nbest": {"beam_size": True}}},
     "must list the 'translate_nbest' signature"),
])
def test_a_bad_translator_json_is_named(exported, tmp_path, change, message):
    path = tmp_path / "export"
    shutil.copytree(exported[2], path)
    info = json.loads((path / load.INFO_FILE).read_text())
    changed = change(info)
    (path / load.INFO_FILE).write_text(changed if isinstance(changed, str)
                                          else json.dumps(changed))
    with pytest.raises(ValueError) as error:
        load.load_translator(path)
    assert str(error.value).startswith(f"{path / load.INFO_FILE} ")
    assert message in str(error.value)
    with pytest.raises(ValueError, match="`info` records no 'translate_nbest' signature size"):
        load.nbest_size({"signatures": {load.SERVING: {"beam_size": 3}}})


def test_a_sentence_translates_the_same_alone_and_in_a_batch(exported):
    # A model that never ends a sentence: each runs to its limit, its own length +
    # extra_length, whatever the batch's width or the 16-token XLA padding.
    _, tokenizer, _ = exported
    keras.utils.set_random_seed(2)
    model = Seq2SeqTransformer(vocab_size=tokenizer.vocab_size, num_encoder_layers=1,
                               num_decoder_layers=1, d_model=32, num_heads=4, ffn_dim=64,
                               dropout=0.0, max_positions=128, tie_embeddings=False)
    bias = np.zeros(tokenizer.vocab_size, "float32")
    bias[EOS_ID] = -1e4
    model.output_projection.bias.assign(bias)
    short, long = TEXTS[0], " ".join([TEXTS[2]] * 2)  # 16 and 30 tokens
    # (Without XLA, to stay fast: the 16-token XLA padding is padding like the batch's.)
    translate = translator.make_translate_fn(model, tokenizer, DECODING, jit_compile=False)
    alone = translate(tf.constant([short])).numpy()[0]
    batch = translate(tf.constant([short, long])).numpy()
    assert batch[0] == alone
    ids = tokenizer.tokenize(tf.constant([short, long])).to_list()
    assert len(ids[1]) > len(ids[0]) + 2 * DECODING.extra_length  # much longer
    assert 0 < len(alone) < len(batch[1])  # the long one's translation is longer


def test_make_translate_fn_takes_decoding_settings(exported, tmp_path):
    model, tokenizer, path = exported
    with pytest.raises(TypeError, match="`decoding` must be a DecodingSettings"):
        translator.make_translate_fn(model, tokenizer, 3)
    with pytest.raises(TypeError, match="`decoding` must be a DecodingSettings"):
        translator.export_translator(model, tokenizer, tmp_path / "export", 3)
    with pytest.raises(ValueError, match="max_positions"):
        translator.make_translate_fn(model, tokenizer, DecodingSettings(extra_length=120))


def test_failed_export_leaves_the_previous_export_untouched(exported, tmp_path, monkeypatch):
    model, tokenizer, path = exported
    target = tmp_path / "export"
    shutil.copytree(path, target)
    before = _snapshot(target)

    def write_half_and_fail(obj, filepath, **kwargs):
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", write_half_and_fail)
    with pytest.raises(OSError, match="disk full"):
        translator.export_translator(model, tokenizer, target, DECODING, jit_compile=False)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no temporary directory left behind
    with pytest.raises(OSError, match="disk full"):
        translator.export_translator(model, tokenizer, tmp_path / "new", DECODING,
                                     jit_compile=False)
    assert sorted(os.listdir(tmp_path)) == ["export"]  # nothing half-written at a new path


def test_failed_final_move_puts_the_previous_export_back(exported, tmp_path, monkeypatch):
    model, tokenizer, path = exported
    target = tmp_path / "export"
    shutil.copytree(path, target)
    before = _snapshot(target)
    replace = os.replace

    def write_a_stand_in(obj, filepath, **kwargs):  # a whole export, less the searches'
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as f:  # tracing (seconds)
            f.write(b"new")

    monkeypatch.setattr(tf.saved_model, "save", write_a_stand_in)

    def replace_but_not_into_target(src, dst):
        if os.fspath(dst) == os.fspath(target) and os.path.basename(src) != target.name:
            raise OSError("device busy")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_but_not_into_target)
    with pytest.raises(OSError, match="device busy"):
        translator.export_translator(model, tokenizer, target, DECODING, jit_compile=False)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]
