"""What a run's ``run.json`` decides: the data it continues, whether it still trains, and the
state every worker starts from (`tfx_transformer.training.trainer.Trainer` asks these)."""

from __future__ import annotations

import json

from tfx_transformer.training.data_spec import normalized
from tfx_transformer.training.distribute import broadcast_from_chief, is_chief
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.workdir import Workdir, read_state

__all__ = ["check_data", "needs_training", "read_run_state"]


def check_data(state: dict, data: str, run: RunOptions, root) -> tuple[str, dict | None]:
    """A work directory continues one data set, split alike: another ``--data``,
    ``--valid-fraction`` or ``--seed`` is an error (it would silently keep the earlier run's
    tokenizer and weights, or train on its held-out examples).

    Returns:
        ``(spec, split)``: the spec as recorded (paths made absolute), and the split a new run
        must record before anything derived from the data is written (None when recorded).
    """
    spec = normalized(data)
    split = {"valid_fraction": run.valid_fraction, "seed": run.seed}
    recorded, recorded_split = state.get("data"), state.get("split", split)
    if recorded is not None and recorded != spec:
        raise ValueError(
            f"--data {data}: {root} holds a run on --data {recorded}; go on with that --data, "
            "or use --restart (or a new --workdir) to train on new data")
    for name, value in recorded_split.items():
        if split[name] != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} {split[name]}: {root} holds a run with {flag} {value} (another split "
                f"would train on its held-out examples); go on with {flag} {value}, or use "
                "--restart (or a new --workdir)")
    return spec, (split if recorded is None else None)


def needs_training(state: dict, request: dict) -> bool:
    """False when the recorded fit already covers ``request`` (or is the same request).

    A finished fit is covered when its steps reach the request's step bound: ``max_steps``,
    or ``epochs`` times the recorded epoch length, whichever is smaller. Where the step bound
    says nothing (a run bounded by its time budget), the same request is covered and any
    other is not.
    """
    if state.get("phase", "training") == "training":
        return True
    steps, per_epoch = state.get("steps", 0), state.get("steps_per_epoch")
    bounds = [request["max_steps"]] if request["max_steps"] is not None else []
    if per_epoch:
        bounds.append(request["epochs"] * per_epoch)
    elif state.get("epochs", 0) >= request["epochs"]:  # a run.json without the epoch length
        return False
    if bounds and steps >= min(bounds):
        return False
    return request != state.get("request")


def read_run_state(workdir: Workdir, run: RunOptions, strategy) -> tuple[dict, int, int]:
    """``(run.json, the epochs the backup holds, the optimizer steps it holds)``: the chief's
    on every worker (broadcast by the chief under ``multi_worker``; the others have none), so
    that all of them take the same path. A worker that went on alone would wait for its peers
    in `fit` for ever."""
    state = read_state(workdir)
    try:
        metadata = json.loads((workdir.backup / "training_metadata.json").read_text())
        epoch, step = int(metadata.get("epoch", 0)), int(metadata.get("step", 0))
    except (OSError, ValueError, AttributeError):
        epoch, step = 0, 0  # none, or broken: `check_workdir` and the restore name it
    if run.strategy == "multi_worker":
        payload = json.dumps({"state": state, "epoch": epoch, "step": step}).encode("utf-8") \
            if is_chief() else None
        received = json.loads(broadcast_from_chief(payload, strategy).decode("utf-8"))
        state, epoch, step = received["state"], received["epoch"], received["step"]
    return state, epoch, step
