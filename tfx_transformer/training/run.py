"""How a training run runs, whatever it trains: one frozen dataclass shared by the trainers.

The model's hyperparameters live in the application's config (`nlp.config.NMTConfig`,
`vision.config.DetrConfig`); `RunOptions` holds the rest: where it runs, how long, which seed,
how much data is held out and scored. Both are validated once, when they are created.

Example:
    >>> RunOptions(max_steps=100, seed=1).fit_epochs(default=10)
    100000
"""

from __future__ import annotations

import dataclasses

from tfx_transformer import checks
from tfx_transformer.training.distribute import STRATEGIES
from tfx_transformer.training.precision import MIXED_PRECISION

__all__ = ["LONG_RUN_EPOCHS", "RunOptions"]

LONG_RUN_EPOCHS = 100_000  # with a time budget or step limit, those decide when to stop


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The options of one training run (the ``--strategy``, ``--epochs``, ... flags).

    Raises:
        ValueError: on creation, for any field out of range; the message names the field and
            the value received.
    """

    strategy: str = "auto"  # "auto", "mirrored" or "multi_worker" (`distribute.get_strategy`)
    mixed_precision: str = "none"  # "none", "bfloat16", "float16" or "auto" (`precision`)
    # None: the trainer's default (the preset's), or unbounded with max_steps / time_budget.
    epochs: int | None = None
    max_steps: int | None = None  # stop after this many optimizer steps in total
    time_budget: float | None = None  # minutes of training; then export and evaluate as usual
    seed: int = 0  # weights, shuffling, augmentation, embedded data; 0 .. 2**32 - 1
    valid_fraction: float = 0.05  # held-out share of a file source (tsv:, coco:)
    eval_limit: int | None = None  # validate and evaluate on at most this many examples
    # XLA-compile the train step. Off by default: NMT's bucket shapes each compile anew, and
    # DETR's scipy matcher is a host callback.
    jit_compile: bool = False
    # Start over in a work directory that holds a run: its files move to DIR/previous-N/.
    restart: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise checks.CheckError("strategy", self.strategy, f"one of {STRATEGIES}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise checks.CheckError("mixed_precision", self.mixed_precision,
                                    f"one of {tuple(MIXED_PRECISION)}")
        for name in ("epochs", "max_steps", "eval_limit"):
            checks.positive_int(name, getattr(self, name), optional=True)
        checks.positive_number("time_budget", self.time_budget, optional=True)  # minutes
        checks.integer("seed", self.seed, minimum=0, maximum=2**32 - 1)  # NumPy's seeds
        checks.fraction("valid_fraction", self.valid_fraction)
        for name in ("jit_compile", "restart"):
            checks.boolean(name, getattr(self, name))

    @property
    def bounded(self) -> bool:
        """True when ``max_steps`` or ``time_budget`` decides when training stops."""
        return self.max_steps is not None or self.time_budget is not None

    def fit_epochs(self, default: int) -> int:
        """``epochs``; if None, `LONG_RUN_EPOCHS` for a bounded run, else ``default``."""
        if self.epochs is not None:
            return self.epochs
        return LONG_RUN_EPOCHS if self.bounded else default
