"""Contrastive denoising queries (DN-DETR, DINO's CDN): noised ground truth as extra queries.

In training, each of ``groups`` groups adds two queries per ground-truth object to the
decoder: a *positive* one whose reference box is the object's box moved by less than
``box_noise`` times its half size (per corner, in xyxy), and a *negative* one moved by
between one and two times that; both take as content an embedding of the object's label,
which is replaced by a random class with probability ``label_noise / 2`` (DINO's
``dn_label_noise_ratio``, ``dn_box_noise_scale``). The set loss asks the positive queries
to reconstruct their object (class and box) and the negative ones to predict no-object,
without matching (`vision.matching.losses.SetCriterion`, ``outputs["denoising"]``).

The decoder's self-attention keeps the tasks apart: the matching queries (the query
strategy's, one-to-many ones included) see none of the denoising queries, and each group
sees the matching queries and its own valid queries only. The groups copy the target slots
up to the batch's most objects (not the data's padding to ``num_queries``). At inference (or with
``groups=0``) nothing is added. Needs a query strategy with reference boxes (its ``embed``
positions the denoising queries).
"""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer import checks
from vision.modeling.box_ops import box_cxcywh_to_xyxy, box_xyxy_to_cxcywh
from vision.modeling.queries import QueryOutput

__all__ = ["ContrastiveDenoising"]

_EPS = 1e-3  # DINO's inverse_sigmoid clamp


def _logit(x):
    x = ops.clip(x, _EPS, 1.0 - _EPS)
    return ops.log(x) - ops.log(1.0 - x)


@keras.saving.register_keras_serializable(package="vision")
class ContrastiveDenoising(keras.layers.Layer):
    """Adds denoising queries to a `QueryOutput` in training; see the module docstring.

    Args:
        groups: denoising groups (0: none, the layer then has no weights).
        num_classes: object classes ``C`` (labels are in ``[0, C)``).
        hidden_dim: ``d``.
        label_noise: twice the probability of replacing a label by a random class.
        box_noise: the box noise scale ``λ`` (positives within ``λ``, negatives within
            ``[λ, 2λ)`` half sizes).
        seed: seed of the noise.
        **kwargs: base layer arguments.
    """

    def __init__(self, groups: int, num_classes: int, hidden_dim: int, label_noise: float = 0.5,
                 box_noise: float = 1.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.groups = checks.non_negative_int("denoising_groups", groups)
        self.num_classes = num_classes
        self.hidden_dim = hidden_dim
        self.label_noise = checks.fraction("denoising_label_noise", label_noise, interval="[]")
        self.box_noise = checks.non_negative_number("denoising_box_noise", box_noise)
        self.seed = seed
        if self.groups:
            self.seed_generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape=None):
        if self.groups:
            # nn.Embedding's default N(0, 1), as DINO's label_enc.
            self.label_embed = self.add_weight(
                shape=(self.num_classes, self.hidden_dim), name="label_embed",
                initializer=keras.initializers.RandomNormal(stddev=1.0))

    def extend(self, start: QueryOutput, targets: dict | None, queries, training=None):
        """``start`` with the denoising queries appended (unchanged outside training, without
        targets, or with no groups), and what the loss needs of them (or ``None``)."""
        if not (self.groups and training and targets is not None):
            return start, None
        # The target slots up to the batch's most objects (the data pads to num_queries).
        valid = ops.cast(targets["valid"], "bool")
        m = ops.max(ops.sum(ops.cast(valid, "int32"), axis=1))
        labels = ops.cast(targets["labels"], "int32")[:, :m]  # (B, M)
        boxes = ops.cast(targets["boxes"], "float32")[:, :m]  # (B, M, 4)
        content, reference, meta = self(labels, boxes, valid[:, :m])  # (B, N, d), (B, N, 4)
        batch, count = ops.shape(start.content)[0], start.content.shape[1]
        n = 2 * self.groups * m
        own = start.self_attention_mask
        if own is None:
            own = ops.ones((batch, count, count), "bool")
        group = ops.arange(n) // (2 * m)  # (N,)
        same = ops.logical_and(ops.equal(group[:, None], group[None, :])[None],
                               meta["valid"][:, None, :])  # (B, N, N)
        mask = ops.concatenate([
            ops.concatenate([own, ops.zeros((batch, count, n), "bool")], axis=2),
            ops.concatenate([ops.ones((batch, n, count), "bool"), same], axis=2),
        ], axis=1)  # (B, T + N, T + N)
        position = queries.embed(ops.sigmoid(reference))
        combined = QueryOutput(
            ops.concatenate([start.content, ops.cast(content, start.content.dtype)], axis=1),
            ops.concatenate([start.position, ops.cast(position, start.position.dtype)], axis=1),
            ops.concatenate([start.reference, reference], axis=1), start.extra, mask)
        return combined, {**meta, "matching": count}

    def call(self, labels, boxes, valid):
        """``(B, M)`` labels, ``(B, M, 4)`` cxcywh boxes, ``(B, M)`` validity -> content
        ``(B, N, d)``, reference logits ``(B, N, 4)`` and the loss's ``labels``, ``boxes``,
        ``positive``, ``valid`` (each ``(B, N, ...)``) and ``groups``, ``N = 2 * groups *
        M``: group by group, the M positives then the M negatives."""
        m = ops.shape(labels)[1]
        copies = 2 * self.groups
        labels = ops.tile(labels, [1, copies])  # (B, N)
        boxes = ops.tile(boxes, [1, copies, 1])
        valid = ops.tile(valid, [1, copies])
        positive = ops.tile(ops.arange(2 * m) < m, [self.groups])[None]  # (1, N)
        positive = ops.broadcast_to(positive, ops.shape(labels))
        shape = ops.shape(labels)
        flip = keras.random.uniform(shape, seed=self.seed_generator) < self.label_noise / 2
        random_labels = keras.random.randint(shape, 0, self.num_classes, dtype="int32",
                                             seed=self.seed_generator)
        noised_labels = ops.where(flip, random_labels, labels)
        corners = box_cxcywh_to_xyxy(boxes)
        half = ops.concatenate([boxes[..., 2:] / 2, boxes[..., 2:] / 2], axis=-1)
        sign = ops.where(keras.random.uniform(ops.shape(boxes), seed=self.seed_generator) < 0.5,
                         -1.0, 1.0)
        part = keras.random.uniform(ops.shape(boxes), seed=self.seed_generator)
        part = ops.where(positive[..., None], part, part + 1.0)
        corners = ops.clip(corners + sign * part * half * self.box_noise, 0.0, 1.0)
        reference = _logit(box_xyxy_to_cxcywh(corners))
        content = ops.take(ops.cast(self.label_embed, self.compute_dtype),
                           ops.maximum(noised_labels, 0), axis=0)
        return content, reference, {"labels": labels, "boxes": boxes, "positive": positive,
                                    "valid": valid,
                                    "groups": ops.convert_to_tensor(self.groups, "float32")}

    def predictions(self, queries, logits, boxes, meta) -> dict:
        """The model's predictions (`QueryStrategy.predictions`) and, with denoising
        queries (after the first ``meta["matching"]``), theirs as ``"denoising"``: the three
        keys of a layer's outputs plus the loss's targets."""
        if meta is None:
            return queries.predictions(logits, boxes)
        t = meta["matching"]
        predictions = queries.predictions(logits[:, :, :t], boxes[:, :, :t])
        denoising = {
            "pred_logits": logits[-1, :, t:], "pred_boxes": boxes[-1, :, t:],
            "aux_outputs": [{"pred_logits": logits[i, :, t:], "pred_boxes": boxes[i, :, t:]}
                            for i in range(logits.shape[0] - 1)],
            **{key: meta[key] for key in ("labels", "boxes", "positive", "valid", "groups")},
        }
        return {**predictions, "denoising": denoising}

    def get_config(self):
        config = super().get_config()
        config.update(groups=self.groups, num_classes=self.num_classes,
                      hidden_dim=self.hidden_dim, label_noise=self.label_noise,
                      box_noise=self.box_noise, seed=self.seed)
        return config
