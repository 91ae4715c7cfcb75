"""DETR's set prediction loss (``SetCriterion`` of facebookresearch/detr ``models/detr.py``).

For each decoder output (the last layer and, with `aux_loss`, every earlier one) predictions
are matched one-to-one to the ground truth by a `HungarianMatcher`, then:

- ``loss_ce``: cross-entropy over all `Q` queries; the target of a matched query is its
  object's class, of an unmatched query the no-object class (index `num_classes`). Class
  weights are 1 and `eos_coef` for no-object; the mean is weighted, ``Σ wᵢ ℓᵢ / Σ wᵢ``
  (PyTorch's ``F.cross_entropy(..., weight=...)``).
- ``loss_bbox``: ``Σ |Δ|`` of normalized cxcywh coordinates over matched pairs / num_boxes.
- ``loss_giou``: ``Σ (1 − GIoU)`` over matched pairs / num_boxes.

With ``classification="varifocal"`` (RT-DETR: sigmoid class scores, ``C`` logits and no
no-object one) the classification loss is the varifocal loss ``loss_vfl`` in place of
``loss_ce``: binary cross-entropy of every (query, class) logit against the target score, the
matched box's IoU with its object (no gradient) on the object's class and 0 elsewhere,
weighted by ``alpha * sigmoid(logit)^gamma`` (no gradient) where the target is 0 and by the
target score where it is not, summed over queries and classes / num_boxes.

With ``classification="matchability"`` (DEIM) it is the matchability-aware loss ``loss_mal``
(`vision.matching.terms`). With ``dense_one_to_one`` every output's box terms use the union of
the outputs' matchings (`vision.matching.dense`); the classification keeps each one's own.

``num_boxes = max(valid targets in the batch, 1)``. Under a distribution strategy, pass the
average over replicas instead (`num_boxes` argument; `count_boxes` gives the local count to
all-reduce), as DETR does.

The loss is ``keras.ops`` throughout except for the matcher's solver: with
``HungarianMatcher(solver="scipy")`` (a host callback) compile the train step with
``jit_compile=False``; with ``solver="ops"`` it compiles with XLA.
"""

from __future__ import annotations

import re
from typing import Any

import keras
from keras import ops

from tfx_transformer import checks
from vision.matching.dense import with_union
from vision.matching.matcher import HungarianMatcher
from vision.matching.terms import (
    box_losses,
    cross_entropy_loss,
    matchability_aware_loss,
    matched_targets,
    varifocal_loss,
)

__all__ = ["CLASSIFICATIONS", "SetCriterion"]

CLASSIFICATIONS = ("softmax", "varifocal", "matchability")
_CLASS_LOSSES = {"softmax": "loss_ce", "varifocal": "loss_vfl", "matchability": "loss_mal"}


@keras.saving.register_keras_serializable(package="vision")
class SetCriterion:
    """Hungarian-matched set loss of DETR, with auxiliary decoding losses.

    Args:
        num_classes: Number of object classes `C`, not counting no-object.
        matcher: Callable `(pred_logits, pred_boxes, labels, boxes, valid) -> (B, Q)` int
            indices (-1 = unmatched), normally a `HungarianMatcher`.
        eos_coef: Classification weight of the no-object class.
        weight_dict: Weight of each loss in the total ``loss``. A key ``loss_ce`` also weights
            the auxiliary ``loss_ce_0``, ``loss_ce_1``, ...; an explicit ``loss_ce_0`` key
            overrides it. Losses without a weight are reported but not added.
            Default ``{"loss_ce": 1, "loss_bbox": 5, "loss_giou": 2}``.
        aux_loss: Whether to add the losses of ``outputs["aux_outputs"]``.
        proposal_matches: How many of the two-stage proposals (``outputs["enc_outputs"]``,
            one per encoder cell) each object is matched to: the targets are repeated this
            many times before the Hungarian matching (one-to-many, as H-DETR's hybrid
            branch), and the box losses are divided by this many times ``num_boxes``. Their
            losses are ``loss_ce_enc``, ``loss_bbox_enc``, ``loss_giou_enc``, added whenever
            ``outputs`` has ``enc_outputs`` (whatever `aux_loss` says).
        one_to_many_copies: How many copies of the targets the hybrid branch's queries
            (``outputs["one_to_many"]``, H-DETR) are matched to, with the box losses divided
            by this many times ``num_boxes``. Their losses are ``loss_ce_o2m``, ... and, with
            `aux_loss`, ``loss_ce_o2m_0``, ..., weighted as the one-to-one losses of the same
            name (H-DETR's λ = 1).
        iou_aware: The classification target of a matched query is its box's IoU with its
            object (no gradient) on the object's class and the rest on no-object: the
            softmax form of the IoU-aware score target of varifocal loss (RT-DETR), so that
            the class score ranks the detections by how well they are placed. False: DETR's
            one-hot target.
        classification: ``"softmax"`` (DETR's cross-entropy over ``C + 1`` logits,
            ``loss_ce``), ``"varifocal"`` (sigmoid scores over ``C`` logits, ``loss_vfl``)
            or ``"matchability"`` (the same logits, ``loss_mal``); see the module docstring.
            Default weights with ``"varifocal"``: ``{"loss_vfl": 1, "loss_bbox": 5,
            "loss_giou": 2}`` (``loss_mal`` likewise).
        focal_alpha, focal_gamma: the varifocal weight's ``alpha`` and ``gamma``
            (RT-DETR's ``focal_loss_alpha`` 0.75, ``focal_loss_gamma`` 2); with
            ``"matchability"``, ``gamma`` is its exponent (DEIM's configs: 1.5).
        mal_alpha: with ``"matchability"``, a factor on the unmatched logits' weight (None:
            1, DEIM's).
        dense_one_to_one: score the box losses of every output on the union of their
            matchings (see the module docstring). Needs ``proposal_matches`` 1.

    Call arguments:
        outputs: Dict with ``pred_logits`` `(B, Q, C + 1)` (varifocal: `(B, Q, C)`),
            ``pred_boxes`` `(B, Q, 4)`
            (normalized cxcywh) and optionally ``aux_outputs``: a list of such dicts, one per
            earlier decoder layer, ``one_to_many``: a dict with these three keys for the
            hybrid branch's queries, and ``enc_outputs``: such a dict for two-stage proposals,
            with ``valid`` `(B, S)` bool marking the proposals that may be matched (the
            others are never matched and take no part in the loss).
        targets: Dict with ``labels`` `(B, M)` int in `[0, C)`, ``boxes`` `(B, M, 4)`
            normalized cxcywh and ``valid`` `(B, M)` bool (False = padding).
        num_boxes: Optional normalizer for the box losses: the number of valid targets
            averaged over replicas. Clamped to at least 1. Default: `count_boxes(targets)`.

    Returns:
        Dict of float32 scalars: ``loss_ce``, ``loss_bbox``, ``loss_giou``; for aux layer `i`
        ``loss_ce_i``, ``loss_bbox_i``, ``loss_giou_i``; with ``enc_outputs``,
        ``loss_ce_enc``, ``loss_bbox_enc``, ``loss_giou_enc``; and ``loss``, the weighted sum.
        With ``classification="varifocal"``, ``loss_vfl`` (``loss_vfl_i``, ...) in place of
        ``loss_ce``.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        eos_coef: float = 0.1,
        weight_dict: dict[str, float] | None = None,
        aux_loss: bool = True,
        proposal_matches: int = 1,
        one_to_many_copies: int = 6,
        iou_aware: bool = False,
        classification: str = "softmax",
        focal_alpha: float = 0.75,
        focal_gamma: float = 2.0,
        mal_alpha: float | None = None,
        dense_one_to_one: bool = False,
    ) -> None:
        checks.positive_int("num_classes", num_classes)
        checks.non_negative_number("eos_coef", eos_coef)
        if not callable(matcher):
            raise TypeError(f"`matcher` must be callable. Received: matcher={matcher!r}")
        if classification not in CLASSIFICATIONS:
            raise ValueError(f"`classification` must be one of {CLASSIFICATIONS}. "
                             f"Received: classification={classification!r}")
        if classification != "softmax" and iou_aware:
            raise ValueError("`iou_aware` is the softmax form of the varifocal target; with "
                             f"classification={classification!r} leave it False. "
                             "Received: True")
        self.num_classes = num_classes
        self.matcher = matcher
        self.eos_coef = float(eos_coef)
        self.classification = classification
        self.focal_alpha = float(focal_alpha)
        self.focal_gamma = float(focal_gamma)
        self.mal_alpha = checks.non_negative_number("mal_alpha", mal_alpha, optional=True)
        self._class_loss = _CLASS_LOSSES[classification]
        if weight_dict is None:
            weight_dict = {self._class_loss: 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
        self.weight_dict = dict(weight_dict)
        self.aux_loss = bool(aux_loss)
        self.proposal_matches = checks.positive_int("proposal_matches", proposal_matches)
        self.one_to_many_copies = checks.positive_int("one_to_many_copies", one_to_many_copies)
        self.iou_aware = checks.boolean("iou_aware", iou_aware)
        self.dense_one_to_one = checks.boolean("dense_one_to_one", dense_one_to_one)
        if self.dense_one_to_one and self.proposal_matches != 1:
            raise ValueError("`dense_one_to_one` matches the cells as the queries, one target "
                             "each; it needs proposal_matches=1. Received: "
                             f"proposal_matches={proposal_matches}")

    @property
    def class_loss(self) -> str:
        """The name of the classification term: ``loss_ce``, ``loss_vfl`` or ``loss_mal``."""
        return self._class_loss

    @staticmethod
    def count_boxes(targets: dict) -> Any:
        """Number of valid targets in `targets` as a float32 scalar (before any all-reduce)."""
        return ops.sum(ops.cast(targets["valid"], "float32"))

    def __call__(self, outputs: dict, targets: dict, num_boxes: Any = None) -> dict:
        for key in ("labels", "boxes", "valid"):
            if key not in targets:
                raise ValueError(
                    f"`targets` must have keys 'labels', 'boxes' and 'valid'. "
                    f"Received: keys={sorted(targets)}"
                )
        labels = ops.convert_to_tensor(targets["labels"])
        boxes = ops.cast(targets["boxes"], "float32")
        valid = ops.cast(targets["valid"], "bool")
        if num_boxes is None:
            num_boxes = self.count_boxes(targets)
        num_boxes = ops.maximum(ops.cast(num_boxes, "float32"), 1.0)
        if self.dense_one_to_one:
            outputs = with_union(outputs, lambda layer, where: self._match(
                layer, labels, boxes, valid, where), self.aux_loss, valid, num_boxes)

        def matched(k, where):  # one layer's losses against k copies of every target
            copies = (labels, boxes, valid) if k == 1 else (
                ops.tile(labels, [1, k]), ops.tile(boxes, [1, k, 1]), ops.tile(valid, [1, k]))
            return lambda layer, i: self._layer_losses(
                layer, *copies, num_boxes * k,
                where if i is None else f"{where}['aux_outputs'][{i}]")

        losses = self._decoder_losses(outputs, matched(1, "outputs"))
        if "one_to_many" in outputs:  # the hybrid branch: K copies of every target
            hybrid = self._decoder_losses(outputs["one_to_many"], matched(
                self.one_to_many_copies, "outputs['one_to_many']"))
            losses.update(_tagged(hybrid, "o2m"))
        if "enc_outputs" in outputs:  # two-stage proposals, one per encoder cell
            k = self.proposal_matches
            enc_losses = self._layer_losses(
                outputs["enc_outputs"], ops.tile(labels, [1, k]), ops.tile(boxes, [1, k, 1]),
                ops.tile(valid, [1, k]), num_boxes * k, "outputs['enc_outputs']",
            )
            losses.update({f"{name}_enc": value for name, value in enc_losses.items()})
        if "pre_outputs" in outputs:  # D-FINE: the first layer's boxes before refinement
            pre = self._layer_losses(outputs["pre_outputs"], labels, boxes, valid, num_boxes,
                                     "outputs['pre_outputs']")
            losses.update({f"{name}_pre": value for name, value in pre.items()})
        if "denoising" in outputs:  # noised targets, each query knowing its own
            dn = outputs["denoising"]
            normalizer = num_boxes * ops.cast(dn["groups"], "float32")
            dn_losses = self._decoder_losses(
                dn, lambda layer, i: self._denoising_losses({**dn, **layer}, normalizer))
            if "pre_outputs" in dn:
                known = {key: dn[key] for key in ("labels", "boxes", "positive", "valid")}
                pre = self._denoising_losses({**known, **dn["pre_outputs"]}, normalizer)
                dn_losses.update({f"{name}_pre": value for name, value in pre.items()})
            losses.update(_tagged(dn_losses, "dn"))
        total = ops.zeros((), "float32")
        for name, value in losses.items():
            weight = self._weight(name)
            if weight:
                total = total + weight * value
        losses["loss"] = total
        return losses

    def _weight(self, name: str) -> float:
        if name in self.weight_dict:
            return float(self.weight_dict[name])
        # loss_ce_3, loss_ce_enc, loss_ce_o2m, loss_ce_o2m_3, loss_vfl_dn_pre -> loss_ce/vfl
        base = re.sub(r"(_o2m|_dn)?(_\d+|_enc|_pre)?$", "", name)
        return float(self.weight_dict.get(base, 0.0))

    def _decoder_losses(self, outputs: dict, layer_losses) -> dict:
        """``layer_losses(layer, i)`` of the last layer (``i`` None) and, with `aux_loss`, of
        every earlier one (``i``, names suffixed ``_i``)."""
        losses = layer_losses(outputs, None)
        if self.aux_loss:
            for i, aux in enumerate(outputs.get("aux_outputs") or []):
                losses.update({f"{name}_{i}": value
                               for name, value in layer_losses(aux, i).items()})
        return losses

    def _denoising_losses(self, layer: dict, num_boxes: Any) -> dict:
        """One layer's denoising losses: no matching; positives reconstruct their target,
        negatives predict no-object; invalid (padding) queries take no part."""
        valid = ops.cast(layer["valid"], "bool")
        positive = ops.logical_and(ops.cast(layer["positive"], "bool"), valid)
        indices = ops.where(positive, ops.arange(ops.shape(positive)[1])[None], -1)
        return self._losses_of_match(layer, ops.cast(layer["labels"], "int32"),
                                     ops.cast(layer["boxes"], "float32"), indices, valid,
                                     num_boxes)

    def _layer_losses(
        self, layer: dict, labels: Any, boxes: Any, valid: Any, num_boxes: Any, where: str
    ) -> dict:
        """One layer's losses (dense one-to-one: the box terms on ``layer["union"]``)."""
        indices = layer.get("match")  # already matched (dense one-to-one)
        if indices is None:
            indices = self._match(layer, labels, boxes, valid, where)
        pred_valid = layer.get("valid")  # (B, Q) bool or None: predictions that may match
        pred_valid = None if pred_valid is None else ops.cast(pred_valid, "bool")
        union = (layer["union"], layer["union_boxes"]) if "union" in layer else None
        return self._losses_of_match(layer, labels, boxes, indices, pred_valid, num_boxes,
                                     union)

    def _match(self, layer: dict, labels: Any, boxes: Any, valid: Any, where: str) -> Any:
        """``(B, Q)`` each prediction's target (-1: none) by the matcher; predictions outside
        ``layer["valid"]`` are never matched."""
        if "pred_logits" not in layer or "pred_boxes" not in layer:
            raise ValueError(
                f"`{where}` must have keys 'pred_logits' and 'pred_boxes'. "
                f"Received: keys={sorted(layer)}"
            )
        logits = ops.cast(layer["pred_logits"], "float32")  # (B, Q, C [+ 1])
        pred_boxes = ops.cast(layer["pred_boxes"], "float32")  # (B, Q, 4)
        sigmoid = self.classification != "softmax"
        width = self.num_classes if sigmoid else self.num_classes + 1
        if len(logits.shape) != 3 or logits.shape[-1] != width:
            raise ValueError(
                f"`{where}['pred_logits']` must have shape (B, Q, "
                f"{'num_classes' if sigmoid else 'num_classes + 1'}) = (B, Q, {width}). "
                f"Received: shape={tuple(logits.shape)}"
            )
        pred_valid = layer.get("valid")
        if pred_valid is None:
            return self.matcher(logits, pred_boxes, labels, boxes, valid)
        pred_valid = ops.cast(pred_valid, "bool")
        indices = self.matcher(logits, pred_boxes, labels, boxes, valid, pred_valid=pred_valid)
        return ops.where(pred_valid, indices, -1)

    def _losses_of_match(self, layer: dict, labels: Any, boxes: Any, indices: Any,
                         pred_valid: Any, num_boxes: Any, union: tuple | None = None) -> dict:
        """The three losses given each prediction's target index (-1: no-object);
        ``pred_valid`` (None: all) marks the predictions that take part; ``union``: the
        indices and normalizer the box terms use instead (dense one-to-one)."""
        logits = ops.cast(layer["pred_logits"], "float32")  # (B, Q, C [+ 1])
        pred_boxes = ops.cast(layer["pred_boxes"], "float32")  # (B, Q, 4)
        matched, matched_labels, target_boxes = matched_targets(labels, boxes, indices)
        args = (logits, pred_boxes, target_boxes, matched_labels, matched, pred_valid)
        if self.classification == "softmax":
            value = cross_entropy_loss(*args, self.eos_coef, self.iou_aware)
        elif self.classification == "varifocal":
            value = varifocal_loss(*args, self.focal_alpha, self.focal_gamma) / num_boxes
        else:
            value = matchability_aware_loss(*args, self.focal_gamma, self.mal_alpha) / num_boxes
        if union is not None:
            matched, _, target_boxes = matched_targets(labels, boxes, union[0])
            num_boxes = union[1]
        return {self._class_loss: value,
                **box_losses(pred_boxes, target_boxes, matched, num_boxes)}

    def get_config(self) -> dict:
        config = {key: getattr(self, key) for key in (
            "num_classes", "eos_coef", "aux_loss", "proposal_matches", "one_to_many_copies",
            "iou_aware", "classification", "focal_alpha", "focal_gamma", "mal_alpha",
            "dense_one_to_one")}
        return {**config, "matcher": keras.saving.serialize_keras_object(self.matcher),
                "weight_dict": dict(self.weight_dict)}

    @classmethod
    def from_config(cls, config: dict) -> SetCriterion:
        config = dict(config)
        config["matcher"] = keras.saving.deserialize_keras_object(config["matcher"])
        return cls(**config)


def _tagged(losses: dict, tag: str) -> dict:
    """``loss_ce`` -> ``loss_ce_TAG``, ``loss_ce_0`` -> ``loss_ce_TAG_0``."""
    renamed = {}
    for name, value in losses.items():
        term, _, layer = name.partition("_")[2].partition("_")
        renamed["_".join(["loss", term, tag] + ([layer] if layer else []))] = value
    return renamed
