"""Vanilla DETR at the ``tiny-detr`` setting, trained in PyTorch on the same shapes and batches.

    python experiments/detr_peer_convergence.py --minutes 10 [--eval-limit 500]

Needs the ``[reference]`` extra (torch, transformers). transformers' ``DetrForObjectDetection``
is built at the ``tiny-detr`` size (d 128, 4 heads, 3+3 layers, FFN 512, 20 queries, dropout 0.1
in attention, activation and residual as facebookresearch/detr) with a 4-conv backbone in
PyTorch (3x3 stride-2 conv, ``BatchNorm2d``, ReLU; 32-64-128-256 channels), and initialized as
facebookresearch/detr initializes its model: PyTorch's defaults for the convolutions, the heads
and the input projection, N(0, 1) query embeddings, Xavier-uniform Transformer matrices with
zero attention biases. It trains on the batches ``train_detr.py --preset tiny-detr`` trains on
(this project's `embedded` source and DETR augmentation, batch 16, 128 px) with DETR's loss
(transformers' ``ForObjectDetectionLoss``: Hungarian matching, auxiliary losses from every
decoder layer through the final LayerNorm, DETR's way), gradients clipped to a global norm of
0.1, AdamW at 2e-4 (backbone 2e-5, weight decay 1e-4, eps 1e-8), both rates divided by 10 at
80 % of the budget, as the preset's time-bounded runs do. It then prints one JSON line: the
steps, the last validation losses, the spread of the 20 queries' boxes (the collapse measure of
``detr_collapse.py``) and COCO AP from this project's pycocotools evaluation on the held-out
images. What the run shows is in experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# transformers' DETR modeling code must be imported before TensorFlow (the other order
# crashes the process).
import numpy as np
import torch
import transformers
from detr_step_parity import predictions
from detr_step_parity import to_torch as parity_inputs
from torch import nn
from transformers.loss.loss_for_object_detection import ForObjectDetectionLoss

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class TinyConvEncoder(nn.Module):
    """transformers' backbone interface (``(pixels, mask) -> [(features, mask)]``) over the
    4-conv backbone; padded pixels are zeroed at the input and after every block."""

    def __init__(self, filters=(32, 64, 128, 256)):
        super().__init__()
        layers, channels = [], 3
        for f in filters:
            layers.append(nn.ModuleList([nn.Conv2d(channels, f, 3, 2, 1, bias=False),
                                         nn.BatchNorm2d(f)]))
            channels = f
        self.blocks = nn.ModuleList(layers)
        self.intermediate_channel_sizes = list(filters)

    def forward(self, pixel_values, pixel_mask):
        mask = pixel_mask.to(pixel_values.dtype)
        x = pixel_values * mask[:, None]
        for conv, norm in self.blocks:
            mask = mask[:, ::2, ::2]
            x = torch.relu(norm(conv(x))) * mask[:, None]
        return [(x, mask.bool())]


def build_peer(num_classes: int, seed: int) -> transformers.DetrForObjectDetection:
    torch.manual_seed(seed)
    id2label = {i: str(i) for i in range(num_classes)}
    config = transformers.DetrConfig(
        use_pretrained_backbone=False, backbone="resnet18", id2label=id2label,
        label2id={v: k for k, v in id2label.items()}, num_queries=20, d_model=128,
        encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, dropout=0.1,
        attention_dropout=0.1, activation_dropout=0.1, auxiliary_loss=False,
        eos_coefficient=0.1, class_cost=1, bbox_cost=5, giou_cost=2, bbox_loss_coefficient=5,
        giou_loss_coefficient=2)
    model = transformers.DetrForObjectDetection(config)
    model.model.backbone = TinyConvEncoder()
    model.model.input_projection = nn.Conv2d(256, 128, 1)
    with torch.no_grad():  # facebookresearch/detr's initialization
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.BatchNorm2d)):
                module.reset_parameters()
        model.model.query_position_embeddings.weight.normal_(0.0, 1.0)
        for part in (model.model.encoder, model.model.decoder):
            for name, p in part.named_parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
                elif "attn" in name and name.endswith("bias"):
                    p.zero_()
    return model


def set_loss(model, classes, boxes, targets):
    labels = []
    for lab, box, valid in zip(targets["labels"], targets["boxes"], targets["valid"]):
        labels.append({"class_labels": torch.from_numpy(lab[valid]).long(),
                       "boxes": torch.from_numpy(box[valid])})
    model.config.auxiliary_loss = True
    loss, parts, _ = ForObjectDetectionLoss(classes[-1], labels, "cpu", boxes[-1], model.config,
                                            classes, boxes)
    model.config.auxiliary_loss = False
    return loss, parts


def to_torch(inputs):
    return parity_inputs(inputs["images"], inputs["mask"], [])[:2]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    parser.add_argument("--eval-limit", type=int, default=500, help="held-out images scored")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)

    import tensorflow as tf

    from vision.data.augment import normalize_image
    from vision.data.batching import ObjectLimit
    from vision.data.sources import load_source
    from vision.training.evaluate import evaluate_records

    source = load_source("embedded", seed=args.seed, max_side=128)
    limit = ObjectLimit(20)
    model = build_peer(source.num_classes, args.seed)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    backbone = [p for n, p in named if n.startswith("model.backbone.")]
    others = [p for n, p in named if not n.startswith("model.backbone.")]
    lr, backbone_lr = 2e-4, 2e-5
    optimizer = torch.optim.AdamW([{"params": others, "lr": lr},
                                   {"params": backbone, "lr": backbone_lr}],
                                  weight_decay=1e-4, eps=1e-8)
    budget, steps, epoch, dropped = args.minutes * 60, 0, 0, False
    start = time.perf_counter()
    while time.perf_counter() - start < budget:
        train = source.batches("train", batch_size=16, object_limit=limit, seed=args.seed + epoch,
                               augmentation="detr", image_size=128, max_size=128)
        for inputs, targets in train.as_numpy_iterator():
            if time.perf_counter() - start >= budget:
                break
            if not dropped and time.perf_counter() - start >= 0.8 * budget:
                for group in optimizer.param_groups:
                    group["lr"] *= 0.1
                dropped = True
            model.train()
            classes, boxes = predictions(model, *to_torch(inputs))
            loss, _ = set_loss(model, classes, boxes, targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            steps += 1
        epoch += 1
    seconds = time.perf_counter() - start

    model.eval()
    valid = source.batches("valid", batch_size=16, object_limit=limit, image_size=128,
                           max_size=128)
    terms, spreads = {}, []
    with torch.no_grad():
        for inputs, targets in valid.take(12).as_numpy_iterator():
            classes, boxes = predictions(model, *to_torch(inputs))
            _, parts = set_loss(model, classes, boxes, targets)
            for key in ("loss_ce", "loss_bbox", "loss_giou"):
                terms.setdefault(key, []).append(float(parts[key]))
            spreads.append(float(boxes[-1].std(dim=1).mean()))

    def detect(images):
        image = tf.convert_to_tensor(images)
        pixels = normalize_image(image).numpy()
        mask = np.ones(pixels.shape[:3], bool)
        with torch.no_grad():
            classes, boxes = predictions(model, *to_torch({"images": pixels, "mask": mask}))
        probs = classes[-1].softmax(-1)[..., :-1]
        scores, labels = probs.max(-1)
        cx, cy, w, h = boxes[-1].unbind(-1)
        height, width = pixels.shape[1:3]
        xyxy = torch.stack([(cx - w / 2) * width, (cy - h / 2) * height,
                            (cx + w / 2) * width, (cy + h / 2) * height], -1)
        return {"boxes": xyxy.numpy(), "scores": scores.numpy(), "labels": labels.numpy()}

    scores = evaluate_records(detect, source.records("valid"), batch_size=16,
                              limit=args.eval_limit, num_classes=source.num_classes)
    print(json.dumps({
        "peer": f"transformers {transformers.__version__} DetrForObjectDetection, torch "
                f"{torch.__version__}", "minutes": args.minutes, "steps": steps,
        "epochs": epoch, "seconds_per_step": round(seconds / max(steps, 1), 4),
        "valid": {k: round(float(np.mean(v)), 4) for k, v in terms.items()},
        "box_std_over_queries": round(float(np.mean(spreads)), 5),
        **{k: scores.get(k) for k in ("AP", "AP50", "AP75", "n")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
