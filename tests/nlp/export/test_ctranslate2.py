"""The translator as a CTranslate2 model (`nlp.export.ctranslate2`,
`nlp.export.ctranslate2_runtime`) against this project's own search and SavedModel.

Models at random weights, every statistic randomized (LayerNorm scales and shifts, biases,
embeddings, Marian's logits bias), so a weight put in the wrong place cannot pass: the
project's layout (interleaved positions, relu, one tied vocabulary, bos start, GNMT length
penalty) and Marian's (concat positions, swish, separate vocabularies with the output tied
to the target embedding, a logits bias, pad start, transformers' length penalty).
CTranslate2's beam and greedy tokens must equal `nlp.search.decoding.search`'s, its per-token
log-probabilities ``score_batch`` the Keras model's within 1e-4, and its translations the
SavedModel's strings.
"""

import importlib.util
import json
import re
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

if importlib.util.find_spec("ctranslate2") is None:
    pytest.skip("ctranslate2 is not installed (make test installs it)", allow_module_level=True)

from nlp.export import ctranslate2  # noqa: E402
from nlp.export.ctranslate2_runtime import Ct2Translator, TextCodec, is_ct2_dir  # noqa: E402
from nlp.modeling.model import Seq2SeqTransformer  # noqa: E402
from nlp.search.decoding import DecodingSettings, search  # noqa: E402
from tfx_transformer import applications  # noqa: E402

# One worker builds the module's models and CTranslate2 directories (pytest-xdist).
pytestmark = pytest.mark.xdist_group("ctranslate2")

SENTENCES = ["Hi.", "I have three apples.", "She is twenty-one years old.",
             "On March 3, 2021 we saw the forty-second train.", "twelve",
             "The first of May is a Monday and the second is a Tuesday."]
GNMT = DecodingSettings(beam_size=3, length_penalty=0.6, extra_length=6)
EOS_BIAS = 3.0  # pushes the eos logit up: beams end at varied lengths
MARIAN = DecodingSettings(beam_size=4, length_penalty=1.0, extra_length=5,
                          convention="transformers")


def _randomize(model, seed, eos_bias=0.0):
    """Every variable random (LayerNorm gammas around 1); the eos row of the output pushed up
    by ``eos_bias`` so that beams end at varied lengths."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        shape = tuple(variable.shape)
        name = variable.path
        if name.endswith("gamma"):
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        elif "embedding" in name:
            value = 0.5 * rng.standard_normal(shape)
        else:
            value = (0.4 if len(shape) > 1 else 0.2) * rng.standard_normal(shape)
        variable.assign(value.astype("float32"))
    if model.logits_bias is not None:
        bias = keras.ops.convert_to_numpy(model.logits_bias).copy()
        bias[model.eos_id] += eos_bias
        model.logits_bias.assign(bias)
    else:  # tied output: the last LayerNorm's shift leans towards the eos row
        norm = model.decoder.layers[-1].feedforward_norm
        row = keras.ops.convert_to_numpy(model.embedding.embeddings)[model.eos_id]
        norm.beta.assign(keras.ops.convert_to_numpy(norm.beta) + eos_bias * row / (row @ row))


def _model_dir(path, model, decoding, tokenizer=None, vocabs=None):
    """A model directory as `nlp.export.ctranslate2.write` reads it: model.keras, the tokenizer
    files, and the decoding settings (export/translator.json; for Marian, model.json as
    tfx-convert-nmt writes it)."""
    path.mkdir()
    model.save(path / "model.keras")
    settings = {"beam_size": decoding.beam_size, "length_penalty": decoding.length_penalty,
                "extra_length": decoding.extra_length, "convention": decoding.convention,
                "renormalize": decoding.renormalize}
    if tokenizer is not None:
        tokenizer.save(path)
        (path / "export").mkdir()
        (path / "export" / "translator.json").write_text(json.dumps(settings))
    else:  # Marian: the vocabularies, and any SentencePiece model (copied, not read)
        for name, vocab in zip(("vocab.json", "target_vocab.json"), vocabs):
            (path / name).write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
        (path / "model.json").write_text(json.dumps({"decoding": settings}))
    return path


def _ours(model, sources, decoding, pad):
    """`nlp.search.decoding.search` on ``sources`` (ids, eos appended): rows cut after eos."""
    width = max(map(len, sources))
    batch = np.array([s + [pad] * (width - len(s)) for s in sources], "int32")
    rows = np.asarray(search(model, batch, decoding)).tolist()
    return [row[:row.index(model.eos_id)] if model.eos_id in row else row for row in rows]


def _ct2_ids(translator, sources, vocab, beam_size=None):
    pieces = [[vocab[i] for i in s[:-1]] for s in sources]
    index = {t: i for i, t in enumerate(vocab)}
    return [[index[t] for t in nbest[0][1]]
            for nbest in translator.translate_tokens(pieces, beam_size)]


@pytest.fixture(scope="module")
def project(nmt_export, tmp_path_factory):
    """(model, tokenizer, sources, our beam search's ids, float32 dir, int8 dir) of the
    project's layout at random weights."""
    model, tokenizer, _ = nmt_export
    model = Seq2SeqTransformer.from_config(model.get_config())
    _randomize(model, seed=3, eos_bias=EOS_BIAS)
    tmp = tmp_path_factory.mktemp("ct2_project")
    directory = _model_dir(tmp / "model", model, GNMT, tokenizer=tokenizer)
    for precision in ("float32", "int8"):
        ctranslate2.write(directory, tmp / precision, precision, None)
    sources = [tokenizer.encode(s) + [tokenizer.eos_id] for s in SENTENCES]
    beam = _ours(model, sources, GNMT, tokenizer.pad_id)
    return model, tokenizer, sources, beam, tmp / "float32", tmp / "int8"


def _vocab(tokenizer):
    return [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]


def test_project_layout_beam_tokens_equal_our_search(project):
    # GNMT's length penalty, which CTranslate2 lacks, is applied by rescoring its hypotheses.
    _, tokenizer, sources, beam, float32, _ = project
    assert _ct2_ids(Ct2Translator(float32, threads=1), sources, _vocab(tokenizer)) == beam
    # Some beams end before the length limit, some run to it: both paths are compared.
    limits = [len(s) + GNMT.extra_length - 1 for s in sources]
    assert 0 < sum(len(b) < limit for b, limit in zip(beam, limits)) < len(sources)


def _check_scores(model, directory, sources, vocab, target_vocab, seed):
    """CTranslate2's ``score_batch`` against the Keras model's log-softmax, random targets."""
    rng = np.random.default_rng(seed)
    targets = [rng.integers(4, len(target_vocab) - 1, n).tolist() for n in (1, 5, 12)]
    got = Ct2Translator(directory, threads=1).score_tokens(
        [[vocab[i] for i in s[:-1]] for s in sources[:3]],
        [[target_vocab[i] for i in t] for t in targets])
    for source, target, log_probs in zip(sources, targets, got):
        memory, mask = model.encode(np.array([source]))
        target_in = np.array([[model.decoder_start_id] + target])
        logits = keras.ops.convert_to_numpy(model.decode(target_in, memory, mask))[0]
        expected = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
            -1, keepdims=True)) - logits.max(-1, keepdims=True)
        picked = expected[np.arange(len(target) + 1), target + [model.eos_id]]
        np.testing.assert_allclose(log_probs, picked, atol=1e-4)


def test_score_batch_equals_the_keras_models_log_probabilities(project):
    model, tokenizer, sources, _, float32, _ = project
    vocab = _vocab(tokenizer)
    _check_scores(model, float32, sources, vocab, vocab, seed=7)


def test_pre_norm_gelu_and_an_own_output_projection_too(project, tmp_path):
    # The other settings a Seq2SeqTransformer may have: pre-norm layers with the stacks'
    # final LayerNorms, the exact gelu, separate embeddings and a Dense output projection.
    model, tokenizer, sources, _, _, _ = project
    other = Seq2SeqTransformer.from_config({
        **model.get_config(), "norm_first": True, "activation": "gelu",
        "tie_embeddings": False})
    assert other.encoder.norm is not None and other.output_projection is not None
    _randomize(other, seed=8)
    directory = _model_dir(tmp_path / "model", other, GNMT, tokenizer=tokenizer)
    ctranslate2.write(directory, tmp_path / "ct2", "float32", None)
    vocab = _vocab(tokenizer)
    _check_scores(other, tmp_path / "ct2", sources, vocab, vocab, seed=9)


def test_int8_runs_and_agrees_on_most_sentences(project):
    _, tokenizer, sources, beam, _, int8 = project
    assert json.loads((int8 / "settings.json").read_text())["precision"] == "int8"
    assert (int8 / "model.bin").stat().st_size < 0.6 * (int8.parent / "float32" / "model.bin"
                                                         ).stat().st_size
    got = _ct2_ids(Ct2Translator(int8, threads=1), sources, _vocab(tokenizer))
    assert all(len(row) > 0 for row in got)
    # Without VNNI, x86's 8-bit products go through 16-bit saturating sums (vpmaddubsw):
    # on a 2-core AVX2 AMD EPYC this model's int8 agreed on 1 of 6 sentences with every
    # CTranslate2 from 4.7.1 to 4.8.5 and every CT2_FORCE_CPU_ISA, against 3 or more with
    # AVX-512 VNNI. The agreement is asserted where the CPU has VNNI.
    if _has_vnni():
        assert sum(a == b for a, b in zip(got, beam)) >= len(sources) // 2


def _has_vnni():
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return re.search(r"\b(avx512_vnni|avx_vnni)\b", flags) is not None


def test_translations_equal_the_savedmodels(nmt_export, tmp_path, capsys):
    model, tokenizer, export = nmt_export
    directory = _model_dir(tmp_path / "model", model, GNMT, tokenizer=tokenizer)
    shutil.rmtree(directory / "export")
    shutil.copytree(export, directory / "export")
    settings = ctranslate2.write(directory / "export", tmp_path / "ct2", "float32", None)
    assert is_ct2_dir(tmp_path / "ct2") and settings["beam_size"] == GNMT.beam_size
    saved = tf.saved_model.load(str(export))
    translator = Ct2Translator(tmp_path / "ct2")
    for signature, beam_size in (("serving_default", None), ("greedy", 1)):
        expected = [t.decode() for t in saved.signatures[signature](
            text=tf.constant(SENTENCES))["translation"].numpy()]
        assert translator.translate(SENTENCES, beam_size) == expected, signature
    # The command users run, in this process: tfx-translate --model CT2_DIR TEXT...
    from nlp.commands.translate import main

    capsys.readouterr()
    assert main(["--model", str(tmp_path / "ct2"), "--beam", "1", *SENTENCES]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    assert main(["--model", str(tmp_path / "ct2"), "--nbest", "9", "Hi."]) == 2
    assert capsys.readouterr().err.startswith("error: --nbest 9")


def test_marian_layout_tokens_equal_our_search(tmp_path, nmt_export):
    # Transformers' stopping rule goes on after K hypotheses have finished; CTranslate2
    # stops at K * patience, 4 for this convention (2 misses a longer hypothesis here).
    source_size, target_size = 61, 53
    keras.utils.set_random_seed(4)
    model = Seq2SeqTransformer(
        vocab_size=source_size, target_vocab_size=target_size, num_encoder_layers=2,
        num_decoder_layers=2, d_model=32, num_heads=4, ffn_dim=64, dropout=0.0,
        max_positions=64, tie_embeddings=False, tie_output=True, output_bias=True,
        activation="silu", position_layout="concat", layer_norm_epsilon=0.1,
        scale_embedding=False, pad_id=target_size - 1,
        decoder_start_id=target_size - 1, eos_id=0, banned_ids=(target_size - 1,),
        source_pad_id=source_size - 1)
    _randomize(model, seed=5, eos_bias=2.0)
    vocabs = [["</s>", "<unk>", *(f"{side}{i}" for i in range(2, size - 1)), "<pad>"]
              for side, size in (("s", source_size), ("t", target_size))]
    directory = _model_dir(tmp_path / "marian", model, MARIAN, vocabs=vocabs)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(nmt_export[2].parent / "tok.model", directory / name)
    settings = ctranslate2.write(directory, tmp_path / "ct2", "float32", None)
    assert settings["patience"] == 4 and settings["convention"] == "transformers"
    translator = Ct2Translator(tmp_path / "ct2", threads=1)
    rng = np.random.default_rng(6)
    sources = [rng.integers(2, source_size - 1, n).tolist() + [0] for n in (2, 4, 7, 11)]
    got = [[{t: i for i, t in enumerate(vocabs[1])}[t] for t in nbest[0][1]] for nbest in
           translator.translate_tokens([[vocabs[0][i] for i in s[:-1]] for s in sources])]
    beam = _ours(model, sources, MARIAN, source_size - 1)
    assert got == beam
    assert len({len(row) for row in beam}) >= 3


def test_what_ctranslate2_cannot_hold_is_refused_by_name(project, tmp_path):
    # tfx-export finds the writer by its format name (pyproject.toml's entry point).
    assert applications.load(applications.FORMATS, "ctranslate2") is ctranslate2.write
    model, _, _, _, float32, _ = project
    directory = float32.parent / "model"
    with pytest.raises(ValueError, match="float16"):
        ctranslate2.write(directory, tmp_path / "a", "float16", None)
    with pytest.raises(ValueError, match="bfloat16"):
        ctranslate2.write(directory, tmp_path / "b", "bfloat16", None)
    with pytest.raises(ValueError, match="input size"):
        ctranslate2.write(directory, tmp_path / "c", "float32", 640)
    with pytest.raises(ValueError, match="no model.keras"):
        ctranslate2.write(tmp_path, tmp_path / "d", "float32", None)
    elu = Seq2SeqTransformer.from_config({**model.get_config(), "activation": "elu"})
    with pytest.raises(ValueError, match="activation 'elu'"):
        ctranslate2.model_spec(elu, ["a"] * model.vocab_size, ["a"] * model.vocab_size,
                              "<s>", "</s>", "<unk>")
    assert not any(p.name.startswith(".ct2-") for p in tmp_path.iterdir())


def test_marian_text_goes_in_and_out_as_marian_tokenizer_does(nmt_export, tmp_path):
    # ct2_runtime tokenizes without TensorFlow: the language code, pieces missing from
    # vocab.json (unk), and decoding that drops eos, pad and unk, as MarianTokenizer does.
    from nlp.text.marian_tokenizer import MarianTokenizer

    spm_file = nmt_export[2].parent / "tok.model"
    pieces = [nmt_export[1].id_to_piece(i) for i in range(4, nmt_export[1].vocab_size)]
    vocab = ["</s>", "<unk>", *pieces[::2], ">>fra<<", "<pad>"]  # every other piece left out
    directory = tmp_path / "marian"
    directory.mkdir()
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(spm_file, directory / name)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    text = TextCodec(directory, {"tokenizer": "marian", "special_tokens": {
        "eos": "</s>", "unk": "<unk>", "banned": ["<pad>"]}})
    marian = MarianTokenizer.from_directory(directory)
    index = {t: i for i, t in enumerate(vocab)}
    for sentence in [*SENTENCES, ">>fra<< I have three apples.", ">>xyz<<Hi", " >>fra<< no code"]:
        got = [index.get(t, index["<unk>"]) for t in text.tokenize(sentence)]
        assert got == marian.encode(sentence), sentence
    rng = np.random.default_rng(10)
    for _ in range(5):
        ids = rng.integers(0, len(vocab), 12).tolist()
        assert text.detokenize([vocab[i] for i in ids]) == marian.decode(ids)
