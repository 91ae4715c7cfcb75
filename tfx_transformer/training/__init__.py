"""What both trainers share: TensorFlow is allowed here, and only here in `tfx_transformer`.

Eight modules, one job each, each importing only those above it in this list:

- `workdir`: every file a run writes (paths, the one atomic write, ``run.json``,
  ``metrics.json``, the export swap, the lock);
- `distribute`: the `tf.distribute` strategy, the worker's role, the dtype policy;
- `checkpoints`: which epochs' weights the export averages, and which checkpoints to keep;
- `run`: `RunOptions`, the `Task` protocol and its `RunContext`, what ``run.json`` decides;
- `saving`: the epoch's checkpoint and backup (never NaN, never half-written), the checks
  before a rerun, the testing hook;
- `callbacks`: the run's one clock, the stop rules, the progress line, the history;
- `cluster`: worker roles at run time: the peer watch, the chief's broadcast, agreement;
- `trainer`: `Trainer`, which drives a `Task` through its phases.

The commands' flags are in `tfx_transformer.cli`, learning-rate schedules in
`tfx_transformer.schedules`. Modules are imported on use: importing this package loads no
TensorFlow.
"""

__all__: list[str] = []
