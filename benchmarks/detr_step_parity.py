"""One optimizer step of vanilla DETR-R50 here against transformers' DetrForObjectDetection.

    python benchmarks/detr_step_parity.py [--height 96 --width 128 --batch 2]

Needs the ``[reference]`` extra (torch, transformers, timm). transformers builds a DETR-R50 of
random weights (4 classes, dropout off, its frozen BatchNorm statistics randomized); its
``model.safetensors`` is read here by `vision.pretrained.load_reference_checkpoint`. Both then
take one training step on the same batch, as facebookresearch/detr's ``main.py`` trains: the
Hungarian-matched set loss with auxiliary losses (transformers' ``ForObjectDetectionLoss``,
which is DETR's ``SetCriterion``), gradients clipped to a global norm of 0.1, AdamW (lr 1e-4,
backbone 1e-5, weight decay 1e-4, eps 1e-8). transformers' own ``auxiliary_loss=True`` path
feeds each decoder layer's LayerNorm-ed output on to the next layer, which DETR does not; the
auxiliary predictions are therefore taken from each layer's output (``output_hidden_states``)
through the decoder's final LayerNorm, DETR's way. Prints the loss of each and the largest
difference of every updated weight (the checkpoint read back after the step), by group.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile

# transformers' DETR modeling code must be imported before TensorFlow (the other order
# crashes the process).
import numpy as np
import torch
import transformers
from transformers.loss.loss_for_object_detection import ForObjectDetectionLoss

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NAMES = ("a", "b", "c", "d")


def build_reference(folder: str, seed: int) -> transformers.DetrForObjectDetection:
    torch.manual_seed(seed)
    id2label = dict(enumerate(NAMES))
    config = transformers.DetrConfig(
        use_pretrained_backbone=False, id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = transformers.DetrForObjectDetection(config)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "DetrFrozenBatchNorm2d":
                module.weight.uniform_(0.5, 1.0)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.75, 1.25)
    model.save_pretrained(folder)
    return model


def reference_step(model, images, mask, targets, lr, backbone_lr, weight_decay, clip,
                   grads_folder):
    """transformers' forward, DETR's set loss with auxiliary losses, clip, AdamW step."""
    model.train()
    pixels = torch.from_numpy(images.transpose(0, 3, 1, 2))
    out = model(pixel_values=pixels, pixel_mask=torch.from_numpy(mask.astype("int64")),
                output_hidden_states=True)
    layers = out.decoder_hidden_states[-model.config.decoder_layers:]
    hidden = model.model.decoder.layernorm(torch.stack(layers))  # (L, B, Q, d)
    classes = model.class_labels_classifier(hidden)
    boxes = model.bbox_predictor(hidden).sigmoid()
    config = copy.deepcopy(model.config)
    config.auxiliary_loss = True
    labels = [{"class_labels": torch.from_numpy(t["labels"]).long(),
               "boxes": torch.from_numpy(t["boxes"])} for t in targets]
    loss, parts, _ = ForObjectDetectionLoss(classes[-1], labels, "cpu", boxes[-1], config,
                                            classes, boxes)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    backbone = [p for n, p in named if "backbone" in n]
    others = [p for n, p in named if "backbone" not in n]
    optimizer = torch.optim.AdamW([{"params": others}, {"params": backbone, "lr": backbone_lr}],
                                  lr=lr, weight_decay=weight_decay, eps=1e-8)
    optimizer.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    # The clipped gradients, saved as a checkpoint (the published names) in place of weights.
    with torch.no_grad():
        saved = {n: p.detach().clone() for n, p in named}
        for n, p in named:
            p.copy_(p.grad)
        model.save_pretrained(grads_folder)
        for n, p in named:
            p.copy_(saved[n])
    optimizer.step()
    return float(loss.detach()), float(norm), {k: float(v) for k, v in parts.items()}


def make_batch(rng, batch, height, width):
    images = rng.standard_normal((batch, height, width, 3)).astype("float32")
    mask = np.ones((batch, height, width), bool)
    targets = []
    for i in range(batch):
        n = 3 - i % 2
        centres = rng.uniform(0.25, 0.75, (n, 2))
        sizes = rng.uniform(0.1, 0.4, (n, 2))
        targets.append({"labels": rng.integers(0, len(NAMES), n).astype("int64"),
                        "boxes": np.concatenate([centres, sizes], 1).astype("float32")})
    return images, mask, targets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    lr, backbone_lr, weight_decay, clip = 1e-4, 1e-5, 1e-4, 0.1
    rng = np.random.default_rng(args.seed)
    images, mask, targets = make_batch(rng, args.batch, args.height, args.width)

    with tempfile.TemporaryDirectory() as tmp:
        reference = build_reference(os.path.join(tmp, "before"), args.seed)
        torch_loss, torch_norm, torch_parts = reference_step(
            reference, images, mask, targets, lr, backbone_lr, weight_decay, clip,
            os.path.join(tmp, "grads"))
        reference.save_pretrained(os.path.join(tmp, "after"))

        import keras

        from vision.modeling.detr import build_criterion
        from vision.pretrained import load_reference_checkpoint
        from vision.reference import read_reference
        from vision.training.optimizer import build_optimizer

        model = load_reference_checkpoint(os.path.join(tmp, "before", "model.safetensors"),
                                          dropout=0.0)
        config = model.detr_config
        model.compile(optimizer=build_optimizer(config, model),
                      criterion=build_criterion(config, model.num_classes))
        m = max(len(t["labels"]) for t in targets)
        y = {"labels": np.zeros((args.batch, m), "int32"),
             "boxes": np.full((args.batch, m, 4), 0.5, "float32"),
             "valid": np.zeros((args.batch, m), bool)}
        for i, t in enumerate(targets):
            n = len(t["labels"])
            y["labels"][i, :n], y["boxes"][i, :n], y["valid"][i, :n] = t["labels"], t["boxes"], True
        ours = model.train_on_batch({"images": images, "mask": mask}, y, return_dict=True)
        expected = read_reference(os.path.join(tmp, "after", "model.safetensors")).arrays
        grads = read_reference(os.path.join(tmp, "grads", "model.safetensors")).arrays

    worst, by_group, far, total, small, clear, largest = 0.0, {}, 0, 0, [], 0.0, []
    for variable in model.trainable_weights:
        key = variable.path.removeprefix("detr/")
        diff = np.abs(keras.ops.convert_to_numpy(variable) - expected[key])
        group = key.split("/")[0]
        by_group[group] = max(by_group.get(group, 0.0), float(diff.max()))
        worst = max(worst, float(diff.max()))
        total += diff.size
        far += int(np.sum(diff > 1e-5))
        small.extend(np.abs(grads[key][diff > 1e-5]).tolist())
        above = np.abs(grads[key]) > 1e-7  # 10x Adam's eps: a sign float noise cannot flip
        if above.any():
            clear = max(clear, float(diff[above].max()))
        for i in np.argwhere(diff > 1e-5)[:5]:
            i = tuple(int(j) for j in i)
            largest.append([key, list(i), float(f"{diff[i]:.3g}"), float(f"{grads[key][i]:.3g}")])
    largest = sorted(largest, key=lambda row: -row[2])[:5]
    print(json.dumps({
        "batch": [args.batch, args.height, args.width],
        "loss": {"ours": round(float(ours["loss"]), 6), "transformers": round(torch_loss, 6)},
        "transformers_grad_norm": round(torch_norm, 4),
        "transformers_loss_terms": {k: round(v, 5) for k, v in torch_parts.items()
                                    if not k[-1].isdigit()},
        "worst_weight_difference": worst,
        "weights_differing_by_more_than_1e-5": f"{far} of {total}",
        # Adam's first step is lr * g / (|g| + eps): a clipped gradient near eps = 1e-8 whose
        # sign is float noise moves its weight by up to lr either way.
        "their_median_clipped_gradient": float(np.median(small)) if small else None,
        "worst_difference_where_the_clipped_gradient_exceeds_1e-7": clear,
        "by_group": {k: float(f"{v:.3g}") for k, v in sorted(by_group.items())},
        # [weight, index, difference, transformers' clipped gradient there]
        "largest_differences": largest,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
