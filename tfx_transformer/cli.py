"""What every script shares: argument types, the run flags, config overrides, the error wrapper.

A training script is a table of its config flags (``field -> (flag, argparse keywords)``,
like `RUN_FLAGS`) plus::

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)                      # --workdir --epochs ... --valid-fraction
    add_override_arguments(parser, CONFIG_FLAGS)   # e.g. --batch-size -> batch_size
    args = parser.parse_args(argv)
    config = preset(args.preset, **overrides_from_args(args, CONFIG_FLAGS))
    run = run_options_from_args(args)

and ``sys.exit(run_cli(main))`` turns bad input into one ``error:`` line and exit code 2. An
error that names a field set by a flag of the tables (```batch_size```, ``batch_size=0``) names
the flag instead (```--batch-size```, ``--batch-size 0``): the user typed that.

The commands start quietly (no TensorFlow start-up lines): their first import is
`tfx_transformer.quiet`; ``--verbose`` or ``TFX_TRANSFORMER_VERBOSE=1`` keeps those
lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tfx_transformer import checks
from tfx_transformer.training.distribute import MIXED_PRECISION, STRATEGIES
from tfx_transformer.training.run import RunOptions

__all__ = [
    "COMMON_RUN_FLAGS", "RUN_FLAGS", "add_override_arguments", "add_run_arguments", "fail",
    "name_flags", "overrides_from_args", "positive", "run_cli", "run_options_from_args",
]


def positive(kind: type = int) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses ``kind`` (`int` or `float`) and accepts only the
    values `tfx_transformer.checks` takes for it: a positive integer, or a finite number > 0
    (``nan`` and ``inf`` are refused).

    Example:
        >>> parser.add_argument("--batch-size", type=positive(int))
    """
    check = checks.positive_int if kind is int else checks.positive_number

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        try:
            return kind(check("value", value))
        except checks.CheckError as error:  # argparse names the flag: "argument --x: ..."
            raise argparse.ArgumentTypeError(f"must be {error.expected}, got {text!r}") from None

    parse.__name__ = f"positive {kind.__name__}"  # argparse names the type in its errors
    return parse


# RunOptions field -> (flag, argparse keyword arguments). The default is the field's default.
RUN_FLAGS: dict[str, tuple[str, dict]] = {
    "epochs": ("--epochs", dict(
        type=positive(int), help="epochs (default: no limit with --max-steps or --time-budget, "
                                 "else the trainer's)")),
    "max_steps": ("--max-steps", dict(
        type=positive(int), help="stop after this many train steps in total")),
    "time_budget": ("--time-budget", dict(
        type=positive(float), metavar="MIN",
        help="stop cleanly after MIN minutes of training, then export")),
    "strategy": ("--strategy", dict(choices=STRATEGIES)),
    "mixed_precision": ("--mixed-precision", dict(
        choices=tuple(MIXED_PRECISION),
        help="auto: bfloat16 where it is fast (a GPU of compute capability >= 8, a CPU with "
             "AMX), else none (float32)")),
    "seed": ("--seed", dict(type=int)),
    "valid_fraction": ("--valid-fraction", dict(
        type=float, help="held-out share of a file source (tsv:, coco:)")),
    "eval_limit": ("--eval-limit", dict(
        type=positive(int), help="validate and evaluate on at most N examples")),
    "jit_compile": ("--xla", dict(
        action="store_true", help="XLA-compile the train step (one compilation per shape)")),
    "restart": ("--restart", dict(
        action="store_true",
        help="start over in a WORKDIR that holds a run: its checkpoints/, backup/, logs/, "
             "metrics.json, run.json (and tokenizer.model) move to WORKDIR/previous-N/; "
             "export/ stays until the new export replaces it")),
}
# The flags every training script has; a script adds others of `RUN_FLAGS` by name.
COMMON_RUN_FLAGS = ("epochs", "max_steps", "time_budget", "strategy", "mixed_precision", "seed",
                    "valid_fraction", "restart")
# Field -> flag of every table given to `add_run_arguments` / `add_override_arguments`, so
# that `run_cli` can name the flag the user typed (`name_flags`).
_FLAG_NAMES: dict[str, str] = {}
_RUN_DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunOptions)}


def add_run_arguments(parser: argparse.ArgumentParser, flags: Iterable[str] = COMMON_RUN_FLAGS,
                      **defaults: Any) -> None:
    """Adds ``--workdir`` and the `RUN_FLAGS` named in ``flags`` to ``parser``.

    Args:
        parser: the script's parser.
        flags: `RunOptions` fields to offer as flags (their `RUN_FLAGS` entries).
        **defaults: `RunOptions` fields whose default differs in this script. A field with
            no flag here still gets its value into ``args`` (and so into
            `run_options_from_args`).

    Raises:
        ValueError: a name that is not a `RunOptions` field with a flag.
    """
    flags = tuple(flags)
    unknown = sorted((set(flags) - set(RUN_FLAGS)) | (set(defaults) - set(_RUN_DEFAULTS)))
    if unknown:
        raise ValueError(f"Unknown run options: {unknown}. Known: {sorted(_RUN_DEFAULTS)}")
    parser.add_argument("--workdir", required=True, help="work directory (created if missing)")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    for name in flags:
        flag, kwargs = RUN_FLAGS[name]
        _FLAG_NAMES[name] = flag
        parser.add_argument(flag, dest=name, default=defaults.get(name, _RUN_DEFAULTS[name]),
                            **kwargs)
    parser.set_defaults(**{k: v for k, v in defaults.items() if k not in flags})


def run_options_from_args(args: argparse.Namespace, **overrides: Any) -> RunOptions:
    """The `RunOptions` of parsed arguments (every field found in ``args``), validated.

    Raises:
        ValueError: an option out of range (`RunOptions` names it).
    """
    found = {name: getattr(args, name) for name in _RUN_DEFAULTS if hasattr(args, name)}
    return RunOptions(**{**found, **overrides})


def add_override_arguments(parser: argparse.ArgumentParser,
                           table: Mapping[str, tuple[str, dict]]) -> None:
    """Adds one flag per config field of ``table``: ``field -> (flag, argparse keywords)``.

    Each flag defaults to None, meaning "keep the preset's value"; `overrides_from_args`
    collects the others.
    """
    for name, (flag, kwargs) in table.items():
        _FLAG_NAMES[name] = flag
        parser.add_argument(flag, dest=name, default=None, **kwargs)


def overrides_from_args(args: argparse.Namespace, table: Mapping[str, Any]) -> dict:
    """``{field: value}`` for the flags of ``table`` given on the command line."""
    return {name: getattr(args, name) for name in table if getattr(args, name) is not None}


def name_flags(message: str, flags: Mapping[str, str] | None = None) -> str:
    """``message`` with each field of ``flags`` (default: every flag the parsers were given)
    written as its flag: ```batch_size``` and ```DetrConfig.batch_size``` ->
    ```--batch-size```, ``batch_size=0`` -> ``--batch-size 0``."""
    for name, flag in (_FLAG_NAMES if flags is None else flags).items():
        message = re.sub(rf"`(?:[A-Za-z_][\w.]*\.)?{re.escape(name)}`", f"`{flag}`", message)
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=", f"{flag} ", message)
    return message


def fail(message: str) -> int:
    """Prints ``error: MESSAGE`` as one line on stderr and returns exit code 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _bad_input() -> tuple[type, ...]:
    """The errors `run_cli` reports as bad input; TensorFlow's only once it is loaded (a
    command that failed before loading it, such as a Hub id that cannot be had, raised none)."""
    tf = sys.modules.get("tensorflow")
    return (ValueError, OSError) + ((tf.errors.NotFoundError,) if tf is not None else ())


def _worker_lost(error: Exception) -> bool:
    cluster = sys.modules.get("tfx_transformer.training.cluster")
    return cluster is not None and isinstance(error, cluster.WorkerLostError)


def run_cli(main_fn: Callable[..., int | None], *args: Any, **kwargs: Any) -> int:
    """Runs ``main_fn(*args, **kwargs)``; bad input becomes one ``error:`` line and exit code 2.

    Catches `ValueError`, `OSError` (incl. `FileNotFoundError`) and `tf.errors.NotFoundError`
    (their message names flags, not fields: `name_flags`);
    anything else is a bug and keeps its traceback. Set ``TFX_TRANSFORMER_DEBUG=1`` to see the
    traceback of caught errors too. Use as ``sys.exit(run_cli(main))``.
    """
    try:
        return int(main_fn(*args, **kwargs) or 0)
    except Exception as error:
        if _worker_lost(error):  # not bad input: the run can go on once all are back
            fail(str(error))
            return 1
        if not isinstance(error, _bad_input()) or os.environ.get("TFX_TRANSFORMER_DEBUG"):
            raise
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        return fail(name_flags(str(message)))
    except KeyboardInterrupt:
        fail("interrupted")
        return 130
