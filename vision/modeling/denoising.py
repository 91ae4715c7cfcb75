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

__all__ = ["ContrastiveDenoising", "RTDetrDenoising"]

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

    keep_padding = False  # padding queries: masked as keys, left out of the loss

    def __init__(self, groups: int, num_classes: int, hidden_dim: int, label_noise: float = 0.5,
                 box_noise: float = 1.0, seed: int | None = None, **kwargs):
        # The boxes and their noise stay float32 under a mixed policy (the content is made in
        # the compute dtype).
        kwargs.setdefault("autocast", False)
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
        if not self.active(targets, training):
            return start, None
        content, reference, meta = self.noised(targets)
        mask = self.attention_mask(start.self_attention_mask, ops.shape(start.content)[0],
                                   start.content.shape[1], meta)
        position = queries.embed(ops.sigmoid(reference))
        combined = QueryOutput(
            ops.concatenate([start.content, ops.cast(content, start.content.dtype)], axis=1),
            ops.concatenate([start.position, ops.cast(position, start.position.dtype)], axis=1),
            ops.concatenate([start.reference, reference], axis=1), start.extra, mask)
        return combined, {**meta, "matching": start.content.shape[1]}

    def active(self, targets: dict | None, training) -> bool:
        """Whether denoising queries are added: in training, with targets and groups."""
        return bool(self.groups and training and targets is not None)

    def noised(self, targets: dict):
        """The denoising queries of a batch's ``targets`` (``labels``, ``boxes``, ``valid``,
        padded): `call` on the target slots up to the batch's most objects ``M`` (the data
        pads to ``num_queries``)."""
        valid = ops.cast(targets["valid"], "bool")
        m = ops.max(ops.sum(ops.cast(valid, "int32"), axis=1))
        labels = ops.cast(targets["labels"], "int32")[:, :m]  # (B, M)
        boxes = ops.cast(targets["boxes"], "float32")[:, :m]  # (B, M, 4)
        return self(labels, boxes, valid[:, :m])

    def attention_mask(self, own, batch, count: int, meta: dict):
        """The self-attention mask ``(B, T + N, T + N)`` (``True`` = may attend) of ``count``
        = ``T`` matching queries (their own mask ``own``, or ``None``) followed by the ``N``
        denoising ones of ``meta``: the matching queries see none of the denoising ones, each
        group sees the matching queries and its own group's keys (its valid ones, unless
        `keep_padding`)."""
        n = ops.shape(meta["labels"])[1]
        if own is None:
            own = ops.ones((batch, count, count), "bool")
        size = ops.maximum(n // ops.cast(ops.maximum(meta["groups"], 1.0), "int32"), 1)
        group = ops.arange(n) // size  # (N,)
        same = ops.logical_and(ops.equal(group[:, None], group[None, :])[None],
                               ops.cast(meta["valid"], "bool")[:, None, :])  # (B, N, N)
        return ops.concatenate([
            ops.concatenate([own, ops.zeros((batch, count, n), "bool")], axis=2),
            ops.concatenate([ops.ones((batch, n, count), "bool"), same], axis=2),
        ], axis=1)

    def group_count(self, m):
        """Groups for a batch whose most objects is ``m``: `groups`."""
        del m
        return self.groups

    def call(self, labels, boxes, valid):
        """``(B, M)`` labels, ``(B, M, 4)`` cxcywh boxes, ``(B, M)`` validity -> content
        ``(B, N, d)``, reference logits ``(B, N, 4)`` and the loss's ``labels``, ``boxes``,
        ``positive`` (a valid target's positive query), ``valid`` (the queries that take part:
        with `keep_padding` all of them) (each ``(B, N, ...)``) and ``groups``, ``N = 2 *
        groups * M``: group by group, the M positives then the M negatives."""
        m = ops.shape(labels)[1]
        groups = self.group_count(m)
        copies = 2 * groups
        labels = ops.tile(labels, [1, copies])  # (B, N)
        boxes = ops.tile(boxes, [1, copies, 1])
        valid = ops.tile(valid, [1, copies])
        positive = ops.tile(ops.arange(2 * m) < m, [groups])[None]  # (1, N)
        positive = ops.broadcast_to(positive, ops.shape(labels))
        noised_labels, reference = self.draw(labels, boxes, positive)
        content = self.embed_labels(noised_labels, valid)
        return content, reference, {
            "labels": labels, "boxes": boxes, "positive": ops.logical_and(positive, valid),
            "valid": ops.ones_like(valid) if self.keep_padding else valid,
            "groups": ops.cast(groups, "float32")}

    def draw(self, labels, boxes, positive):
        """The noise: ``(B, N)`` labels, each replaced by a random class with probability
        ``label_noise / 2``, and the reference logits ``(B, N, 4)`` of the ``(B, N, 4)``
        boxes moved corner by corner (``positive`` ``(B, N)``: within ``box_noise`` half
        sizes, else between one and two)."""
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
        return noised_labels, self.logit(box_xyxy_to_cxcywh(corners))

    def embed_labels(self, labels, valid):
        """The content of queries of (noised) ``labels`` (a padding query's is of no
        consequence: it is masked and left out of the loss)."""
        del valid
        return ops.take(ops.cast(self.label_embed, self.compute_dtype), ops.maximum(labels, 0),
                        axis=0)

    @staticmethod
    def logit(x):
        """The inverse sigmoid of the noised boxes (clamped at DINO's 1e-3)."""
        return _logit(x)

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


@keras.saving.register_keras_serializable(package="vision")
class RTDetrDenoising(ContrastiveDenoising):
    """RT-DETR's denoising queries (transformers' ``get_contrastive_denoising_training_group``).

    As `ContrastiveDenoising`, but:

    - about ``num_denoising`` queries in all: ``groups = max(1, num_denoising // M)`` for the
      batch's most objects ``M``;
    - the label table has a row more, ``num_classes``, the padding slots' label
      (transformers' ``denoising_class_embed``, ``padding_idx=num_labels``), Glorot-uniform
      initialized as there; padding slots keep it (no label noise) and it is not trained;
    - padding queries stay in: each group's queries see its padding ones, and the varifocal
      loss takes them as negatives;
    - noised boxes go to logit space clamped at 1e-5 (RT-DETR's ``inverse_sigmoid``).

    Args:
        num_denoising: the denoising queries' budget (transformers' ``num_denoising``; 0:
            none, no weights).
        num_classes, hidden_dim, label_noise, box_noise, seed: as `ContrastiveDenoising`
            (``label_noise`` is transformers' ``label_noise_ratio``, ``box_noise`` its
            ``box_noise_scale``).
        **kwargs: base layer arguments.
    """

    keep_padding = True

    def __init__(self, num_denoising: int, num_classes: int, hidden_dim: int,
                 label_noise: float = 0.5, box_noise: float = 1.0, seed: int | None = None,
                 **kwargs):
        self.num_denoising = checks.non_negative_int("num_denoising", num_denoising)
        super().__init__(1 if num_denoising else 0, num_classes, hidden_dim, label_noise,
                         box_noise, seed, **kwargs)

    def build(self, input_shape=None):
        if self.groups:
            self.label_embed = self.add_weight(
                shape=(self.num_classes + 1, self.hidden_dim), name="label_embed",
                initializer="glorot_uniform")

    def group_count(self, m):
        return ops.maximum(self.num_denoising // ops.maximum(m, 1), 1)

    def embed_labels(self, labels, valid):
        content = ops.take(ops.cast(self.label_embed, self.compute_dtype),
                           ops.where(valid, labels, self.num_classes), axis=0)
        # The padding row gets no gradient (``padding_idx``).
        return ops.where(valid[..., None], content, ops.stop_gradient(content))

    @staticmethod
    def logit(x):
        from vision.modeling.rtdetr_decoder import inverse_sigmoid

        return inverse_sigmoid(x)

    def get_config(self):
        config = super().get_config()
        del config["groups"]
        config["num_denoising"] = self.num_denoising
        return config
