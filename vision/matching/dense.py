"""Dense one-to-one matching: one matching for the box losses of every output of a decoder.

DEIM's and D-FINE's repositories (their ``use_uni_set``; transformers' DEIMv2
``use_dense_one_to_one``) score every output's box losses, and D-FINE's FGL and DDF, on the
union of the one-to-one matchings of the last layer, the earlier layers, the unrefined boxes
and the selected cells: a query that any of them matched is trained towards that target's box.
`vision.matching.losses.SetCriterion` applies it with ``dense_one_to_one=True``.
"""

from __future__ import annotations

from typing import Any, Callable

from keras import ops

__all__ = ["union_of_matches", "with_union"]

_MATCHED = ("pre_outputs", "enc_outputs")  # matched outputs besides the decoder layers


def union_of_matches(matches: list, num_targets: Any) -> Any:
    """``(B, Q)``: each query's target in the union of several ``(B, Q)`` matchings (-1:
    none): the target it was matched to most often, the lowest index among equals; -1 where
    no matching gave it one. One target may then have several queries."""
    counts = 0.0
    for match in matches:
        match = ops.cast(match, "int32")
        counts = counts + ops.one_hot(ops.maximum(match, 0), num_targets) * ops.cast(
            match >= 0, "float32")[..., None]  # (B, Q, M)
    best = ops.cast(ops.argmax(counts, axis=-1), "int32")
    return ops.stop_gradient(ops.where(ops.max(counts, axis=-1) > 0, best, -1))


def with_union(outputs: dict, match: Callable[[dict, str], Any], aux_loss: bool, valid: Any,
               num_boxes: Any) -> dict:
    """``outputs`` with, in the dict of each matched output (the last layer, with
    ``aux_loss`` every earlier one, ``pre_outputs``, ``enc_outputs``), its own matching
    ``"match"`` (``match(layer, where)``), the union of them all ``"union"`` and the union's
    normalizer ``"union_boxes"``: ``num_boxes`` (the targets, averaged over replicas) times
    the local share of queries the union assigns per valid target (on one replica, the
    number of queries it assigns), at least 1."""
    aux = list(outputs.get("aux_outputs") or []) if aux_loss else []
    extra_keys = [key for key in _MATCHED if key in outputs]
    layers = [outputs, *aux, *(outputs[key] for key in extra_keys)]
    names = ["outputs", *(f"outputs['aux_outputs'][{i}]" for i in range(len(aux))),
             *(f"outputs[{key!r}]" for key in extra_keys)]
    matches = [match(layer, name) for layer, name in zip(layers, names)]
    union = union_of_matches(matches, ops.shape(valid)[1])
    assigned = ops.sum(ops.cast(union >= 0, "float32"))
    targets = ops.maximum(ops.sum(ops.cast(valid, "float32")), 1.0)
    union_boxes = ops.maximum(num_boxes * assigned / targets, 1.0)
    extra = [{"match": own, "union": union, "union_boxes": union_boxes} for own in matches]
    new = {**outputs, **extra[0]}
    if aux:
        new["aux_outputs"] = [{**layer, **more} for layer, more in zip(aux, extra[1:])]
    for key, more in zip(extra_keys, extra[1 + len(aux):]):
        new[key] = {**outputs[key], **more}
    return new
