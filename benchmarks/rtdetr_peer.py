"""RT-DETR inference: our converted export against transformers' RTDetrForObjectDetection.

    python benchmarks/rtdetr_peer.py [--repeats 5] [--only r18,r50] [--batches 1,4]

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
from transformers import RTDetrConfig, RTDetrForObjectDetection, RTDetrImageProcessorPil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIDE = 640
# The published configurations' shapes (PekingU/rtdetr_r18vd and rtdetr_r50vd).
SIZES = {
    "r18": dict(backbone=dict(layer_type="basic", depths=[2, 2, 2, 2],
                              hidden_sizes=[64, 128, 256, 512], out_indices=[2, 3, 4]),
                model=dict(encoder_in_channels=[128, 256, 512], decoder_layers=3)),
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


def peer_model(size: str, folder: str) -> RTDetrForObjectDetection:
    """The size's RT-DETR of random weights (seed 0), saved to ``folder``.

    transformers' own initialization leaves the class head's scores of many encoder cells
    exactly equal (constant weights), which makes the top-300 selection a tie-break; every
    convolution and linear layer is drawn again at the scale of its fan-in and every norm's
    parameters and statistics randomized (as tests/vision/reference_rtdetr.py does), so that
    the two implementations select the same queries."""
    torch.manual_seed(0)
    settings = SIZES[size]
    backbone = transformers.RTDetrResNetConfig(**settings["backbone"])
    config = RTDetrConfig(backbone_config=backbone, num_labels=80, **settings["model"])
    model = RTDetrForObjectDetection(config).eval()
    with torch.no_grad():
        for path, module in model.named_modules():
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


def size_cases(size: str, batches: list[int], repeats: int) -> list[tuple[str, dict, int]]:
    import tensorflow as tf

    from vision.commands.convert import main as convert

    processor = RTDetrImageProcessorPil()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        peer = peer_model(size, os.path.join(tmp, "hf"))
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
            rows.append((f"RT-DETR {size}, batch {batch}, {SIDE} px", result, batch))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="r18,r50")
    parser.add_argument("--batches", default="1,4")
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
    for size in args.only.split(","):
        if size not in SIZES:
            parser.error(f"unknown size {size!r}: {', '.join(SIZES)}")
        rows.extend(size_cases(size, batches, args.repeats))
    print(f"{'case':<32}{'ours ms':>10}{'peer ms':>10}{'ratio':>8}{'speed-up':>10}")
    for label, r, batch in rows:
        print(f"{label:<32}{r['ours'] * 1e3:>10.0f}{r['peer'] * 1e3:>10.0f}{r['ratio']:>8.2f}"
              f"{1 / r['ratio']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
