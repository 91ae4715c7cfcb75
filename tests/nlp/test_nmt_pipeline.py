"""Training, resume, export and the three scripts, end to end on tiny data."""

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nlp.commands import evaluate as evaluate_command
from nlp.commands import translate as translate_command
from nlp.config import preset
from nlp.data.batching import make_batches
from nlp.data.embedded import generate_pairs
from nlp.export.translator import SOURCE_LENGTH_MULTIPLE, make_translate_fn
from nlp.search.decoding import DecodingSettings, search
from nlp.text.tokenizer import Tokenizer
from nlp.text.vocabulary import train_tokenizer
from nlp.training.train import build_tokenizer, count_batches, train_nmt
from tfx_transformer.training.run import RunOptions

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _main(module, capsys, *args) -> str:
    """``module.main(args)`` (a command's `run_cli`) in this process: exit 0, its stdout."""
    capsys.readouterr()
    code = module.main([str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    return captured.out


def _run(*args, stdin=None, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV,
                          input=stdin, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def tiny_translator(nmt_export):
    """(model, tokenizer, export path) of a tiny untrained translator, beam 3, extra length 6
    (tests/conftest.py)."""
    return nmt_export


TEXTS = ["I have three apples.", "", "We moved to Berlin on March 3, 2021. " * 40]


@pytest.mark.slow
def test_export_runs_without_this_project_and_matches_in_process(tiny_translator, tmp_path):
    model, tokenizer, export = tiny_translator
    signatures = {"serving_default": 3, "greedy": 1}  # signature: its beam size
    want = {}
    for signature, beam in signatures.items():
        decoding = DecodingSettings(beam_size=beam, extra_length=6)
        translate = tf.function(make_translate_fn(model, tokenizer, decoding))
        want[signature] = [t.decode() for t in translate(tf.constant(TEXTS)).numpy()]
    script = textwrap.dedent(f"""
        import json, sys
        for name in ("nlp", "vision", "tfx_transformer"):
            sys.modules[name] = None  # importing this project would fail
        import tensorflow as tf
        import tensorflow_text  # noqa: F401
        loaded, texts = tf.saved_model.load({str(export)!r}), json.loads(sys.stdin.read())
        print(json.dumps({{name: [t.decode() for t in loaded.signatures[name](
            text=tf.constant(texts))["translation"].numpy()] for name in {list(signatures)!r}}}))
    """)
    result = _run("-c", script, stdin=json.dumps(TEXTS), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == want
    assert all(len(out) == 3 and all(isinstance(t, str) for t in out) for out in got.values())


# Resume after a kill in every phase, through train_nmt.py: tests/scripts/test_run_lifecycle.py.


def _model_arrays(path) -> dict:
    """The model variables of a Keras ``.weights.h5`` file, read with h5py: {h5 path: array}."""
    import h5py

    arrays = {}
    with h5py.File(path, "r") as f:
        for group in set(f) - {"optimizer"}:
            f[group].visititems(lambda name, node, group=group: arrays.__setitem__(
                f"{group}/{name}", node[()]) if isinstance(node, h5py.Dataset) else None)
    return arrays


def _assert_export_is_the_mean(export, checkpoints):
    """Every exported variable equals the mean of the checkpoints' values of one variable,
    and some differ from the last checkpoint's (the export is not just the last epoch)."""
    files = [_model_arrays(path) for path in checkpoints]
    mean = {name: np.mean([f[name] for f in files], axis=0) for name in files[0]}
    exported = [v.numpy() for v in tf.saved_model.load(str(export)).variables]

    def matches(value, table):
        return any(v.shape == value.shape and np.allclose(v, value, rtol=1e-5, atol=1e-6)
                   for v in table.values())

    trainable = [v for v in exported if v.size > 2 and v.dtype == np.float32]  # no RNG states
    unmatched = [v.shape for v in trainable if not matches(v, mean)]
    assert len(trainable) > 10 and not unmatched, unmatched
    assert not all(matches(v, files[-1]) for v in trainable)


@pytest.mark.slow
@pytest.mark.xdist_group("nmt_workdir")  # the tests of the shared run share a worker
def test_scripts_train_translate_evaluate(nmt_workdir, capsys, monkeypatch):
    work, tsv, train = nmt_workdir  # train_nmt.py, 2 epochs on 60 pairs (tests/conftest.py)
    assert train.stderr == ""  # the scripts' quiet start: no TensorFlow or Keras lines
    # ours, the first lines: the precision `auto` chose, then the data
    first, second = train.stdout.splitlines()[:2]
    assert first.startswith("mixed precision: ") and second.startswith("data: ")
    for name in ("tokenizer.model", "metrics.json", "export/saved_model.pb", "checkpoints",
                 "logs"):
        assert (work / name).exists(), name
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["valid"]["n"] == 3 and 0 <= metrics["valid"]["bleu"] <= 100
    # Every held-out pair (3 of 60), with its translation.
    pairs = [tuple(line.split("\t")) for line in tsv.read_text(encoding="utf-8").splitlines()]
    assert len(metrics["samples"]) == 3
    assert all((s["source"], s["reference"]) in pairs and isinstance(s["translation"], str)
               for s in metrics["samples"])
    # Validation BLEU/chrF every epoch; a progress line that counts the run's steps.
    assert all({"val_bleu", "val_chrf", "val_loss"} <= set(e) for e in metrics["history"])
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]
    state = json.loads((work / "run.json").read_text())
    steps = state["steps"]
    # The lineage of an uninterrupted run: 2 epochs of every batch, and the export has them.
    assert state["phase"] == "finished"
    assert steps == state["export_steps"] == 2 * metrics["data"]["train_batches"]
    assert metrics["data"]["kept"] + metrics["data"]["dropped"] == metrics["data"]["train_pairs"]
    assert metrics["config"]["decoding"]["beam_size"] == 2
    assert 0 < metrics["config"]["vocab_size"] <= 100
    assert f"epoch 2/2 · step {steps}/{steps} · " in train.stdout
    assert "Epoch 1/" not in train.stdout + train.stderr
    assert "\x1b[" not in train.stdout and "/sentence" not in train.stdout  # no bar in a pipe
    assert "the mean of the weights of epochs 1-2" in train.stdout
    _assert_export_is_the_mean(work / "export", sorted((work / "checkpoints").glob("*.h5")))

    # translate.py and evaluate_nmt.py: their `main`, in this process (saves two start-ups).
    out = _main(translate_command, capsys, "--model", work / "export", "I have three apples.",
                "")
    assert len(out.splitlines()) == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\nthree\n")))
    piped = _main(translate_command, capsys, "--model", work / "export", "--beam", 1)
    assert len(piped.splitlines()) == 3

    scored = _main(evaluate_command, capsys, "--model", work / "export", "--data", f"tsv:{tsv}")
    result = json.loads(scored.strip().splitlines()[-1])
    assert result["n"] == 60 and set(result) == {"bleu", "chrf", "exact_match", "n"}


# Bad input to the scripts (one error line, exit 2): tests/scripts/test_cli_battery.py.


def test_translations_of_empty_and_very_long_sentences(tiny_translator):
    """Documented in `make_translate_fn`: long sources are cut, the empty one is just eos."""
    model, tokenizer, _ = tiny_translator
    decoding = DecodingSettings(beam_size=2, extra_length=6)
    translate = tf.function(make_translate_fn(model, tokenizer, decoding, jit_compile=False))
    # One at a time: a batch decodes up to its longest source + extra_length for every row.
    out = [translate(tf.constant([text])).numpy()[0].decode() for text in TEXTS]

    # One trace for every source length (a beam search traced per length costs seconds).
    run_search = tf.function(lambda source: search(model, source, decoding),
                             input_signature=[tf.TensorSpec([1, None], tf.int32)])

    def decode(ids):  # the search on token ids, without the translate function
        source = tf.constant([[*ids, tokenizer.eos_id]], tf.int32)
        return tokenizer.detokenize(run_search(source)).numpy()[0].decode()

    # The default cut leaves room for `extra_length` steps and the 16-token XLA padding.
    keep = model.max_positions - decoding.extra_length - SOURCE_LENGTH_MULTIPLE - 1
    ids = tokenizer.tokenize(tf.constant(TEXTS)).to_list()
    assert 0 < len(ids[0]) < keep < len(ids[2])
    assert out[0] == decode(ids[0])
    assert out[1] == decode([])  # the empty string: a source of eos alone
    assert out[2] == decode(ids[2][:keep])  # the long one: its first `keep` tokens
    # So two long sources that differ only after the cut translate the same.
    longer = translate(tf.constant([TEXTS[2] + " I have three apples."])).numpy()[0].decode()
    assert longer == out[2]
    # An explicit `max_source_length` cuts there (eos included).
    short = tf.function(make_translate_fn(model, tokenizer, decoding, max_source_length=4,
                                          jit_compile=False))
    assert short(tf.constant(TEXTS[2:])).numpy()[0].decode() == decode(ids[2][:3])
    assert len(set(out)) == 3  # the three really differ, so the equalities above mean something


def test_cross_attention_plot(tiny_translator, tmp_path):
    from nlp.plots import cross_attention, plot_cross_attention

    model, tokenizer, _ = tiny_translator
    weights, src, tgt = cross_attention(model, tokenizer, "I have three apples.",
                                        translation="Ich habe drei Äpfel.")
    assert weights.shape == (1, 4, len(tgt), len(src))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    path = plot_cross_attention(model, tokenizer, "I have three apples.", tmp_path / "a.png")
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_counted_batches_are_the_batches_of_every_shuffled_epoch(tmp_path):
    pairs = generate_pairs(150)
    path = train_tokenizer([t for p in pairs for t in p], str(tmp_path / "t.model"),
                           vocab_size=150)
    tokenizer = Tokenizer.from_file(path)
    ds = tf.data.Dataset.from_tensor_slices(([s for s, _ in pairs], [t for _, t in pairs]))
    for batch_tokens, max_length in ((256, 64), (100, 30), (64, 26)):
        kept, dropped, batches = count_batches(pairs, tokenizer, batch_tokens, max_length)
        assert kept + dropped == 150 and kept > 0 and batches > 1
        out, stats = make_batches(ds, tokenizer, batch_tokens, max_length, seed=1)
        assert [sum(1 for _ in out) for _ in range(2)] == [batches, batches]
        assert stats.result() == {"kept": 2 * kept, "dropped": 2 * dropped}  # two epochs
    assert dropped > 0  # max_length 26 drops some


def test_a_reused_tokenizer_of_another_vocab_size_is_an_error_that_says_what_to_do(tmp_path):
    pairs, lines = generate_pairs(100), []
    path = str(tmp_path / "tokenizer.model")
    first = build_tokenizer(path, pairs, 120, lines.append)
    assert os.listdir(tmp_path) == ["tokenizer.model"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as `open` makes it, not 0o600
    again = build_tokenizer(path, generate_pairs(50, seed=3), 120, lines.append)  # kept as is
    assert again.model_proto == first.model_proto
    with pytest.raises(ValueError) as info:
        build_tokenizer(path, pairs, 300, lines.append)
    assert str(info.value) == (
        f"{path} was trained with --vocab-size 120, not 300, and this work directory keeps its "
        f"tokenizer (a vocabulary of {first.vocab_size}): rerun with --vocab-size 120 to go on "
        "with it, or with --restart (or a new --workdir) to train a new one")
    assert Tokenizer.from_file(path).model_proto == first.model_proto


def test_no_pair_short_enough_is_an_error_before_anything_is_written(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in generate_pairs(40)), encoding="utf-8")
    work = tmp_path / "run"
    with pytest.raises(ValueError, match="training pairs are longer than max_length=2 tokens"):
        train_nmt(f"tsv:{tsv}", work, preset("tiny", vocab_size=100, max_length=2),
                  RunOptions(max_steps=2), log=lambda *a: None)
    assert sorted(os.listdir(work)) == ["checkpoints", "logs"]
