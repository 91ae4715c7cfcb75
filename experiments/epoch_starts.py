"""What a training run does between an epoch's start and its first step.

    python experiments/epoch_starts.py detr|nmt [--minutes 2.8] [--eval-limit 16]

Runs ``train_detr`` / ``train_nmt`` in process on the embedded data with the tiny preset and a
time budget (as ``train_*.py --data embedded --preset tiny --time-budget MINUTES`` does, with
``--eval-limit`` so that validation stays short), and while each epoch starts — from the last
callback's ``on_epoch_begin`` to the first ``on_train_batch_begin`` — samples the main thread's
Python stack every 50 ms. Prints each epoch's start and its validation in seconds, then the
sampled stacks, most frequent first, and JSON last. A window where the process runs no Python
shows no samples: the time went to the machine, not to this program. Also lists Python's
full garbage collections and any slower than 50 ms (`gc.callbacks`). Not a test: it takes the
budget and more.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from budget import application  # noqa: E402

from tfx_transformer.training.run import RunOptions  # noqa: E402


class EpochStarts(keras.callbacks.Callback):
    """Times each epoch's start and validation; samples the stack while an epoch starts."""

    def __init__(self, interval: float = 0.05):
        super().__init__()
        self.starts: list[float] = []
        self.validations: list[float] = []
        self.samples: collections.Counter = collections.Counter()
        self._main = threading.get_ident()
        self._sampling = threading.Event()
        self._interval = interval
        self.collections: list[tuple[int, float, bool]] = []  # (generation, seconds, in a start)
        gc.callbacks.append(self._gc)
        threading.Thread(target=self._sample, daemon=True).start()

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_begin = time.perf_counter()
        elif info["generation"] == 2 or time.perf_counter() - self._gc_begin > 0.05:
            self.collections.append((info["generation"], time.perf_counter() - self._gc_begin,
                                     self._sampling.is_set()))

    def _sample(self) -> None:
        while True:
            time.sleep(self._interval)
            frame = sys._current_frames().get(self._main) if self._sampling.is_set() else None
            if frame is not None:
                stack = traceback.extract_stack(frame)[-6:]
                self.samples[" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                                         for f in reversed(stack))] += 1

    def on_epoch_begin(self, epoch, logs=None):
        self._begin = time.perf_counter()
        self._sampling.set()

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0:
            self._sampling.clear()
            self.starts.append(time.perf_counter() - self._begin)

    def on_test_begin(self, logs=None):
        self._test = time.perf_counter()

    def on_test_end(self, logs=None):
        self.validations.append(time.perf_counter() - self._test)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app", choices=("detr", "nmt"))
    parser.add_argument("--minutes", type=float, default=2.8)
    parser.add_argument("--eval-limit", type=int, default=16)
    args = parser.parse_args(argv)
    preset, train = application(args.app)
    probe = EpochStarts()
    with tempfile.TemporaryDirectory(prefix="epoch-starts-") as workdir:
        train("embedded", workdir, preset("tiny"),
              RunOptions(time_budget=args.minutes, eval_limit=args.eval_limit),
              callbacks=[probe], log=lambda *line: None)
    for epoch, (start, valid) in enumerate(zip(probe.starts, probe.validations), 1):
        print(f"epoch {epoch}: start {start:.3f} s, validation {valid:.2f} s")
    for generation, seconds, in_start in probe.collections:
        where = " (in an epoch start)" if in_start else ""
        print(f"gc generation {generation}: {seconds:.3f} s{where}")
    for stack, count in probe.samples.most_common(8):
        print(f"{count:5d} samples  {stack}")
    print(json.dumps({"app": args.app, "minutes": args.minutes,
                      "epoch_starts_s": [round(s, 3) for s in probe.starts],
                      "validation_s": [round(v, 2) for v in probe.validations],
                      "samples": sum(probe.samples.values()),
                      "gc_full_or_slow": [[g, round(t, 3), s] for g, t, s in probe.collections]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
