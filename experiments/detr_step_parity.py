"""One optimizer step of vanilla DETR-R50 here against transformers' DetrForObjectDetection.

    python experiments/detr_step_parity.py [--height 96 --width 128 --batch 2]

Needs the ``[reference]`` extra (torch, transformers, timm). transformers builds a DETR-R50 of
random weights (4 classes, dropout off, its frozen BatchNorm statistics randomized); its
``model.safetensors`` is read here by `vision.pretrained.init_from.load_reference_checkpoint`. Both
then take one training step on the same batch, as facebookresearch/detr's ``main.py`` trains: the
Hungarian-matched set loss with auxiliary losses (transformers' ``ForObjectDetectionLoss``,
which is DETR's ``SetCriterion``), gradients clipped to a global norm of 0.1, AdamW (lr 1e-4,
backbone 1e-5, weight decay 1e-4, eps 1e-8). transformers' own ``auxiliary_loss=True`` path
feeds each decoder layer's LayerNorm-ed output on to the next layer, which DETR does not; the
auxiliary predictions are therefore taken from each layer's output (``output_hidden_states``)
through the decoder's final LayerNorm, DETR's way (the last of those states is normalized
already). Prints the loss of each and the largest
difference of every updated weight (the checkpoint read back after the step), by group, and the
largest difference of each float32 step from transformers' step in float64 (how far float32
alone moves the updated weights).
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
from transformers.loss.loss_for_object_detection import ForObjectDetectionLoss, HungarianMatcher

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


def predictions(model, pixels: torch.Tensor, pixel_mask: torch.Tensor):
    """Class logits and sigmoid boxes of every decoder layer, ``(L, B, Q, ...)``: each layer's
    output through the decoder's final LayerNorm, DETR's intermediate outputs.
    transformers' ``decoder_hidden_states`` end with the final, already normalized state
    (``last_hidden_state``); the earlier ones are not normalized."""
    out = model(pixel_values=pixels, pixel_mask=pixel_mask, output_hidden_states=True)
    states = out.decoder_hidden_states[-model.config.decoder_layers:]
    earlier = model.model.decoder.layernorm(torch.stack(states[:-1]))
    hidden = torch.cat([earlier, states[-1][None]])  # (L, B, Q, d)
    return model.class_labels_classifier(hidden), model.bbox_predictor(hidden).sigmoid()


def to_torch(images: np.ndarray, mask: np.ndarray, targets) -> tuple:
    """NHWC images, a bool mask and ``[{"labels", "boxes"}]`` as transformers takes them."""
    labels = [{"class_labels": torch.from_numpy(t["labels"]).long(),
               "boxes": torch.from_numpy(t["boxes"])} for t in targets]
    return (torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))),
            torch.from_numpy(mask.astype("int64")), labels)


def reference_step(model, images, mask, targets, lr, backbone_lr, weight_decay, clip,
                   grads_folder):
    """transformers' forward, DETR's set loss with auxiliary losses, clip, AdamW step."""
    model.train()
    pixels, pixel_mask, labels = to_torch(images, mask, targets)
    classes, boxes = predictions(model, pixels, pixel_mask)
    config = copy.deepcopy(model.config)
    config.auxiliary_loss = True
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


def reference_matching(model, images, mask, targets) -> list[np.ndarray]:
    """transformers' Hungarian assignment of every decoder layer before the step, in the order
    this project's criterion asks for them (last layer, then layers 0, 1, ...): ``(B, Q)``
    target index of each query, -1 for none."""
    matcher = HungarianMatcher(class_cost=model.config.class_cost,
                               bbox_cost=model.config.bbox_cost,
                               giou_cost=model.config.giou_cost)
    model.train()
    pixels, pixel_mask, labels = to_torch(images, mask, targets)
    with torch.no_grad():
        classes, boxes = predictions(model, pixels, pixel_mask)
        per_layer = []
        for layer in range(classes.shape[0]):
            pairs = matcher({"logits": classes[layer], "pred_boxes": boxes[layer]}, labels)
            indices = np.full(classes.shape[1:3], -1, "int32")
            for b, (queries, objects) in enumerate(pairs):
                indices[b, queries.numpy()] = objects.numpy()
            per_layer.append(indices)
    return per_layer[-1:] + per_layer[:-1]


class GivenMatching:
    """A matcher that returns fixed assignments, one per call, in turn."""

    def __init__(self, assignments):
        self.assignments, self.calls = list(assignments), 0

    def __call__(self, logits, pred_boxes, labels, boxes, valid, pred_valid=None):
        indices = self.assignments[self.calls % len(self.assignments)]
        self.calls += 1
        return indices


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


def compare(model, expected, grads=None) -> dict:
    """The largest difference of every updated weight of ``model`` from ``expected`` (Keras
    paths), by group, with the weights that differ most and transformers' clipped gradient
    there."""
    import keras

    worst, by_group, far, total, largest = 0.0, {}, 0, 0, []
    for variable in model.trainable_weights:
        key = variable.path.removeprefix("detr/")
        diff = np.abs(keras.ops.convert_to_numpy(variable) - expected[key])
        group = key.split("/")[0]
        by_group[group] = max(by_group.get(group, 0.0), float(diff.max()))
        worst = max(worst, float(diff.max()))
        total += diff.size
        far += int(np.sum(diff > 1e-5))
        if grads is not None:
            for i in np.argwhere(diff > 1e-5)[:5]:
                i = tuple(int(j) for j in i)
                largest.append([key, list(i), float(f"{diff[i]:.3g}"),
                                float(f"{grads[key][i]:.3g}")])
    result = {"worst_weight_difference": worst,
              "weights_differing_by_more_than_1e-5": f"{far} of {total}",
              "by_group": {k: float(f"{v:.3g}") for k, v in sorted(by_group.items())}}
    if grads is not None:  # [weight, index, difference, transformers' clipped gradient there]
        result["largest_differences"] = sorted(largest, key=lambda row: -row[2])[:5]
    return result


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
        theirs = reference_matching(reference, images, mask, targets)
        torch_loss, torch_norm, torch_parts = reference_step(
            reference, images, mask, targets, lr, backbone_lr, weight_decay, clip,
            os.path.join(tmp, "grads"))
        reference.save_pretrained(os.path.join(tmp, "after"))
        # The reference against itself in float64 (the exact step, up to float64 rounding):
        # how far float32 alone moves transformers' own updated weights.
        exact = build_reference(os.path.join(tmp, "exact"), args.seed).double()
        torch.set_default_dtype(torch.float64)  # also the tensors the loss makes
        reference_step(exact, images.astype("float64"), mask,
                       [{**t, "boxes": t["boxes"].astype("float64")} for t in targets],
                       lr, backbone_lr, weight_decay, clip, os.path.join(tmp, "grads_exact"))
        torch.set_default_dtype(torch.float32)
        exact.save_pretrained(os.path.join(tmp, "after_exact"))

        import keras

        from vision.modeling.detr import build_criterion
        from vision.modeling.optimizer import build_optimizer
        from vision.pretrained.detr import read_reference
        from vision.pretrained.init_from import load_reference_checkpoint

        m = max(len(t["labels"]) for t in targets)
        y = {"labels": np.zeros((args.batch, m), "int32"),
             "boxes": np.full((args.batch, m, 4), 0.5, "float32"),
             "valid": np.zeros((args.batch, m), bool)}
        for i, t in enumerate(targets):
            n = len(t["labels"])
            y["labels"][i, :n], y["boxes"][i, :n], y["valid"][i, :n] = t["labels"], t["boxes"], True

        def our_step(matching=None):
            model = load_reference_checkpoint(os.path.join(tmp, "before", "model.safetensors"),
                                              dropout=0.0)
            config = model.detr_config
            criterion = build_criterion(config, model.num_classes)
            own = None
            if matching is None:  # our own assignments, in the criterion's order
                out = model({"images": images, "mask": mask}, training=True)
                own = [keras.ops.convert_to_numpy(criterion.matcher(
                    layer["pred_logits"], layer["pred_boxes"], y["labels"], y["boxes"],
                    y["valid"])) for layer in [out, *out["aux_outputs"]]]
            else:
                criterion.matcher = GivenMatching(matching)
            model.compile(optimizer=build_optimizer(config, model), criterion=criterion)
            logs = model.train_on_batch({"images": images, "mask": mask}, y, return_dict=True)
            return model, logs, own

        model, ours, own = our_step()
        given_model, given, _ = our_step(theirs)
        expected = read_reference(os.path.join(tmp, "after", "model.safetensors")).arrays
        exact = read_reference(os.path.join(tmp, "after_exact", "model.safetensors")).arrays
        grads = read_reference(os.path.join(tmp, "grads", "model.safetensors")).arrays

    pairs = [(a[b], t[b]) for a, t in zip(own, theirs) for b in range(args.batch)]
    equal = sum(bool(np.array_equal(a, t)) for a, t in pairs)
    print(json.dumps({
        "batch": [args.batch, args.height, args.width],
        "loss": {"ours": round(float(ours["loss"]), 6),
                 "ours_with_their_assignment": round(float(given["loss"]), 6),
                 "transformers": round(torch_loss, 6)},
        "transformers_grad_norm": round(torch_norm, 4),
        "transformers_loss_terms": {k: round(v, 5) for k, v in torch_parts.items()
                                    if not k[-1].isdigit()},
        # At random weights DETR's queries predict nearly one box, so matching costs tie to
        # float32 and two solvers may pick different (equally cheap) queries for an object.
        "assignments_equal": f"{equal} of {len(pairs)} (decoder layer, image)",
        # The step itself: our step given transformers' assignment.
        "same_assignment": compare(given_model, expected, grads),
        "own_assignment": compare(model, expected, grads),
        # Each float32 step against transformers' own step in float64.
        "worst_difference_from_the_float64_step": {
            "ours_same_assignment": compare(given_model, exact)["worst_weight_difference"],
            "transformers": max(float(np.abs(expected[k] - exact[k]).max()) for k in expected),
        },
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
