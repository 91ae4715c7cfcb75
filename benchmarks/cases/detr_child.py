"""The ``detr`` case's child process, ``python -m cases.detr_child [--onednn]
[--torch-threads N]``: serves the case's commands (`workers.serve`), each answering
``{"rows": [Row as JSON, ...]}``.

torch and transformers' modeling code are imported first, then TensorFlow (the other order
crashes the process); torch runs on N threads (2 unless given: on a 2-core machine that
another job keeps busy, torch's 2 threads wait on each other for whole time slices, up to 100x
slower for a small model, so the tiny size asks for 1).
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
    import tensorflow as tf

    from cases import detr_steps

    handlers = {"steps": detr_steps.steps,
                "detr_train": detr_transformers.train, "detr_infer": detr_transformers.infer,
                "rtdetr_train": detr_rtdetr.train, "rtdetr_infer": detr_rtdetr.infer}
    workers.serve(handlers, ready={"tensorflow": tf.__version__, "torch": torch.__version__,
                                   "torch_threads": torch.get_num_threads(),
                                   "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS")})


if __name__ == "__main__":
    main(sys.argv[1:])
