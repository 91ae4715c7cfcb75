"""The first import of every command: TensorFlow starts without its log lines.

    from tfx_transformer.quiet import quiet_start
    quiet_start()

before anything else imports TensorFlow (this module and the packages above it import none).
Unless ``--verbose`` is on the command line or ``TFX_TRANSFORMER_VERBOSE=1`` is set, it sets
``TF_CPP_MIN_LOG_LEVEL=3`` (no C++ info, warning or error lines later, such as "failed call to
cuInit" on a machine without a GPU), keeps TensorFlow's and absl's Python loggers to errors,
and imports TensorFlow with the process's stderr (file descriptor 2) sent to /dev/null:
TensorFlow 2.21 writes its start-up lines ("oneDNN custom operations are on", "Could not find
cuda drivers", "All log messages before absl::InitializeLog() ...") while it loads, before any
log level applies. A failed import still raises, with stderr back in place.

The training commands also call `onednn_default` first: TensorFlow's oneDNN kernels on x86-64.
"""

from __future__ import annotations

import logging
import os
import platform
import sys

__all__ = ["onednn_default", "quiet_start", "verbose"]


def onednn_default() -> bool:
    """Sets ``TF_ENABLE_ONEDNN_OPTS=1`` on x86-64 unless the environment sets it; returns
    whether oneDNN is then asked for. Effective only before TensorFlow is imported.

    TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512; on a 2-core
    AVX2 CPU they made the DETR (ResNet-50) and the NMT train steps about 1.3x faster, but a
    ResNet-50 forward pass on one 512 px image 1.4x slower (experiments/README.md), so the
    training commands call this and the others do not. ``TF_ENABLE_ONEDNN_OPTS=0`` keeps
    them off.
    """
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "1"


def verbose(argv: list[str] | None = None) -> bool:
    """True when ``--verbose`` is in ``argv`` (default: the command line) or
    ``TFX_TRANSFORMER_VERBOSE`` is set to something else than ``0``."""
    argv = sys.argv[1:] if argv is None else argv
    return "--verbose" in argv or os.environ.get("TFX_TRANSFORMER_VERBOSE", "0") not in ("", "0")


def quiet_start(argv: list[str] | None = None) -> bool:
    """Imports TensorFlow without its start-up lines unless `verbose`; returns whether it did."""
    if verbose(argv):
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    if "tensorflow" in sys.modules:  # imported already (a test running a command's main)
        return True
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        import tensorflow  # noqa: F401  (its C++ start-up lines go to /dev/null)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    import absl.logging  # TensorFlow's dependency

    absl.logging.set_verbosity(absl.logging.ERROR)
    return True
