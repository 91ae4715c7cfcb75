"""Fine-tuning a converted Marian model (``train_nmt.py --init-from``) and the converter's
refusals, as users run them: the scripts, their default flags.

The model directory is built here without transformers (its parity with transformers is
tests/nlp/pretrained/test_marian_reference.py): two SentencePiece models with OPUS-MT's ids (unk 0
in SentencePiece, ``</s>`` 0 and ``<pad>`` last in ``vocab.json``), a tiny
``Seq2SeqTransformer`` with Marian's settings, written by
`nlp.pretrained.model_dir.write_model_dir`.
"""

import json
import signal

import pytest
import sentencepiece as spm

from nlp.data.embedded import generate_pairs
from nlp.modeling.model import Seq2SeqTransformer
from nlp.pretrained.model_dir import write_model_dir
from nlp.search.decoding import DecodingSettings
from nlp.text.marian_tokenizer import MarianTokenizer

pytestmark = pytest.mark.xdist_group("marian_finetune")  # its module fixtures are built once

PAIRS = generate_pairs(400, seed=3)


def _spm(texts, path):
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(path),
                                   vocab_size=120, minloglevel=2, hard_vocab_limit=False)
    return (path.parent / (path.name + ".model")).read_bytes()


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A model directory of a tiny Marian-layout model, and the pairs' TSV file."""
    tmp = tmp_path_factory.mktemp("marian")
    source = _spm([s for s, _ in PAIRS], tmp / "source")
    target = _spm([t for _, t in PAIRS], tmp / "target")
    pieces = []
    for proto in (source, target):
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(proto)
        pieces += [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    tokenizer = MarianTokenizer(source, target, vocab)
    pad = vocab["<pad>"]
    model = Seq2SeqTransformer(
        vocab_size=len(vocab), num_encoder_layers=1, num_decoder_layers=1, d_model=16,
        num_heads=2, ffn_dim=32, max_positions=128, activation="silu", attention_dropout=0.0,
        position_layout="concat", output_bias=True, pad_id=pad, decoder_start_id=pad,
        eos_id=0, banned_ids=(pad,))
    out = tmp / "opus-mt-tiny"
    decoding = DecodingSettings(length_penalty=1.0, convention="transformers",
                                renormalize=True)
    write_model_dir(out, model, tokenizer, decoding, source="test")
    data = tmp / "mine.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    return out, data


@pytest.mark.slow
def test_fine_tuning_killed_mid_epoch_resumes_with_the_same_command(tmp_path, marian_dir,
                                                                    run_script, capsys):
    model_dir, data = marian_dir
    work = tmp_path / "work"
    # 380 training pairs at 256 tokens a batch: dozens of steps an epoch, so step 3 is in
    # the middle of the first.
    command = ("train_nmt.py", "--init-from", model_dir, "--data", f"tsv:{data}",
               "--workdir", work, "--max-steps", 5, "--batch-tokens", 256)
    killed = run_script(*command, fault="step:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    for name in ("source.spm", "target.spm", "vocab.json"):  # its tokenizer, not a new one
        assert (work / name).read_bytes() == (model_dir / name).read_bytes()
    assert not (work / "tokenizer.model").exists()

    done = run_script(*command)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((work / "run.json").read_text())
    assert (state["phase"], state["steps"], state["export_steps"]) == ("finished", 5, 5)
    info = json.loads((work / "export" / "translator.json").read_text())
    assert info["convention"] == "transformers"  # the converted model's decoding
    vocab = json.loads((model_dir / "vocab.json").read_text())
    assert info["vocab_size"] == info["target_vocab_size"] == len(vocab)

    from nlp.commands.translate import main  # the command, in this process

    assert main(["--model", str(work / "export"), "seven apples", "zwei"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_vocab_size_is_refused_when_fine_tuning(tmp_path, marian_dir, capsys):
    from nlp.commands.train import main

    model_dir, data = marian_dir
    with pytest.raises(SystemExit) as stop:  # argparse's error: exit 2, one line
        main(["--init-from", str(model_dir), "--data", f"tsv:{data}", "--workdir",
              str(tmp_path / "w"), "--vocab-size", "500"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("error:") == 1 and "--vocab-size" in err
    assert not (tmp_path / "w").exists()


def _folder(tmp_path, marian_dir, config=None, drop=(), extra=()):
    """An OPUS-MT-like folder: the test model's tokenizer files, a config.json, an (empty)
    model.safetensors."""
    model_dir, _ = marian_dir
    folder = tmp_path / "opus-mt"
    folder.mkdir()
    for name in ("source.spm", "target.spm", "vocab.json"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "marian"}))
    (folder / "model.safetensors").write_bytes(b"")
    for name in drop:
        (folder / name).unlink()
    for name in extra:
        (folder / name).write_text("#version: 0.2\n")
    return folder


@pytest.mark.parametrize("case, named", [
    (dict(drop=["vocab.json"]), "vocab.json"),
    (dict(config={"model_type": "marian", "vocab_size": 10, "add_final_layer_norm": True}),
     "add_final_layer_norm"),
    (dict(drop=["source.spm", "target.spm"], extra=["source.bpe", "target.bpe"]), "BPE"),
])
def test_a_folder_the_converter_cannot_take_is_one_error_line(tmp_path, marian_dir, capsys,
                                                               case, named):
    from nlp.commands.convert import main

    folder = _folder(tmp_path, marian_dir, **case)
    out = tmp_path / "converted"
    assert main([str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and named in err and "Traceback" not in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["opus-mt"]


def test_the_converter_script_refuses_from_the_shell(tmp_path, marian_dir, run_script):
    folder = _folder(tmp_path, marian_dir, drop=["vocab.json"])
    done = run_script("convert_nmt.py", folder, "--out", tmp_path / "converted")
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr[-2000:]
    assert "no vocab.json" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "converted").exists()


@pytest.mark.parametrize("case, message", [
    (dict(drop=["model.safetensors"]), "no weights: neither model.safetensors nor "
                                       "pytorch_model.bin"),
    (dict(config={"model_type": "marian", "normalize_before": True}),
     "normalize_before=True is not supported"),
    (dict(config={"model_type": "marian", "activation_function": "gelu_fast"}),
     "activation_function 'gelu_fast' is not supported"),
    (dict(config={"model_type": "marian", "forced_eos_token_id": 5}),
     "forced_eos_token_id=5 differs"),
])
def test_read_marian_names_what_it_refuses(tmp_path, marian_dir, case, message):
    from nlp.pretrained.marian import read_marian

    with pytest.raises(ValueError, match=message):
        read_marian(_folder(tmp_path, marian_dir, **case))
