"""Tests for tfx_transformer.training.run.RunOptions."""

import dataclasses

import pytest

from tfx_transformer.training.run import LONG_RUN_EPOCHS, RunOptions


def test_defaults_and_frozen():
    run = RunOptions()
    assert (run.strategy, run.mixed_precision, run.epochs, run.max_steps, run.time_budget,
            run.seed, run.valid_fraction, run.eval_limit, run.jit_compile, run.restart) == (
        "auto", "none", None, None, None, 0, 0.05, None, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 1
    assert dataclasses.replace(run, seed=3).seed == 3


@pytest.mark.parametrize("field, value", [
    ("strategy", "tpu"), ("mixed_precision", "fp16"), ("epochs", 0), ("epochs", 2.0),
    ("epochs", True), ("max_steps", -1), ("eval_limit", 0), ("time_budget", 0),
    ("time_budget", -0.5), ("time_budget", "1"), ("seed", 1.5), ("seed", None), ("seed", -1),
    ("seed", 2**32),
    ("valid_fraction", 1.0), ("valid_fraction", -0.1), ("jit_compile", 1), ("restart", "yes"),
])
def test_invalid_values_name_the_field_and_the_value(field, value):
    with pytest.raises(ValueError, match=f"`{field}` must be .* Received: {field}={value!r}"):
        RunOptions(**{field: value})


def test_valid_edge_values():
    run = RunOptions(valid_fraction=0.0, time_budget=2, epochs=1, max_steps=1, eval_limit=1,
                     strategy="mirrored", mixed_precision="float16", jit_compile=True,
                     seed=2**32 - 1)
    assert run.time_budget == 2 and run.valid_fraction == 0.0


def test_fit_epochs():
    assert RunOptions().fit_epochs(default=10) == 10
    assert RunOptions(epochs=3).fit_epochs(default=10) == 3
    assert RunOptions(epochs=3, max_steps=5).fit_epochs(default=10) == 3
    assert RunOptions(max_steps=5).fit_epochs(default=10) == LONG_RUN_EPOCHS
    assert RunOptions(time_budget=0.1).fit_epochs(default=10) == LONG_RUN_EPOCHS
    assert not RunOptions().bounded and RunOptions(max_steps=1).bounded
