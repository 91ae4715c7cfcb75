"""Tests for tfx_transformer.cli: the argument types, run flags, overrides, error
wrapper."""

import argparse
import dataclasses

import pytest

from tfx_transformer.cli import (
    COMMON_RUN_FLAGS,
    RUN_FLAGS,
    add_override_arguments,
    add_run_arguments,
    fail,
    name_flags,
    overrides_from_args,
    positive,
    run_cli,
    run_options_from_args,
)
from tfx_transformer.training.run import RunOptions


def _exit_code(parser, argv):
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    return exit_info.value.code


def test_positive_parses_its_kind_and_rejects_the_rest():
    as_int, as_float = positive(int), positive(float)
    assert as_int("3") == 3 and type(as_int("3")) is int
    assert as_float("0.25") == 0.25 and as_float("2") == 2.0 and type(as_float("2")) is float
    for parse, bad, message in ((as_int, "0", "^must be a positive integer, got '0'$"),
                                (as_int, "-2", "must be a positive integer"),
                                (as_int, "1.5", "expected a int, got '1.5'"),
                                (as_float, "-0.1", "must be a positive number, got '-0.1'"),
                                (as_float, "nan", "must be a positive number, got 'nan'"),
                                (as_float, "inf", "must be a positive number"),
                                (as_float, "-inf", "must be a positive number"),
                                (as_float, "x", "expected a float")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(bad)


def test_positive_is_reported_by_argparse(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=positive(int))
    assert _exit_code(parser, ["--batch-size", "0"]) == 2
    assert "--batch-size: must be a positive integer, got '0'" in capsys.readouterr().err


def test_run_flags_default_to_the_run_options_defaults():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, RUN_FLAGS)  # every flag
    args = parser.parse_args(["--workdir", "w"])
    assert args.workdir == "w" and run_options_from_args(args) == RunOptions()
    assert set(RUN_FLAGS) == {f.name for f in dataclasses.fields(RunOptions)}


def test_run_flags_parse_into_run_options():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, (*COMMON_RUN_FLAGS, "jit_compile"), eval_limit=1000, seed=5)
    args = parser.parse_args([
        "--workdir", "w", "--epochs", "3", "--max-steps", "7", "--time-budget", "0.5",
        "--strategy", "mirrored", "--mixed-precision", "bfloat16", "--valid-fraction", "0.1",
        "--xla"])
    assert run_options_from_args(args) == RunOptions(
        strategy="mirrored", mixed_precision="bfloat16", epochs=3, max_steps=7,
        time_budget=0.5, seed=5, valid_fraction=0.1, eval_limit=1000, jit_compile=True)
    assert run_options_from_args(parser.parse_args(["--workdir", "w", "--restart"])).restart
    assert parser.parse_args(["--workdir", "w"]).eval_limit == 1000  # default, no flag
    assert _exit_code(parser, ["--workdir", "w", "--eval-limit", "5"]) == 2  # no such flag
    for bad in (["--strategy", "tpu"], ["--time-budget", "0"], ["--epochs", "x"],
                ["--max-steps", "-1"], ["--mixed-precision", "fp16"], []):
        assert _exit_code(parser, ["--workdir", "w"] * bool(bad) + bad) == 2, bad
    # Ranges argparse does not know are checked once, by RunOptions.
    args = parser.parse_args(["--workdir", "w", "--valid-fraction", "1.5"])
    with pytest.raises(ValueError, match="valid_fraction=1.5"):
        run_options_from_args(args)
    assert run_options_from_args(args, valid_fraction=0.0).valid_fraction == 0.0


def test_add_run_arguments_rejects_unknown_names():
    with pytest.raises(ValueError, match=r"\['beam'\]"):
        add_run_arguments(argparse.ArgumentParser(), ("epochs", "beam"))
    with pytest.raises(ValueError, match=r"\['batch_size'\]"):
        add_run_arguments(argparse.ArgumentParser(), batch_size=3)


def test_override_flags_keep_only_what_was_given():
    table = {"batch_size": ("--batch-size", dict(type=positive(int))),
             "beam_size": ("--beam", dict(type=positive(int), help="beam width")),
             "weights": ("--weights", dict(metavar="FILE"))}
    parser = argparse.ArgumentParser()
    add_override_arguments(parser, table)
    assert overrides_from_args(parser.parse_args([]), table) == {}
    args = parser.parse_args(["--beam", "2", "--weights", "w.h5"])
    assert overrides_from_args(args, table) == {"beam_size": 2, "weights": "w.h5"}
    assert _exit_code(parser, ["--batch-size", "0"]) == 2


def test_run_cli_turns_bad_input_into_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("TFX_TRANSFORMER_DEBUG", raising=False)

    def bad(message):
        raise ValueError(message)

    assert run_cli(bad, "unknown `--data` scheme 'ftp'.\nUse one of: embedded") == 2
    assert capsys.readouterr().err == (
        "error: unknown `--data` scheme 'ftp'. Use one of: embedded\n")

    def missing():
        open("/nonexistent/file.tsv")

    assert run_cli(missing) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "/nonexistent/file.tsv" in err and err.count("\n") == 1
    assert run_cli(lambda: None) == 0 and run_cli(lambda: 3) == 3
    with pytest.raises(KeyError):  # a bug keeps its traceback
        run_cli(lambda: {}["x"])
    monkeypatch.setenv("TFX_TRANSFORMER_DEBUG", "1")
    with pytest.raises(ValueError, match="shown"):
        run_cli(bad, "shown")
    assert fail("bad  input") == 2
    assert capsys.readouterr().err == "error: bad input\n"


def test_run_cli_reports_an_interrupt(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert run_cli(interrupted) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_errors_name_the_flag_that_set_a_field(capsys, monkeypatch):
    monkeypatch.delenv("TFX_TRANSFORMER_DEBUG", raising=False)
    flags = {"batch_size": "--batch-size", "max_length": "--max-length"}
    assert name_flags("`batch_size` must be > 0. Received: batch_size=0", flags) == (
        "`--batch-size` must be > 0. Received: --batch-size 0")
    assert name_flags("`NMTConfig.max_length` must be <= `max_positions`", flags) == (
        "`--max-length` must be <= `max_positions`")
    # Only whole names: `max_length_x`, `my_batch_size=` and plain words stay as they are.
    text = "max_length_x=1 my_batch_size=2 the batch_size of max_length=3"
    assert name_flags(text, flags) == (
        "max_length_x=1 my_batch_size=2 the batch_size of --max-length 3")
    parser = argparse.ArgumentParser()  # the parsers' tables are what run_cli maps
    add_run_arguments(parser)
    add_override_arguments(parser, {"num_queries": ("--num-queries", dict(type=int))})

    def bad():
        raise ValueError("`num_queries` must be >= 1. Received: num_queries=0 and seed=1.5")

    assert run_cli(bad) == 2
    assert capsys.readouterr().err == (
        "error: `--num-queries` must be >= 1. Received: --num-queries 0 and --seed 1.5\n")


def test_verbose_and_restart_flags():
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--workdir", "w"])
    assert (args.verbose, args.restart) == (False, False)
    args = parser.parse_args(["--workdir", "w", "--verbose", "--restart"])
    assert args.verbose and run_options_from_args(args) == RunOptions(restart=True)
