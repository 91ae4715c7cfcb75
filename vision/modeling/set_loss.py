"""How a detector trains under Keras ``fit``: its loss is a Hungarian-matched set criterion.

`SetLossModel` is the base class of `vision.modeling.detr.DETR` and
`vision.modeling.rtdetr.RTDetr`: ``compile`` takes the set ``criterion``
(`vision.matching.losses.SetCriterion`) in place of ``loss`` and DETR's AdamW by default, and
``compute_loss`` is DETR's distributed loss (``num_boxes`` all-reduced over the replicas).
Subclasses give ``num_classes``, ``backbone_variables`` and ``loss_trackers``, and may give
their own ``default_criterion``.
"""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer.replicas import OptimizerBuiltFirst, num_replicas, replica_sum
from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher
from vision.modeling.optimizer import DetrAdamW

__all__ = ["SetLossModel"]


class SetLossModel(OptimizerBuiltFirst, keras.Model):
    """A `keras.Model` trained on a `SetCriterion` (see the module docstring)."""

    criterion: SetCriterion | None = None

    def compile(self, optimizer=None, criterion: SetCriterion | None = None, jit_compile=False,
                **kwargs):
        """Configures training; ``loss`` is the set ``criterion``.

        Args:
            optimizer: defaults to ``DetrAdamW()`` (DETR's settings). A `DetrAdamW` without
                backbone variables gets this model's ``backbone_variables``.
            criterion: a `SetCriterion`; defaults to the model's ``default_criterion()``
                (DETR's: ``HungarianMatcher(1, 5, 2)``, ``eos_coef`` 0.1, weights 1/5/2,
                auxiliary losses).
            jit_compile: ``False`` by default because the matcher's default ``"scipy"`` solver
                is a host callback that XLA cannot compile; with a
                ``HungarianMatcher(solver="ops")`` criterion, ``True`` works.
            **kwargs: other ``keras.Model.compile`` arguments (not ``loss``).
        """
        if kwargs.get("loss") is not None:
            raise ValueError(
                "DETR's loss is its set `criterion`; pass `criterion=`, not `loss=`. "
                f"Received: loss={kwargs['loss']!r}"
            )
        kwargs.pop("loss", None)
        optimizer = DetrAdamW() if optimizer is None else keras.optimizers.get(optimizer)
        inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
        if isinstance(inner, DetrAdamW) and not inner.has_backbone_variables:
            inner.set_backbone_variables(self.backbone_variables)
        if criterion is None:
            criterion = self.default_criterion()
        self.criterion = criterion
        name = getattr(criterion, "class_loss", None)  # the tracker of its class term
        if name and self.loss_trackers and self.loss_trackers[0].name != name:
            self.loss_trackers[0] = keras.metrics.Mean(name=name)
        super().compile(optimizer=optimizer, jit_compile=jit_compile, **kwargs)

    def default_criterion(self) -> SetCriterion:
        """DETR's set criterion for this model's classes."""
        return SetCriterion(self.num_classes, HungarianMatcher())

    def get_compile_config(self):
        config = super().get_compile_config()
        if config and self.criterion is not None:
            config["criterion"] = keras.saving.serialize_keras_object(self.criterion)
        return config

    def compile_from_config(self, config):
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)  # so that its state can be loaded

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The criterion's ``"loss"`` on ``y = {"labels", "boxes", "valid"}``.

        Also updates the ``loss_trackers`` metrics (``loss_ce`` or ``loss_vfl``,
        ``loss_bbox``, ``loss_giou`` of the last layer).

        Under a `tf.distribute` strategy with ``n`` replicas this is DETR's distributed
        loss: ``num_boxes`` is the number of targets summed over the replicas (an
        all-reduce) divided by ``n``, then clamped to at least 1 (the criterion's clamp), as
        in facebookresearch/detr; and each replica returns its loss divided by ``n``, because
        Keras sums the replicas' gradients (DETR averages them) and reports the loss times
        ``n`` averaged over the replicas (Keras's ``unscale_loss_for_distribution``). The box
        losses then equal those of the global batch on one device. The classification loss
        is, as in DETR, each replica's own weighted mean averaged over the replicas: it
        equals the global one when the replicas' class weights add up alike (as many
        objects on each replica, or ``eos_coef = 1`` with images of one size).
        """
        del x, sample_weight, training
        if self.criterion is None:
            raise ValueError("Call `compile()` before training or evaluating the model.")
        if y is None or y_pred is None:
            return None
        replicas = num_replicas()  # 1 outside a replica context of several replicas
        num_boxes = replica_sum(self.criterion.count_boxes(y)) / replicas
        losses = self.criterion(y_pred, y, num_boxes=num_boxes)
        for tracker in self.loss_trackers:
            if tracker.name in losses:  # a criterion without that term leaves it alone
                tracker.update_state(losses[tracker.name])
        loss = losses["loss"]
        for extra in self.losses:  # regularization losses, if any
            loss = loss + ops.cast(extra, loss.dtype)
        if replicas > 1:
            loss = loss / replicas
        return loss
