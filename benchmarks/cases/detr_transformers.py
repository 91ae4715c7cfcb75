"""The ``detr`` case's DETR against transformers' DetrForObjectDetection (PyTorch), in the same
process (the case's child, `cases.detr_child`).

Both models are built with random weights at the same size; torch runs on 2 threads
(``torch.set_num_threads(2)``), TensorFlow on the machine's cores; the two are timed in
alternating rounds after a warm-up. transformers' backbone is its own ResNet
(``use_timm_backbone=False``: timm needs torchvision, not installed beside a CPU torch):
ResNet-50 v1.5 as torchvision's, its stem and first stage frozen as DETR's and ours (the
trained weights are the same on both sides), or, for the ``tiny`` backbone of the tiny size, a
4-stage ResNet of one basic block each (ours: the 4-conv ``tiny`` backbone).

- `train`: one train step: forward, the Hungarian-matched set loss with auxiliary losses,
  backward, clipping to a global norm of 0.1, AdamW (1e-4, backbone 1e-5, weight decay 1e-4).
  Ours: ``model.train_on_batch`` of the ``r50-detr`` preset as ``train_detr.py`` compiles it
  (no XLA; the case runs it with TensorFlow's oneDNN kernels on, as ``train_detr.py`` does);
  theirs: ``model(pixel_values, pixel_mask, labels=...)`` with ``auxiliary_loss=True`` (its
  DETR set loss), ``loss.backward()``, ``clip_grad_norm_``, ``torch.optim.AdamW``.
- `infer`: detection of uint8 images. Ours: the exported SavedModel (resize, normalization,
  model and box decoding inside); theirs: the eager model in ``eval()`` under
  ``torch.inference_mode()`` on normalized float pixels, then the image processor's
  ``post_process_object_detection``. TensorFlow's oneDNN as TensorFlow decides (as
  ``detect.py`` and the server run).
"""

from __future__ import annotations

import os
import tempfile
import time

import harness
import numpy as np
import torch
import transformers
from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessorPil

NUM_CLASSES = 4
OURS, PEER = "ours", "transformers"
MEAN = np.array([0.485, 0.456, 0.406], "float32")
STD = np.array([0.229, 0.224, 0.225], "float32")


def peer_backbone(name: str):
    """transformers' ResNet for our backbone ``name`` (``resnet50`` or ``tiny``)."""
    if name == "resnet50":
        return transformers.ResNetConfig(depths=[3, 4, 6, 3], layer_type="bottleneck",
                                         downsample_in_bottleneck=False,
                                         out_features=["stage4"])
    if name == "tiny":
        return transformers.ResNetConfig(depths=[1, 1, 1, 1], layer_type="basic",
                                         embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                         out_features=["stage4"])
    raise ValueError(f"no transformers backbone for {name!r}")


def peer_config(overrides: dict, backbone: str) -> DetrConfig:
    d = overrides.get("hidden_dim", 256)
    heads = overrides.get("num_heads", 8)
    ffn = overrides.get("ffn_dim", 2048)
    id2label = {i: f"class{i}" for i in range(NUM_CLASSES)}
    return DetrConfig(
        use_timm_backbone=False, backbone_config=peer_backbone(backbone),
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


def _ours_config(payload: dict, **fields):
    from vision.config import preset

    return preset("r50-detr", backbone=payload["backbone"], **payload["model"], **fields)


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def train(payload: dict) -> dict:
    """One row: ``name``, ``batch``, ``side``, ``model`` (DetrConfig overrides), ``backbone``,
    ``repeats``, ``warmup``."""
    import keras

    from cases.detr_steps import call
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    batch, side, overrides = payload["batch"], payload["side"], payload["model"]
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, side, side, 3)).astype("float32")
    mask = np.ones((batch, side, side), bool)
    boxes, labels = targets(rng, batch)

    config = _ours_config(payload, batch_size=batch, image_size=side, max_image_size=side)
    keras.utils.set_random_seed(0)
    ours = build_model(config, NUM_CLASSES)
    ours.compile(optimizer=build_optimizer(config, ours),
                 criterion=build_criterion(config, NUM_CLASSES), jit_compile=False)
    x = {"images": images, "mask": mask}
    y = {"labels": labels, "boxes": boxes, "valid": np.ones(labels.shape, bool)}

    torch.manual_seed(0)
    peer = DetrForObjectDetection(peer_config(overrides, payload["backbone"]))
    peer.train()
    # transformers' DetrConvEncoder trains what timm's names call layer2-4, but on its own
    # ResNet its test ("stage.1" in the name, the names say "stages.1") freezes every backbone
    # weight: train stages 1-3 (layer2-4) as DETR and ours do (stem and layer1 frozen).
    for name, parameter in peer.model.backbone.model.named_parameters():
        parameter.requires_grad_(any(f"stages.{i}." in name for i in (1, 2, 3)))
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

    times = harness.alternate({OURS: call(ours.train_on_batch, x, y), PEER: peer_step},
                              payload["repeats"], payload["warmup"])
    settings = {key: payload[key] for key in ("name", "batch", "side", "model", "backbone")}
    row = harness.compare(
        f"DETR {payload['name']} train step, batch {batch}, {side} px", times, OURS, PEER,
        settings=settings, extra={
            "params": {OURS: ours.count_params(), PEER: _params(peer)}})
    return {"rows": [row.to_json()]}


def infer(payload: dict) -> dict:
    """One row per batch: ``side``, ``batches``, ``model``, ``backbone``, ``repeats``,
    ``warmup``."""
    import tensorflow as tf

    from vision.export.saved_model import export_detector
    from vision.modeling.detr import build_model

    side, overrides = payload["side"], payload["model"]
    ours = build_model(_ours_config(payload, image_size=side, max_image_size=side),
                       NUM_CLASSES)
    torch.manual_seed(0)
    peer = DetrForObjectDetection(peer_config(overrides, payload["backbone"])).eval()
    processor = DetrImageProcessorPil()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        export_detector(ours, os.path.join(tmp, "export"),
                        [f"class{i}" for i in range(NUM_CLASSES)], side, side)
        export_s = time.perf_counter() - start
        detect = tf.saved_model.load(os.path.join(tmp, "export")).signatures["serving_default"]
        rng = np.random.default_rng(0)
        for batch in payload["batches"]:
            images = rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8)
            pixels = torch.from_numpy(
                ((images / 255.0 - MEAN) / STD).astype("float32").transpose(0, 3, 1, 2).copy())
            sizes = [(side, side)] * batch

            def peer_detect(pixels=pixels, sizes=sizes):
                with torch.inference_mode():
                    out = peer(pixel_values=pixels)
                    processor.post_process_object_detection(out, threshold=0.0,
                                                            target_sizes=sizes)

            def ours_detect(feed=tf.constant(images)):
                detect(images=feed)["scores"].numpy()

            times = harness.alternate({OURS: ours_detect, PEER: peer_detect},
                                      payload["repeats"], payload["warmup"])
            settings = {"batch": batch, "side": side, "model": overrides,
                        "backbone": payload["backbone"]}
            row = harness.compare(f"DETR inference, batch {batch}, {side} px", times, OURS,
                                  PEER, settings=settings, extra={"export_s": export_s})
            row.extra["speed_up"] = 1 / row.ratio  # images/s, ours over theirs
            rows.append(row.to_json())
    return {"rows": rows}
