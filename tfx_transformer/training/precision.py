"""The global Keras dtype policy of a run (``--mixed-precision``).

``auto`` picks ``bfloat16`` where the hardware computes it fast, else ``none`` (float32):
a GPU of compute capability 8.0 or newer (Ampere, Hopper: bf16 tensor cores), or a CPU with
AMX tiles for bf16 (``amx_bf16`` in ``/proc/cpuinfo``). A CPU with AVX512-BF16 alone only
converts and dots pairs of bf16 values; on it a bf16 train step of our models measured slower
than float32 (``benchmarks/precision.py``), so ``auto`` keeps float32 there.
"""

from __future__ import annotations

import os

import keras

__all__ = ["MIXED_PRECISION", "fast_bfloat16", "resolve_mixed_precision",
           "set_mixed_precision"]

# ``--mixed-precision`` value -> Keras dtype policy name (``auto``: resolved first).
MIXED_PRECISION = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16",
                   "auto": None}


def _cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def fast_bfloat16(cpu_flags: set[str] | None = None, gpus: list[dict] | None = None) -> str | None:
    """Why bf16 is fast here (``"GPU compute capability 9.0"``, ``"CPU amx_bf16"``), or None.

    Args:
        cpu_flags: the CPU's flags (default: read from ``/proc/cpuinfo``).
        gpus: device details of the visible GPUs, each with ``compute_capability`` as a
            ``(major, minor)`` pair (default: asked of TensorFlow, when it is loaded).
    """
    if gpus is None:
        gpus = []
        if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
            import tensorflow as tf

            gpus = [tf.config.experimental.get_device_details(d)
                    for d in tf.config.list_physical_devices("GPU")]
    for details in gpus:
        capability = tuple(details.get("compute_capability") or (0, 0))
        if capability >= (8, 0):
            return f"GPU compute capability {capability[0]}.{capability[1]}"
    if gpus:
        return None  # the GPU computes; an older one has no bf16 tensor cores
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    return "CPU amx_bf16" if "amx_bf16" in flags else None


def resolve_mixed_precision(name: str, **detect) -> str:
    """``name`` with ``auto`` replaced: ``bfloat16`` where `fast_bfloat16`, else ``none``.

    Raises:
        ValueError: unknown ``name``.
    """
    if name not in MIXED_PRECISION:
        raise ValueError(
            f"`--mixed-precision` must be one of {tuple(MIXED_PRECISION)}. Received: {name!r}"
        )
    if name != "auto":
        return name
    return "bfloat16" if fast_bfloat16(**detect) else "none"


def set_mixed_precision(name: str) -> str:
    """Sets the global Keras dtype policy for ``--mixed-precision none|bfloat16|float16|auto``.

    Returns:
        The policy name set: ``float32``, ``mixed_bfloat16`` or ``mixed_float16``.

    Raises:
        ValueError: unknown ``name``.
    """
    policy = MIXED_PRECISION[resolve_mixed_precision(name)]
    keras.config.set_dtype_policy(policy)
    return policy
