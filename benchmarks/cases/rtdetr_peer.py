"""RT-DETR and D-FINE inference and training steps: ours against transformers'
RTDetrForObjectDetection / DFineForObjectDetection.

    python benchmarks/rtdetr_peer.py [--repeats 5] [--only r18,r50] [--batches 1,4]
    python benchmarks/rtdetr_peer.py --train [--repeats 5] [--only tiny,r18] [--denoising]
    python benchmarks/rtdetr_peer.py --family dfine [--only s] / --train [--only tiny,s]

``--family dfine``: the same with D-FINE (the published configurations of our ``dfine-*``
presets, `vision.pretrained.dfine_config.ARCHITECTURES`, built by transformers from those
config.json fields; ``tiny`` the ``dfine-tiny`` preset's), its criterion with FGL and DDF on our
side.

Needs the ``[reference]`` extra (torch, transformers). For each size, transformers builds the
``RTDetrForObjectDetection`` of ``PekingU/rtdetr_r18vd`` / ``rtdetr_r50vd``'s configuration
(80 classes, 300 queries, 640x640) with random weights and saves it; ``tfx-convert-detr``
converts that folder (the same weights), and its ``Detector`` SavedModel is loaded. Detection
on 640x640 uint8 images, batches of 1 and 4: ours is the export's ``serving_default`` (uint8 in;
the resize, scaling, model and post-processing inside); transformers' is the eager model in
``eval()`` under ``torch.inference_mode()`` on the image processor's pixels (processing not
timed), then ``post_process_object_detection``. Both on 2 threads (``torch.set_num_threads(2)``;
TensorFlow uses the machine's 2 cores, oneDNN as TensorFlow decides, as ``detect.py`` and the
server run), timed alternately after a warm-up; each row prints the medians and
``ratio = ours / peer`` (the median of the per-repeat ratios; lower is better) and
``speed-up`` (its inverse: images/s, ours over theirs). The detections of the two are compared
on the first batch (the largest score difference is printed).

``--train``: one optimizer step on a fixed batch (3 objects per image), of the same weights on
both sides: ours is the converted model compiled as ``train_detr.py`` compiles it (DETR's AdamW:
1e-4, the backbone at 1e-5, weight decay 1e-4, global clipping at 0.1; `rtdetr_criterion`)
and run by Keras's ``train_on_batch``; transformers' is ``RTDetrForObjectDetection(labels=)``
in ``train()`` mode, ``backward``, clipping and ``torch.optim.AdamW`` with the same two rates.
Denoising queries are off on both sides (``num_denoising=0``), or with ``--denoising`` on
both, as training runs them: each side's own draw of the configuration's count (the
``rtdetr-tiny`` preset's 8, the published r18's 100), ours given the targets in its inputs.
Sizes:
``tiny``, the ``rtdetr-tiny`` preset's model (128 px, batch 16, 20 queries, 3 classes), where
the row of DETR's ``tiny`` preset (the same images, ImageNet-normalized, with their mask) is
timed alongside ours too, and ``r18`` (640 px, batch 2, 300 queries, 80 classes).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

# transformers' PyTorch modeling code must be imported before TensorFlow (the other order
# crashes the process).
import numpy as np
import torch
import transformers
from transformers import (
    DFineConfig,
    DFineForObjectDetection,
    RTDetrConfig,
    RTDetrForObjectDetection,
    RTDetrImageProcessorPil,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIDE = 640
# The published configurations' shapes (PekingU/rtdetr_r18vd and rtdetr_r50vd).
SIZES = {
    "r18": dict(backbone=dict(layer_type="basic", depths=[2, 2, 2, 2],
                              hidden_sizes=[64, 128, 256, 512], out_indices=[2, 3, 4]),
                model=dict(encoder_in_channels=[128, 256, 512], hidden_expansion=0.5,
                           decoder_layers=3)),
    "r50": dict(backbone=dict(out_indices=[2, 3, 4]), model={}),
}


def alternate(fns: dict, repeats: int) -> dict:
    """Median seconds of each function and the median ratio of the first to the second."""
    for fn in fns.values():
        fn()  # warm-up (tracing, allocation)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ours, peer = times.values()
    return {"ours": statistics.median(ours), "peer": statistics.median(peer),
            "ratio": statistics.median(a / b for a, b in zip(ours, peer))}


def peer_config(family: str, size: str, classes: int):
    """transformers' config of a size (``tiny``: the family's tiny preset's)."""
    if family == "dfine":
        from vision.pretrained.dfine_config import ARCHITECTURES

        fields = {key: value for key, value in ARCHITECTURES[size].items()
                  if key != "model_type"}
        backbone = transformers.HGNetV2Config(**fields.pop("backbone_config"))
        queries = {"num_queries": 20} if size == "tiny" else {}
        return DFineConfig(backbone_config=backbone, num_labels=classes, **queries, **fields)
    if size == "tiny":
        from vision.config import preset

        tiny = preset("rtdetr-tiny")
        return RTDetrConfig(**{**tiny.rtdetr, "num_queries": tiny.num_queries,
                               "num_labels": classes})
    settings = SIZES[size]
    backbone = transformers.RTDetrResNetConfig(**settings["backbone"])
    return RTDetrConfig(backbone_config=backbone, num_labels=classes, **settings["model"])


def peer_model(size: str, folder: str, family: str = "rtdetr", classes: int = 80,
               randomize: bool = True):
    """The size's model of the family (random weights, seed 0), saved to ``folder``.

    transformers' own initialization leaves the class head's scores of many encoder cells
    exactly equal (constant weights), which makes the top-300 selection a tie-break; every
    convolution and linear layer is drawn again at the scale of its fan-in and every norm's
    parameters and statistics randomized (as tests/vision/pretrained/reference_rtdetr.py does), so
    that the two implementations select the same queries."""
    torch.manual_seed(0)
    config = peer_config(family, size, classes)
    model = (DFineForObjectDetection if family == "dfine" else RTDetrForObjectDetection)(
        config).eval()
    with torch.no_grad():
        for path, module in model.named_modules() if randomize else ():
            gain = 2.0 if ".backbone." in f".{path}" else 1.0
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
            elif isinstance(module, torch.nn.Conv2d):
                module.weight.normal_(0.0, (gain / module.weight[0].numel()) ** 0.5)
            elif isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features ** -0.5)
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return model


def size_cases(size: str, batches: list[int], repeats: int, family: str = "rtdetr"
               ) -> list[tuple[str, dict, int]]:
    import tensorflow as tf

    from vision.commands.convert import main as convert

    processor = RTDetrImageProcessorPil()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        peer = peer_model(size, os.path.join(tmp, "hf"), family)
        params = sum(p.numel() for p in peer.parameters())
        start = time.perf_counter()
        assert convert([os.path.join(tmp, "hf"), "--out", os.path.join(tmp, "ours")]) == 0
        print(f"{size}: {params / 1e6:.1f} M parameters, conversion and export "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        detect = tf.saved_model.load(os.path.join(tmp, "ours", "export")).signatures[
            "serving_default"]
        rng = np.random.default_rng(0)
        for batch in batches:
            images = rng.integers(0, 256, (batch, SIDE, SIDE, 3), dtype=np.uint8)
            pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
            sizes = [(SIDE, SIDE)] * batch

            def peer_detect(pixels=pixels, sizes=sizes):
                with torch.inference_mode():
                    out = peer(pixel_values=pixels)
                    return processor.post_process_object_detection(out, threshold=0.0,
                                                                   target_sizes=sizes)

            feed = tf.constant(images)
            if batch == batches[0]:
                ours = detect(images=feed)["scores"].numpy()
                theirs = np.stack([d["scores"].numpy() for d in peer_detect()])
                print(f"{size}: largest score difference on batch {batch}: "
                      f"{np.abs(ours - theirs).max():.1e}", flush=True)
            result = alternate({"ours": lambda feed=feed: detect(images=feed)["scores"].numpy(),
                                "peer": peer_detect}, repeats)
            rows.append((f"{NAMES[family]} {size}, batch {batch}, {SIDE} px", result, batch))
    return rows


TRAIN = {"tiny": dict(side=128, batch=16, classes=3),
         "r18": dict(side=SIDE, batch=2, classes=80), "s": dict(side=SIDE, batch=2, classes=80)}
NAMES = {"rtdetr": "RT-DETR", "dfine": "D-FINE"}


def peer_training_model(size: str, folder: str, denoising: bool = False,
                        family: str = "rtdetr"):
    """`peer_model` for ``--train``: ``tiny`` is the family's tiny preset's configuration
    (transformers' initialization); denoising off unless ``denoising``."""
    model = peer_model(size, folder, family, TRAIN[size]["classes"], randomize=size != "tiny")
    if not denoising:
        model.config.num_denoising = 0
    return model.train()


def train_cases(size: str, repeats: int, denoising: bool = False, family: str = "rtdetr"
                ) -> list[tuple[str, dict, int]]:
    from vision.config import preset
    from vision.modeling.optimizer import build_optimizer
    from vision.pretrained.rtdetr import load_rtdetr

    side, batch, classes = (TRAIN[size][k] for k in ("side", "batch", "classes"))
    rng = np.random.default_rng(0)
    images = rng.random((batch, side, side, 3), dtype=np.float32)  # pixels / 255
    count = 3
    boxes = np.concatenate([rng.uniform(0.3, 0.7, (batch, count, 2)),
                            rng.uniform(0.1, 0.3, (batch, count, 2))], -1).astype("float32")
    labels = rng.integers(0, classes, (batch, count)).astype("int32")
    targets = {"labels": labels, "boxes": boxes, "valid": np.ones((batch, count), bool)}
    config = preset(f"{family}-{size}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        peer = peer_training_model(size, os.path.join(tmp, "hf"), denoising, family)
        ours = load_rtdetr(os.path.join(tmp, "hf"))
        ours.compile(optimizer=build_optimizer(config, ours),
                     criterion=ours.default_criterion())
        backbone = [p for n, p in peer.named_parameters() if ".backbone." in f".{n}"]
        rest = [p for n, p in peer.named_parameters() if ".backbone." not in f".{n}"]
        optimizer = torch.optim.AdamW([{"params": rest, "lr": config.learning_rate},
                                       {"params": backbone, "lr": config.learning_rate *
                                        config.backbone_lr_multiplier}],
                                      weight_decay=config.weight_decay)
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
        peer_labels = [{"class_labels": torch.from_numpy(labels[i]).long(),
                        "boxes": torch.from_numpy(boxes[i])} for i in range(batch)]

        def peer_step():
            optimizer.zero_grad()
            loss = peer(pixel_values=pixels, labels=peer_labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(peer.parameters(), config.clip_norm)
            optimizer.step()
            return float(loss)

        inputs = {"images": images, "targets": targets} if denoising else images

        def ours_step():
            return float(ours.train_on_batch(inputs, targets, return_dict=True)["loss"])

        result = alternate({"ours": ours_step, "peer": peer_step}, repeats)
        rows.append((f"{NAMES[family]} {size} train{' +dn' if denoising else ''}, batch "
                     f"{batch}, {side} px", result, batch))
        if size == "tiny" and not denoising:  # DETR's tiny preset on the same images
            from vision.modeling.detr import build_criterion, build_model

            detr_config = preset("tiny")
            detr = build_model(detr_config, classes)
            detr.compile(optimizer=build_optimizer(detr_config, detr),
                         criterion=build_criterion(detr_config, classes))
            mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
            inputs = {"images": ((images - mean) / std).astype("float32"),
                      "mask": np.ones(images.shape[:3], bool)}
            result = alternate({"ours": ours_step,
                                "peer": lambda: float(detr.train_on_batch(inputs, targets,
                                                                 return_dict=True)["loss"])},
                               repeats)
            rows.append((f"{NAMES[family]} tiny / DETR tiny train, batch {batch}", result,
                         batch))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="r18,r50")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--train", action="store_true", help="optimizer steps (see above)")
    parser.add_argument("--family", choices=sorted(NAMES), default="rtdetr")
    parser.add_argument("--denoising", action="store_true",
                        help="--train with denoising queries on both sides")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cores, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}", flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    sizes = TRAIN if args.train else SIZES
    if args.family == "dfine":
        from vision.pretrained.dfine_config import ARCHITECTURES

        sizes = ARCHITECTURES if not args.train else {"tiny", "s"}
    for size in args.only.split(","):
        if size not in sizes:
            parser.error(f"unknown size {size!r}: {', '.join(sizes)}")
        rows.extend(train_cases(size, args.repeats, args.denoising, args.family) if args.train
                    else size_cases(size, batches, args.repeats, args.family))
    print(f"{'case':<44}{'ours ms':>10}{'peer ms':>10}{'ratio':>8}{'speed-up':>10}"
          f"{'ours img/s':>12}")
    for label, r, batch in rows:
        print(f"{label:<44}{r['ours'] * 1e3:>10.0f}{r['peer'] * 1e3:>10.0f}{r['ratio']:>8.2f}"
              f"{1 / r['ratio']:>10.2f}{batch / r['ours']:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
