"""DETR-family detection: our DETR's train step (the Hungarian matcher's share, the step
XLA-compiled), and DETR, RT-DETR and D-FINE against transformers' PyTorch models (train
steps and inference), each pair in one process.

Rows, in order (every pair timed in alternating rounds after a warm-up; ratio = ours / peer,
below 1 ours is faster):

- our DETR train step (`cases.detr_steps`), per setting: the whole step XLA-compiled with the
  ``keras.ops`` solver against the default step (no XLA, the scipy solver); the matcher alone
  on the same outputs, ``keras.ops`` against scipy (the scipy matcher's share of the default
  step in the row's extra); for the setting marked ``reference``, the default step over the
  0.34 s/step of facebookresearch/detr's reference CPU run (vanilla ``tiny-detr``, batch 16,
  128 px; not timed here);
- DETR against transformers' ``DetrForObjectDetection`` (`cases.detr_transformers`): one
  train step (with TensorFlow's oneDNN kernels on, as ``train_detr.py``), and detection by
  our exported SavedModel against the eager model plus its post-processing (oneDNN as
  TensorFlow decides, as ``detect.py``);
- RT-DETR, then D-FINE, against transformers' ``RTDetrForObjectDetection`` /
  ``DFineForObjectDetection`` (`cases.detr_rtdetr`), the same weights on both sides (ours
  converted by ``tfx-convert-detr``): detection by our export against the eager model, one
  train step, and at the ``tiny`` size our RT-DETR / D-FINE step against our DETR ``tiny``.

Sizes. ``standard``: the original scripts' defaults took well over 10 minutes on 2 cores (XLA
compiles each DETR step for about a minute), so it keeps their smaller settings: our DETR step
at ``tiny`` batch 2 and 16 and ``tiny-detr`` batch 16, all 128 px (not ``r50-detr`` batch 2 at
256 px); DETR against transformers at ``small`` (ResNet-50, 3+3 layers, d 128, 20 queries,
batch 4, 128 px; not DETR-R50 batch 2 at 256 px) and inference of DETR-R50 at 512 px, batch 1
(not 4); RT-DETR inference at r18 (not r50) and D-FINE at ``n`` (the smallest published),
640 px, batches 1 and 4; both train steps at ``tiny`` (batch 16, 128 px; not r18 / ``s`` at
640 px); 5 repeats. ``tiny``: every row at the smallest configurations (64 px, batch 1, one
layer where a config allows it, the 4-conv backbone and a one-block-per-stage ResNet instead of
ResNet-50), 1 repeat, one child process, torch on 1 thread, XLA at its cheapest optimization
level: it checks that every row runs, not the figures.
"""

from __future__ import annotations

import harness
import workers

DESCRIPTION = ("DETR train step (matcher share, XLA); DETR, RT-DETR and D-FINE against "
               "transformers: train steps and inference")

# DetrConfig fields of the `small` model of DETR against transformers (ResNet-50 backbone).
SMALL = dict(hidden_dim=128, num_heads=8, num_encoder_layers=3, num_decoder_layers=3,
             num_queries=20, ffn_dim=512)
TINY_DETR = dict(hidden_dim=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                 num_queries=10, ffn_dim=64)
# transformers' D-FINE ties the box heads of decoder layers 1... to layer 0's: 2 layers at least.
TINY_RT = {"rtdetr": {"decoder_layers": 1, "encoder_layers": 1},
           "dfine": {"decoder_layers": 2, "encoder_layers": 1}}

SIZES = {
    "tiny": {
        # One child: the train step against transformers with TensorFlow's default oneDNN too
        # (a second TensorFlow + torch start saved; the figures are not the point here).
        "repeats": 1, "warmup": 1, "onednn_child": False,
        # torch on one thread: two spin-wait each other's turn on a busy 2-core machine
        "torch_threads": 1,
        # XLA's compilation of the train step at its cheapest (it checks the row, not its time)
        "xla_flags": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
        "steps": [{"preset": "tiny", "batch": 1, "side": 64, "objects": 2, "reference": True,
                   "overrides": {"num_encoder_layers": 1, "num_decoder_layers": 1}}],
        "detr_train": [{"name": "tiny", "batch": 1, "side": 64, "backbone": "tiny",
                        "model": TINY_DETR}],
        "detr_infer": {"side": 64, "batches": [1], "backbone": "tiny", "model": TINY_DETR},
        # Each family's code once (RT-DETR's inference, D-FINE's train step and criterion):
        # every row kind runs at half the cost of both families twice.
        "rtdetr_infer": [{"family": "rtdetr", "size": "tiny", "side": 64, "batches": [1],
                          "config": TINY_RT["rtdetr"]}],
        "rtdetr_train": [{"family": family, "size": "tiny", "side": 64, "batch": 1,
                          "classes": 3, "denoising": False, "config": TINY_RT[family],
                          "detr_overrides": {"num_encoder_layers": 1, "num_decoder_layers": 1}}
                         for family in ("dfine",)],
    },
    "standard": {
        "repeats": 5, "warmup": 1, "onednn_child": True, "torch_threads": 2,
        "steps": [{"preset": "tiny", "batch": 2, "side": 128, "objects": 4},
                  {"preset": "tiny", "batch": 16, "side": 128, "objects": 4},
                  {"preset": "tiny-detr", "batch": 16, "side": 128, "objects": 4,
                   "reference": True}],
        "detr_train": [{"name": "small", "batch": 4, "side": 128, "backbone": "resnet50",
                        "model": SMALL}],
        "detr_infer": {"side": 512, "batches": [1], "backbone": "resnet50", "model": {}},
        "rtdetr_infer": [{"family": "rtdetr", "size": "r18", "side": 640, "batches": [1, 4]},
                         {"family": "dfine", "size": "n", "side": 640, "batches": [1, 4]}],
        "rtdetr_train": [{"family": family, "size": "tiny", "side": 128, "batch": 16,
                          "classes": 3, "denoising": False} for family in ("rtdetr", "dfine")],
    },
}


def start_children(workdir, size: dict) -> dict[str, workers.Worker]:
    """The children, started together (their imports overlap; nothing is timed meanwhile):
    ``default`` (TensorFlow's oneDNN as it decides) and, where ``size["onednn_child"]``,
    ``onednn`` (its kernels on) for the train step against transformers."""
    env = workers.child_env(**({"XLA_FLAGS": size["xla_flags"]} if size.get("xla_flags")
                               else {}))
    children = {}
    try:
        for name in ["default"] + (["onednn"] if size["onednn_child"] else []):
            children[name] = workers.Worker(
                [workers.PY, "-m", "cases.detr_child", "--torch-threads",
                 str(size["torch_threads"])] + (["--onednn"] if name == "onednn" else []),
                log=workdir / f"{name}.log", env=env, wait=False)
        for worker in children.values():
            worker.wait_ready()
    except BaseException:
        for worker in children.values():
            worker.kill()
        raise
    return children


def run(size: dict, workdir) -> list[harness.Row]:
    timing = {"repeats": size["repeats"], "warmup": size["warmup"]}
    rows = []
    children = start_children(workdir, size)
    default = children["default"]

    def ask(worker: workers.Worker, command: str, setting: dict) -> None:
        for row in worker.ask(command, {**setting, **timing})["rows"]:
            row["extra"]["process"] = worker.ready  # torch threads, oneDNN, versions
            rows.append(harness.Row(**row))

    try:
        for setting in size["steps"]:
            ask(default, "steps", setting)
        for setting in size["detr_train"]:
            ask(children.get("onednn", default), "detr_train", setting)
        if "onednn" in children:
            children["onednn"].close()
        ask(default, "detr_infer", size["detr_infer"])
        for family in ("rtdetr", "dfine"):
            for command in ("rtdetr_infer", "rtdetr_train"):
                for setting in size[command]:
                    if setting["family"] == family:
                        ask(default, command, setting)
        default.close()
    finally:
        for worker in children.values():
            worker.kill()
    return rows
