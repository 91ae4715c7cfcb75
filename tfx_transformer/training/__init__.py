"""What both trainers share: TensorFlow is allowed here, and only here in `tfx_transformer`.

- `run`: `RunOptions`, the options of one run; `trainer`: `Trainer`, which drives a task
  through fit, export, evaluation and ``metrics.json``.
- `distribute` (strategies, cross-replica sums), `precision` (dtype policies), `bounds` (time
  and step limits, the progress line), `callbacks` (resume, checkpoints, logs, guards),
  `checkpoints` (averaging, the best epoch, which checkpoints to keep), `saving` (the epoch's
  checkpoint and backup, never NaN, with room on the disk), `h5files` (weights files written
  atomically, checked, stripped of the optimizer), `workdir` (the work directory and its records),
  `schedules` (learning-rate schedules), `cli` (the commands' shared flags), `quiet` (their
  quiet start), `export_dir` (writing an export directory so that a failure keeps the
  previous export).

Modules are imported on use, so importing this package loads no TensorFlow.
"""

__all__: list[str] = []
