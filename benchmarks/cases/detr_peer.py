"""DETR against transformers' DetrForObjectDetection (PyTorch) in the same process.

    python benchmarks/detr_peer.py [--repeats 5] [--only r50,small,infer]

Needs the ``[reference]`` extra (torch, transformers, timm). Both models are built with random
weights at the same size, both on 2 threads (``torch.set_num_threads(2)``; TensorFlow uses the
machine's 2 cores), and the two are timed alternately; each row prints ``ratio = ours / peer``
(lower is better), the median of the per-repeat ratios.

- ``r50``: vanilla DETR-R50 (6+6 layers, d 256, 100 queries, dropout 0.1), batch 2 at
  256×256; ``small``: ResNet-50 with a small Transformer (3+3 layers, d 128, 20 queries, FFN
  512), batch 4 at 128×128. One train step each: forward, the Hungarian-matched set loss with
  auxiliary losses, backward, clipping to a global norm of 0.1, AdamW (1e-4, backbone 1e-5,
  weight decay 1e-4). Ours: ``model.train_on_batch`` as ``train_detr.py`` compiles it
  (no XLA); theirs: ``model(pixel_values, pixel_mask, labels=...)`` with
  ``auxiliary_loss=True`` (its ``ForObjectDetectionLoss``, DETR's set loss), ``loss.backward()``,
  ``clip_grad_norm_``, ``torch.optim.AdamW``.
TensorFlow's oneDNN kernels are on when a train case is asked for (``train_detr.py`` turns them
on, `tfx_transformer.quiet.onednn_default`) and as TensorFlow decides otherwise (the
detection and serving commands): run ``--only infer`` alone for the inference figures.

- ``infer``: detection on 512×512 images, batches of 1 and 4. Ours: the exported SavedModel
  (uint8 images in; resize, normalization, model and box decoding inside); theirs: the eager
  model in ``eval()`` under ``torch.inference_mode()`` on normalized float pixels, then
  ``DetrImageProcessor.post_process_object_detection``. Prints images/s and
  ``speed-up = ours images/s / theirs``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

# transformers' DETR modeling code must be imported before TensorFlow (the other order
# crashes the process).
import numpy as np
import torch
import transformers
from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfx_transformer.quiet import onednn_default  # noqa: E402

NUM_CLASSES = 4
SMALL = dict(hidden_dim=128, num_heads=8, num_encoder_layers=3, num_decoder_layers=3,
             num_queries=20, ffn_dim=512)
SETTINGS = {"r50": (2, 256, {}), "small": (4, 128, SMALL)}  # batch, side, DetrConfig overrides
INFER_SIDE, INFER_BATCHES = 512, (1, 4)


def peer_config(overrides: dict) -> DetrConfig:
    d = overrides.get("hidden_dim", 256)
    heads = overrides.get("num_heads", 8)
    ffn = overrides.get("ffn_dim", 2048)
    id2label = {i: f"class{i}" for i in range(NUM_CLASSES)}
    return DetrConfig(
        use_pretrained_backbone=False, id2label=id2label,
        label2id={v: k for k, v in id2label.items()}, d_model=d,
        encoder_layers=overrides.get("num_encoder_layers", 6),
        decoder_layers=overrides.get("num_decoder_layers", 6),
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        num_queries=overrides.get("num_queries", 100), auxiliary_loss=True)


def targets(rng, batch: int, objects: int = 4):
    """``objects`` boxes (cx, cy, w, h in [0, 1]) and labels per image."""
    centres = rng.uniform(0.25, 0.75, (batch, objects, 2))
    sizes = rng.uniform(0.1, 0.4, (batch, objects, 2))
    boxes = np.concatenate([centres, sizes], -1).astype("float32")
    labels = rng.integers(0, NUM_CLASSES, (batch, objects)).astype("int32")
    return boxes, labels


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


def train_case(name: str, repeats: int) -> dict:
    import keras

    from vision.config import preset
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    batch, side, overrides = SETTINGS[name]
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, side, side, 3)).astype("float32")
    mask = np.ones((batch, side, side), bool)
    boxes, labels = targets(rng, batch)

    config = preset("r50-detr", batch_size=batch, image_size=side, max_image_size=side,
                    **overrides)
    keras.utils.set_random_seed(0)
    ours = build_model(config, NUM_CLASSES)
    ours.compile(optimizer=build_optimizer(config, ours),
                 criterion=build_criterion(config, NUM_CLASSES), jit_compile=False)
    x = {"images": images, "mask": mask}
    y = {"labels": labels, "boxes": boxes, "valid": np.ones(labels.shape, bool)}

    torch.manual_seed(0)
    peer = DetrForObjectDetection(peer_config(overrides))
    peer.train()
    named = [(n, p) for n, p in peer.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in named if "backbone" not in n]},
         {"params": [p for n, p in named if "backbone" in n], "lr": 1e-5}],
        lr=1e-4, weight_decay=1e-4)
    pixels = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
    pixel_mask = torch.ones((batch, side, side), dtype=torch.int64)
    peer_labels = [{"class_labels": torch.from_numpy(labels[i]).long(),
                    "boxes": torch.from_numpy(boxes[i])} for i in range(batch)]

    def peer_step():
        out = peer(pixel_values=pixels, pixel_mask=pixel_mask, labels=peer_labels)
        optimizer.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(peer.parameters(), 0.1)
        optimizer.step()

    print(f"{name}: params ours {ours.count_params():,}, "
          f"transformers {sum(p.numel() for p in peer.parameters()):,}", flush=True)
    return alternate({"ours": lambda: ours.train_on_batch(x, y), "peer": peer_step}, repeats)


def infer_cases(repeats: int) -> list[tuple[str, dict]]:
    import tensorflow as tf

    from vision.config import preset
    from vision.export.saved_model import export_detector
    from vision.modeling.detr import build_model

    config = preset("r50-detr", image_size=INFER_SIDE, max_image_size=INFER_SIDE)
    ours = build_model(config, NUM_CLASSES)
    torch.manual_seed(0)
    peer = DetrForObjectDetection(peer_config({})).eval()
    processor = DetrImageProcessor()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        export_detector(ours, os.path.join(tmp, "export"), [f"class{i}" for i in range(4)],
                        INFER_SIDE, INFER_SIDE)
        print(f"export: {time.perf_counter() - start:.0f} s", flush=True)
        detect = tf.saved_model.load(os.path.join(tmp, "export")).signatures["serving_default"]
        rng = np.random.default_rng(0)
        mean = np.array([0.485, 0.456, 0.406], "float32")
        std = np.array([0.229, 0.224, 0.225], "float32")
        for batch in INFER_BATCHES:
            images = rng.integers(0, 256, (batch, INFER_SIDE, INFER_SIDE, 3), dtype=np.uint8)
            pixels = torch.from_numpy(
                ((images / 255.0 - mean) / std).astype("float32").transpose(0, 3, 1, 2).copy())
            sizes = [(INFER_SIDE, INFER_SIDE)] * batch

            def peer_detect(pixels=pixels, sizes=sizes):
                with torch.inference_mode():
                    out = peer(pixel_values=pixels)
                    processor.post_process_object_detection(out, threshold=0.0,
                                                            target_sizes=sizes)

            feed = tf.constant(images)
            result = alternate({"ours": lambda feed=feed: detect(images=feed)["scores"].numpy(),
                                "peer": peer_detect}, repeats)
            rows.append((f"inference, batch {batch}, {INFER_SIDE} px", result, batch))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="r50,small,infer")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if set(args.only.split(",")) & set(SETTINGS):
        onednn_default()  # as train_detr.py runs (detect.py and serving do not: TensorFlow's)
    import keras
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cores, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}", flush=True)
    rows = []
    for name in args.only.split(","):
        if name in SETTINGS:
            batch, side, _ = SETTINGS[name]
            rows.append((f"train step {name}, batch {batch}, {side} px",
                         train_case(name, args.repeats), None))
        elif name == "infer":
            rows.extend(infer_cases(args.repeats))
        else:
            parser.error(f"unknown case {name!r}: r50, small or infer")
    print(f"{'case':<36}{'ours ms':>10}{'peer ms':>10}{'ratio':>8}{'speed-up':>10}")
    for label, r, batch in rows:
        speed = "" if batch is None else f"{1 / r['ratio']:>10.2f}"
        print(f"{label:<36}{r['ours'] * 1e3:>10.0f}{r['peer'] * 1e3:>10.0f}{r['ratio']:>8.2f}"
              f"{speed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
