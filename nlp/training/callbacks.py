"""What a translation run watches each epoch: held-out BLEU and chrF, and early stopping on it.

`ValidationScores` translates held-out pairs at each epoch end and puts ``val_bleu`` and
``val_chrf`` into the epoch's logs, so ``metrics.json["history"]``, TensorBoard and the
progress line all show them (put it before those callbacks). `Patience` stops the run once
``val_bleu`` has not improved for N epochs; the best epoch is then the one exported
(`tfx_transformer.training.checkpoints.choose_weights`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import keras

from nlp.export.translator import trace_translate_fn
from nlp.search.decoding import DecodingSettings
from nlp.text.tokenizer import Tokenizer
from nlp.training.evaluate import evaluate
from tfx_transformer import checks
from tfx_transformer.training.callbacks import StopRule
from tfx_transformer.training.checkpoints import best_epoch
from tfx_transformer.training.distribute import is_chief
from tfx_transformer.training.workdir import Workdir, read_metrics

__all__ = ["Patience", "ValidationScores"]


class ValidationScores(keras.callbacks.Callback):
    """Adds ``val_bleu`` and ``val_chrf`` (sacrebleu, corpus level) of ``pairs`` to the logs
    of every epoch end.

    The held-out sources are translated with ``decoding`` (by default greedy, at most 16
    tokens past each source's length: cheap enough to run every epoch, even while the model
    is too young to end its sentences; the final evaluation uses the run's own decoding).
    Only the chief translates: other workers' logs get nothing.

    Args:
        tokenizer: the run's tokenizer.
        pairs: ``(source, reference)`` pairs (the first ``limit`` are used).
        decoding: the search to translate with (default: greedy, ``extra_length`` 16).
        limit: translate at most this many pairs.
        batch_size: sentences per translation batch.
    """

    def __init__(self, tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]],
                 decoding: DecodingSettings | None = None, limit: int = 200,
                 batch_size: int = 64):
        super().__init__()
        checks.positive_int("limit", limit)
        self.tokenizer, self.pairs = tokenizer, list(pairs)[:limit]
        self.decoding = decoding if decoding is not None else DecodingSettings(
            beam_size=1, extra_length=16)
        self.batch_size, self._translate = batch_size, None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.pairs or not is_chief():
            return
        if self._translate is None:  # traced once: the weights are variables
            self._translate = trace_translate_fn(self.model, self.tokenizer, self.decoding)
        scores, _ = evaluate(self._translate, self.pairs, self.batch_size, progress=False)
        logs["val_bleu"], logs["val_chrf"] = float(scores["bleu"]), float(scores["chrf"])


class Patience(StopRule):
    """Stops `fit` once ``monitor`` has not improved for ``patience`` epochs.

    The epochs of earlier processes of the run count too: they are read from
    ``metrics.json["history"]``, so a resumed run keeps its count. Put it after the callback
    that logs ``monitor``. ``stopped``/``reason`` report the stop (`MetricsLogger`).

    Args:
        workdir: the work directory (its ``metrics.json`` history).
        patience: epochs without improvement before stopping, >= 1.
        monitor: the log to watch.
        mode: ``"max"`` (higher is better) or ``"min"``.
        log: where the line saying why it stopped goes (None: nowhere).
    """

    def __init__(self, workdir: Workdir | str | os.PathLike, patience: int,
                 monitor: str = "val_bleu", mode: str = "max", log=None):
        super().__init__()
        self.log = log
        checks.positive_int("patience", patience)
        self.workdir, self.patience, self.monitor, self.mode = workdir, patience, monitor, mode
        self.stopped, self.reason = False, None

    def on_train_begin(self, logs=None):
        self.stopped, self.reason = False, None

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self.monitor not in logs:
            return
        history = [e for e in read_metrics(self.workdir).get("history", [])
                   if e["epoch"] <= epoch]  # earlier epochs only (this one is in `logs`)
        history.append({"epoch": epoch + 1, self.monitor: float(logs[self.monitor])})
        best = best_epoch(history, self.monitor, self.mode)
        if best is not None and epoch + 1 - best >= self.patience:
            self.model.stop_training = self.stopped = True
            self.reason = (f"{self.monitor} did not improve for {self.patience} epochs (best "
                           f"at epoch {best})")
            if self.log is not None and is_chief():
                self.log(f"early stop: {self.reason}")
