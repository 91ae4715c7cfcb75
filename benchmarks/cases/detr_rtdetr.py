"""The ``detr`` case's RT-DETR and D-FINE rows: ours against transformers'
RTDetrForObjectDetection / DFineForObjectDetection, in the same process (the case's child,
`cases.detr_child`), torch on 2 threads, TensorFlow's oneDNN as TensorFlow decides.

Sizes: RT-DETR ``r18`` / ``r50`` are ``PekingU/rtdetr_r18vd`` / ``rtdetr_r50vd``'s
configurations (80 classes, 300 queries); D-FINE ``n`` ... ``x`` the published configurations
of our ``dfine-*`` presets (`vision.pretrained.dfine_config.ARCHITECTURES`, built by
transformers from those config.json fields); ``tiny`` the ``rtdetr-tiny`` / ``dfine-tiny``
preset's (20 queries). A payload's ``config`` overrides fields of transformers' config, on both
sides (ours is converted from it).

- `infer`: transformers builds the model (random weights, seed 0) and saves it;
  ``tfx-convert-detr`` converts that folder (the same weights) and its ``Detector`` SavedModel
  is loaded. Detection on square uint8 images: ours is the export's ``serving_default`` (the
  resize, scaling, model and post-processing inside); transformers' is the eager model in
  ``eval()`` under ``torch.inference_mode()`` on the image processor's pixels (processing not
  timed), then ``post_process_object_detection``. The detections of the two are compared on
  the first batch (the largest score difference, in the row's extra).
- `train`: one optimizer step on a fixed batch (3 objects per image), the same weights on both
  sides: ours is the converted model compiled as ``train_detr.py`` compiles it (DETR's AdamW:
  the preset's rate, the backbone at its multiplier, weight decay, global clipping;
  the family's criterion) and run by Keras's ``train_on_batch``; transformers' is
  ``...ForObjectDetection(labels=)`` in ``train()`` mode, ``backward``, clipping and
  ``torch.optim.AdamW`` with the same two rates. Denoising queries off on both sides
  (``num_denoising=0``), or with ``denoising`` on both (each side's own draw of the
  configuration's count, ours given the targets in its inputs). At size ``tiny`` (without
  denoising) our DETR ``tiny`` preset is timed against ours on the same images too
  (ImageNet-normalized, with their mask).
"""

from __future__ import annotations

import os
import tempfile
import time

import harness
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

OURS = "ours"
NAMES = {"rtdetr": "RT-DETR", "dfine": "D-FINE"}
PEERS = {"rtdetr": "transformers RTDetrForObjectDetection",
         "dfine": "transformers DFineForObjectDetection"}
# The published configurations' shapes (PekingU/rtdetr_r18vd and rtdetr_r50vd).
RTDETR_SIZES = {
    "r18": dict(backbone=dict(layer_type="basic", depths=[2, 2, 2, 2],
                              hidden_sizes=[64, 128, 256, 512], out_indices=[2, 3, 4]),
                model=dict(encoder_in_channels=[128, 256, 512], hidden_expansion=0.5,
                           decoder_layers=3)),
    "r50": dict(backbone=dict(out_indices=[2, 3, 4]), model={}),
}



def reference_rtdetr():
    """The parity tests' RT-DETR reference module (its `randomize`: random norms, statistics
    included, and weights scaled by fan-in)."""
    return harness.test_module("tests/vision/pretrained/reference_rtdetr.py")

def peer_config(family: str, size: str, classes: int, overrides: dict):
    """transformers' config of a size (``tiny``: the family's tiny preset's)."""
    if family == "dfine":
        from vision.pretrained.dfine_config import ARCHITECTURES

        fields = {key: value for key, value in ARCHITECTURES[size].items()
                  if key != "model_type"}
        backbone = transformers.HGNetV2Config(**fields.pop("backbone_config"))
        queries = {"num_queries": 20} if size == "tiny" else {}
        return DFineConfig(backbone_config=backbone, num_labels=classes,
                           **{**fields, **queries, **overrides})
    if size == "tiny":
        from vision.config import preset

        tiny = preset("rtdetr-tiny")
        return RTDetrConfig(**{**tiny.rtdetr, "num_queries": tiny.num_queries,
                               "num_labels": classes, **overrides})
    settings = RTDETR_SIZES[size]
    backbone = transformers.RTDetrResNetConfig(**settings["backbone"])
    return RTDetrConfig(backbone_config=backbone, num_labels=classes,
                        **{**settings["model"], **overrides})


def peer_model(payload: dict, folder: str, classes: int, randomize: bool = True):
    """The payload's model (random weights, seed 0), saved to ``folder`` with its image
    processor (square ``side``); returns the model and the processor.

    transformers' own initialization leaves the class head's scores of many encoder cells
    exactly equal (constant weights), which makes the top-300 selection a tie-break; every
    convolution and linear layer is drawn again at the scale of its fan-in and every norm's
    parameters and statistics randomized (as tests/vision/pretrained/reference_rtdetr.py does),
    so that the two implementations select the same queries."""
    family = payload["family"]
    torch.manual_seed(0)
    config = peer_config(family, payload["size"], classes, payload.get("config", {}))
    model = (DFineForObjectDetection if family == "dfine" else RTDetrForObjectDetection)(
        config).eval()
    if randomize:
        reference_rtdetr().randomize(model)
    model.save_pretrained(folder)
    processor = RTDetrImageProcessorPil(size={"height": payload["side"],
                                              "width": payload["side"]})
    processor.save_pretrained(folder)
    return model, processor


def _settings(payload: dict, *keys: str) -> dict:
    return {key: payload[key] for key in ("family", "size", *keys, "config") if key in payload}


def infer(payload: dict) -> dict:
    """One row per batch: ``family``, ``size``, ``side``, ``batches``, ``config``,
    ``repeats``, ``warmup``."""
    import tensorflow as tf

    from vision.commands.convert import main as convert

    family, size, side = payload["family"], payload["size"], payload["side"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        peer, processor = peer_model(payload, os.path.join(tmp, "hf"), 80)
        start = time.perf_counter()
        if convert([os.path.join(tmp, "hf"), "--out", os.path.join(tmp, "ours")]) != 0:
            raise RuntimeError(f"tfx-convert-detr failed on {family} {size}")
        convert_s = time.perf_counter() - start
        detect = tf.saved_model.load(os.path.join(tmp, "ours", "export")).signatures[
            "serving_default"]
        rng = np.random.default_rng(0)
        difference = None
        for batch in payload["batches"]:
            images = rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8)
            pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
            sizes = [(side, side)] * batch

            def peer_detect(pixels=pixels, sizes=sizes):
                with torch.inference_mode():
                    out = peer(pixel_values=pixels)
                    return processor.post_process_object_detection(out, threshold=0.0,
                                                                   target_sizes=sizes)

            feed = tf.constant(images)
            if difference is None:
                ours = detect(images=feed)["scores"].numpy()
                theirs = np.stack([d["scores"].numpy() for d in peer_detect()])
                difference = float(np.abs(ours - theirs).max())

            def ours_detect(feed=feed):
                detect(images=feed)["scores"].numpy()

            def peer_call(detect=peer_detect):
                detect()

            times = harness.alternate({OURS: ours_detect, PEERS[family]: peer_call},
                                      payload["repeats"], payload["warmup"])
            row = harness.compare(
                f"{NAMES[family]} {size} inference, batch {batch}, {side} px", times, OURS,
                PEERS[family], settings={**_settings(payload, "side"), "batch": batch},
                extra={"params": sum(p.numel() for p in peer.parameters()),
                       "convert_and_export_s": convert_s,
                       "largest_score_difference": difference,
                       "ours_images_per_s": batch / float(np.median(times[OURS]))})
            row.extra["speed_up"] = 1 / row.ratio  # images/s, ours over theirs
            rows.append(row.to_json())
    return {"rows": rows}


_DETR_TINY = {}  # (classes, overrides) -> the compiled DETR `tiny`: one for both families


def _detr_tiny(classes: int, overrides: dict):
    key = (classes, tuple(sorted(overrides.items())))
    if key not in _DETR_TINY:
        from vision.config import preset
        from vision.modeling.detr import build_criterion, build_model
        from vision.modeling.optimizer import build_optimizer

        config = preset("tiny", **overrides)
        detr = build_model(config, classes)
        detr.compile(optimizer=build_optimizer(config, detr),
                     criterion=build_criterion(config, classes))
        _DETR_TINY[key] = detr
    return _DETR_TINY[key]


def train(payload: dict) -> dict:
    """The rows of one size: ``family``, ``size``, ``side``, ``batch``, ``classes``,
    ``denoising``, ``config``, ``detr_overrides`` (DetrConfig fields of the DETR ``tiny`` to
    compare with), ``repeats``, ``warmup``."""
    from vision.config import preset
    from vision.modeling.optimizer import build_optimizer
    from vision.pretrained.rtdetr import load_rtdetr

    family, size, denoising = payload["family"], payload["size"], payload["denoising"]
    side, batch, classes = payload["side"], payload["batch"], payload["classes"]
    rng = np.random.default_rng(0)
    images = rng.random((batch, side, side, 3), dtype=np.float32)  # pixels / 255
    count = 3
    boxes = np.concatenate([rng.uniform(0.3, 0.7, (batch, count, 2)),
                            rng.uniform(0.1, 0.3, (batch, count, 2))], -1).astype("float32")
    labels = rng.integers(0, classes, (batch, count)).astype("int32")
    targets = {"labels": labels, "boxes": boxes, "valid": np.ones((batch, count), bool)}
    config = preset(f"{family}-{size}")
    settings = _settings(payload, "side", "batch", "classes", "denoising", "detr_overrides")
    name, peer_name = NAMES[family], PEERS[family]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # ``tiny``: transformers' own initialization; denoising off unless asked for.
        peer, _ = peer_model(payload, os.path.join(tmp, "hf"), classes,
                             randomize=size != "tiny")
        if not denoising:
            peer.config.num_denoising = 0
        peer.train()
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

        inputs = {"images": images, "targets": targets} if denoising else images

        def ours_step():
            ours.train_on_batch(inputs, targets)

        times = harness.alternate({OURS: ours_step, peer_name: peer_step},
                                  payload["repeats"], payload["warmup"])
        dn = " +dn" if denoising else ""
        extra = {"ours_images_per_s": batch / float(np.median(times[OURS]))}
        rows.append(harness.compare(f"{name} {size} train step{dn}, batch {batch}, {side} px",
                                    times, OURS, peer_name, settings=settings, extra=extra))
        if size == "tiny" and not denoising:  # DETR's tiny preset on the same images
            from cases.detr_steps import call

            detr = _detr_tiny(classes, payload.get("detr_overrides", {}))
            mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
            detr_inputs = {"images": ((images - mean) / std).astype("float32"),
                           "mask": np.ones(images.shape[:3], bool)}
            times = harness.alternate({OURS: ours_step,
                                       "DETR tiny (ours)": call(detr.train_on_batch,
                                                                detr_inputs, targets)},
                                      payload["repeats"], payload["warmup"])
            rows.append(harness.compare(
                f"{name} tiny / DETR tiny train step (ours both), batch {batch}, {side} px",
                times, OURS, "DETR tiny (ours)", settings=settings,
                extra={"ours_images_per_s": batch / float(np.median(times[OURS]))}))
    return {"rows": [row.to_json() for row in rows]}
