"""D-FINE: HGNetV2 backbone -> GELAN hybrid encoder -> query selection -> FDR decoder.

As transformers' ``DFineForObjectDetection`` computes it in eval mode (Peterande/D-FINE):
RT-DETR's pipeline (`vision.modeling.rtdetr`: input projections, AIFI, FPN/PAN, anchors,
the selection of the ``num_queries`` best cells, denoising queries in training) with

- the HGNetV2 backbone (`vision.modeling.hgnetv2`);
- D-FINE's fusion blocks (`vision.modeling.dfine_encoder.DFineHybridEncoder`);
- no decoder input projection where the encoder's width is the decoder's (``d_model`` =
  ``encoder_hidden_dim``, every published size but X, whose 384-wide maps are projected to
  256 as RT-DETR's are);
- the fine-grained distribution refinement decoder (`vision.modeling.dfine_decoder`): each
  layer predicts a distribution over offsets of every box edge, refined from layer to
  layer, and scores its classes with a location-quality term.

Outputs are RT-DETR's, every layer's with its edge logits as ``"pred_corners"``, plus
``"pre_outputs"`` (the first decoder layer's boxes before refinement, and its class logits
without the quality term) and ``"ref_points"`` (the boxes the edge offsets are measured from),
which D-FINE's localization losses read.
"""

from __future__ import annotations

import keras
from keras import ops

from vision.matching.matcher import HungarianMatcher
from vision.modeling.rtdetr import RTDetr, criterion_terms

__all__ = ["DFine", "dfine_criterion"]


@keras.saving.register_keras_serializable(package="vision")
class DFine(RTDetr):
    """The D-FINE detector (see the module docstring).

    Args: as `vision.modeling.rtdetr.RTDetr`'s, with a
    `vision.modeling.hgnetv2.HGNetV2Backbone`, a
    `vision.modeling.dfine_encoder.DFineHybridEncoder` and a
    `vision.modeling.dfine_decoder.DFineDecoder`.

    Returns:
        RT-DETR's outputs (each layer's dict also holds ``"pred_corners"`` ``(B, Q, 4 *
        (max_num_bins + 1))``), plus ``"pre_outputs"`` (``pred_logits``, ``pred_boxes``) and
        ``"ref_points"`` ``(B, Q, 4)``; with denoising queries, ``"denoising"`` holds
        theirs likewise.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The last layer's FGL too (DDF is the earlier layers' only).
        self.loss_trackers.append(keras.metrics.Mean(name="loss_fgl"))

    def default_criterion(self):
        """`dfine_criterion` for this model's classes and decoder."""
        return dfine_criterion(self.num_classes, self.decoder)

    def _input_projection(self, level: int) -> keras.layers.Layer:
        if self.d_model == self.encoder.hidden_dim:
            return keras.layers.Identity(name=f"decoder_input_proj_{level}")
        return super()._input_projection(level)

    def call(self, inputs, training=None):
        images, targets = (inputs["images"], inputs.get("targets")) if isinstance(
            inputs, dict) else (inputs, None)
        selection = self.select_queries(images, training=training)
        target, reference, mask, meta = self.decoder_queries(selection, targets, training)
        out = self.decoder(target, selection.memory, reference,
                           spatial_shapes=selection.spatial_shapes, self_attention_mask=mask,
                           training=training)
        outputs = self.layer_outputs(selection, meta, {
            "pred_logits": out["logits"], "pred_boxes": out["boxes"],
            "pred_corners": out["corners"]})
        # Per-query tensors: (B, Q [+ N], k) -> the matching part, the denoising part.
        first = {"pred_logits": out["pre_logits"], "pred_boxes": out["pre_boxes"],
                 "ref_points": out["initial"]}
        matching, noised = {}, {}
        for key, x in first.items():
            part, rest = self.matching_part(ops.cast(x, "float32")[:, None], meta)
            matching[key], noised[key] = part[:, 0], None if rest is None else rest[:, 0]
        outputs["ref_points"] = matching.pop("ref_points")
        outputs["pre_outputs"] = matching
        if meta is not None:
            outputs["denoising"]["ref_points"] = noised.pop("ref_points")
            outputs["denoising"]["pre_outputs"] = noised
        return outputs


def dfine_criterion(num_classes: int, decoder, solver: str = "scipy", aux_loss: bool = True,
                    weights: dict | None = None,
                    costs: tuple[float, float, float] = (2.0, 5.0, 2.0), **deim):
    """D-FINE's set criterion (transformers' ``DFineConfig`` defaults): RT-DETR's matcher and
    varifocal / L1 / GIoU losses plus FGL and DDF on the edge distributions of ``decoder``
    (a `DFineDecoder`), weighted 1 / 5 / 2 / 0.15 / 1.5 (`weights` replaces them); see
    `vision.matching.fdr_losses`. `deim`: `vision.modeling.rtdetr.criterion_terms`'s
    switches of DEIM's losses."""
    from vision.matching.fdr_losses import DFineCriterion

    matcher = HungarianMatcher(*costs, solver=solver, classification="focal", alpha=0.25,
                               gamma=2.0)
    kwargs = {} if weights is None else {"weight_dict": weights}
    return DFineCriterion(num_classes, matcher, max_num_bins=decoder.max_num_bins,
                          reg_scale=decoder.reg_scale, up=decoder.up, aux_loss=aux_loss,
                          **criterion_terms(**deim), **kwargs)
