"""The `tf.distribute` strategy of a run and the multi-worker role of this process.

TensorFlow is allowed in the training plumbing (this module, `precision`, `workdir`,
`callbacks`, `cli`, `run`, `trainer`), nowhere else in ``tfx_transformer``.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

__all__ = ["STRATEGIES", "get_strategy", "is_chief", "task_index", "tf_config"]

STRATEGIES = ("auto", "mirrored", "multi_worker")


def tf_config() -> dict:
    """The parsed ``TF_CONFIG`` environment variable ({} when unset or not a JSON object).

    Raises:
        ValueError: ``TF_CONFIG`` is not valid JSON.
    """
    raw = os.environ.get("TF_CONFIG") or "{}"
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}). Received: {raw!r}") from None
    return config if isinstance(config, dict) else {}


def get_strategy(name: str) -> tf.distribute.Strategy:
    """Returns the `tf.distribute` strategy for ``--strategy NAME``.

    ``auto``: `MirroredStrategy` when more than one GPU is visible, else the default strategy.
    ``mirrored``: `MirroredStrategy` over all GPUs, or over all logical CPU devices when there
    is no GPU (that is how tests run it on two logical CPUs). ``multi_worker``:
    `MultiWorkerMirroredStrategy` from ``TF_CONFIG``; create it first thing in the program.

    Raises:
        ValueError: unknown ``name``, or ``multi_worker`` without a valid ``TF_CONFIG``.
    """
    if name == "auto":
        if len(tf.config.list_physical_devices("GPU")) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    if name == "multi_worker":
        config = tf_config()
        if not config.get("cluster") or not config.get("task"):
            raise ValueError(
                "`--strategy multi_worker` needs TF_CONFIG with 'cluster' and 'task'. "
                f"Received: TF_CONFIG={os.environ.get('TF_CONFIG')!r}"
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"`--strategy` must be one of {STRATEGIES}. Received: strategy={name!r}")


def task_index() -> int:
    """This process's ``TF_CONFIG`` task index (0 without ``TF_CONFIG``)."""
    return int((tf_config().get("task") or {}).get("index", 0))


def is_chief() -> bool:
    """True unless ``TF_CONFIG`` names this process a non-chief worker (who must not write)."""
    config = tf_config()
    task = config.get("task") or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in (None, "chief"):
        return True
    return kind == "worker" and index == 0 and "chief" not in (config.get("cluster") or {})
