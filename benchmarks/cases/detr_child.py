"""The ``detr`` case's child process: ``python -m cases.detr_child [--onednn] [--torch-threads
N]`` serves the case's commands (`workers.serve`), each answering ``{"rows": [Row as JSON,
...]}``.

torch and transformers' modeling code are imported first, then TensorFlow (the other order
crashes the process); torch runs on N threads (2 unless given), with denormal numbers flushed
to zero as TensorFlow's CPU kernels compute them (``torch.set_flush_denormal(True)``: without
it transformers' D-FINE at its own initialization trained about 10x slower, on denormals).
``--onednn``: TensorFlow's oneDNN kernels on (`tfx_transformer.quiet.onednn_default`), as
``train_detr.py`` runs; otherwise as TensorFlow decides (on by itself only on CPUs with
AVX-512), as ``detect.py`` and the server run. The first answer (``ready``) names these
settings; the case copies it into each row's extra (``process``).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import torch  # noqa: E402

from cases import detr_rtdetr, detr_transformers  # noqa: E402  (torch's modeling code first)
from tfx_transformer.quiet import onednn_default  # noqa: E402


def main(argv: list[str]) -> None:
    import workers

    if "--onednn" in argv:
        onednn_default()
    threads = argv[argv.index("--torch-threads") + 1] if "--torch-threads" in argv else 2
    torch.set_num_threads(int(threads))
    flush = torch.set_flush_denormal(True)  # False where the CPU cannot (not x86 with SSE3)
    import tensorflow as tf

    from cases import detr_steps

    handlers = {"steps": detr_steps.steps,
                "detr_train": detr_transformers.train, "detr_infer": detr_transformers.infer,
                "rtdetr_train": detr_rtdetr.train, "rtdetr_infer": detr_rtdetr.infer}
    workers.serve(handlers, ready={"tensorflow": tf.__version__, "torch": torch.__version__,
                                   "torch_threads": torch.get_num_threads(),
                                   "torch_flush_denormal": flush,
                                   "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS")})


if __name__ == "__main__":
    main(sys.argv[1:])
