"""train_nmt.py, train_detr.py and quickstart.py: command line -> config and run options.

The trainers are replaced by recorders, so these run in a second; the real runs are in
test_detr_scripts.py and tests/nlp/test_nmt_pipeline.py.
"""

import dataclasses
import importlib

import pytest

from nlp import config as nmt_config
from tfx_transformer.cli import run_cli
from tfx_transformer.training.run import RunOptions
from vision import config as detr_config

COMMANDS = {"train_nmt.py": "nlp.commands.train", "train_detr.py": "vision.commands.train",
            "quickstart.py": "tfx_transformer.commands.quickstart"}


def _script(name, trainer_name, monkeypatch):
    """The command module of ``scripts/NAME`` with its trainer replaced by one that records
    its arguments."""
    module = importlib.import_module(COMMANDS[name])
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return {"score": 1.0}

    monkeypatch.setattr(module, trainer_name, record)
    return module, calls


def test_train_nmt_defaults(monkeypatch, capsys):
    module, calls = _script("train_nmt.py", "train_nmt", monkeypatch)
    assert module.main(["--workdir", "w"]) == 0
    (data, workdir, config, run), kwargs = calls[0]
    assert (data, workdir, kwargs) == ("embedded", "w", {"init_from": None})
    assert config == nmt_config.preset("tiny")
    # NMT scores 1000 pairs by default; scripts pick bf16 where it is fast
    assert run == RunOptions(eval_limit=module.EVAL_LIMIT, mixed_precision="auto")
    assert capsys.readouterr().out == "held-out: score 1.0\n"


def test_train_nmt_flags(monkeypatch):
    module, calls = _script("train_nmt.py", "train_nmt", monkeypatch)
    assert module.main([
        "--data", "tsv:p.tsv", "--workdir", "w", "--preset", "base", "--epochs", "2",
        "--max-steps", "9", "--time-budget", "1.5", "--batch-tokens", "512",
        "--vocab-size", "300", "--max-length", "40", "--strategy", "mirrored",
        "--mixed-precision", "float16", "--seed", "4", "--valid-fraction", "0.2", "--beam", "2",
        "--xla", "--schedule", "budget", "--warmup-share", "0.2", "--patience", "3",
        "--average-last", "4", "--valid-sentences", "0"]) == 0
    (data, _, config, run), _ = calls[0]
    assert data == "tsv:p.tsv"
    assert config == nmt_config.preset("base", batch_tokens=512, vocab_size=300, max_length=40,
                                       beam_size=2, schedule="budget", warmup_share=0.2,
                                       patience=3, average_last=4, valid_sentences=0)
    assert run == RunOptions(strategy="mirrored", mixed_precision="float16", epochs=2,
                             max_steps=9, time_budget=1.5, seed=4, valid_fraction=0.2,
                             eval_limit=1000, jit_compile=True)


def test_train_detr_flags(monkeypatch, tmp_path):
    module, calls = _script("train_detr.py", "train_detr", monkeypatch)
    assert module.main([
        "--workdir", "w", "--preset", "tiny-detr", "--batch-size", "3", "--num-queries", "7",
        "--learning-rate", "0.001", "--eval-limit", "5", "--max-steps", "2"]) == 0
    (data, _, config, run), _ = calls[0]
    base = detr_config.PRESETS["tiny-detr"]
    assert data == "embedded"
    # The backbone's rate is a multiplier of the preset's, so it follows --learning-rate.
    assert config == dataclasses.replace(base, batch_size=3, num_queries=7, learning_rate=1e-3)
    assert run == RunOptions(max_steps=2, eval_limit=5, mixed_precision="auto")
    module.main(["--workdir", "w"])
    assert calls[1][0][2] == detr_config.preset("tiny") and calls[1][0][3] == RunOptions(
        mixed_precision="auto")
    weights = tmp_path / "w.h5"
    weights.write_bytes(b"")
    module.main(["--workdir", "w", "--preset", "r50", "--backbone-weights", str(weights)])
    assert calls[2][0][2] == detr_config.preset("r50", backbone_weights=str(weights))


# Bad flags (exit 2 before training, the flag named): tests/scripts/test_cli_battery.py.


@pytest.mark.parametrize("script, trainer", [("train_nmt.py", "train_nmt"),
                                             ("train_detr.py", "train_detr")])
def test_out_of_range_run_options_are_one_error_line(script, trainer, monkeypatch, capsys):
    module, calls = _script(script, trainer, monkeypatch)
    assert run_cli(module.main, ["--workdir", "w", "--valid-fraction", "1"]) == 2
    assert calls == []
    assert capsys.readouterr().err == (
        "error: `--valid-fraction` must be a number in [0, 1). Received: --valid-fraction 1.0\n")


class _Stop(Exception):
    pass


def test_quickstart_trains_both_tiny_presets(monkeypatch, tmp_path):
    import nlp.quickstart
    import nlp.training.train
    import vision.training.train

    module = importlib.import_module(COMMANDS["quickstart.py"])
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise _Stop  # what follows needs a trained model

    # The quick start imports the applications when it runs them.
    monkeypatch.setattr(nlp.training.train, "train_nmt", record)
    monkeypatch.setattr(vision.training.train, "train_detr", record)
    with pytest.raises(_Stop):  # the parts in the order of their names: detection first
        module.main(["--minutes", "3", "--workdir", str(tmp_path)])
    with pytest.raises(_Stop):
        nlp.quickstart.run(str(tmp_path), 1.5)
    assert calls == [
        (("embedded", str(tmp_path / "detr"), detr_config.preset("tiny"),
          RunOptions(time_budget=1.5, eval_limit=200)), {}),
        (("embedded", str(tmp_path / "nmt"), nmt_config.preset("tiny"),
          RunOptions(time_budget=1.5, eval_limit=300)), {}),
    ]
    with pytest.raises(SystemExit):
        module.main(["--minutes", "0"])


def test_config_errors_name_the_flag(monkeypatch, capsys):
    module, calls = _script("train_nmt.py", "train_nmt", monkeypatch)
    # 1 passes argparse (> 0); the config's own rule names its field, the user sees the flag.
    assert run_cli(module.main, ["--workdir", "w", "--max-length", "1"]) == 2
    err = capsys.readouterr().err
    assert calls == [] and err.startswith("error: ") and "--max-length" in err, err
    assert "max_length" not in err.replace("--max-length", "")
