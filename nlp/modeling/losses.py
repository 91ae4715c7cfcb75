"""Label-smoothed cross-entropy and token accuracy over non-pad target tokens."""

from __future__ import annotations

import keras
from keras import ops

from nlp.text.special_ids import PAD_ID
from tfx_transformer import checks
from tfx_transformer.replicas import replica_sum

__all__ = ["MaskedLabelSmoothedCrossEntropy", "MaskedAccuracy"]


@keras.saving.register_keras_serializable(package="nlp")
class MaskedLabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against ``(1 − ε)·onehot(y) + ε/V``, averaged over non-pad tokens.

    Per token: ``ℓ = −(1 − ε)·log p_y − (ε/V)·Σ_v log p_v``; the batch loss is
    ``Σ ℓ·[y ≠ pad] / max(Σ [y ≠ pad], 1)``, so padding contributes nothing and the value does
    not depend on how much padding a batch has.

    Under a `tf.distribute` strategy with several replicas the count ``Σ [y ≠ pad]`` is that
    of the global batch (summed over the replicas,
    `tfx_transformer.replicas.replica_sum`):
    each replica returns its share of the global mean, so the replicas' losses add up to it
    and their gradients, which Keras sums, are the single-device gradients of the global
    batch. (Keras's trainer reports the loss multiplied by the number of replicas and
    averaged over them, which is again the global mean when the replicas hold as many rows,
    as `nlp.data.batching.make_batches` makes them.)

    Args:
        label_smoothing: ``ε``.
        pad_id: target id that is ignored.
        name: loss name.

    Call arguments:
        y_true: ``(B, T)`` int target ids.
        y_pred: ``(B, T, V)`` logits.
    """

    def __init__(self, label_smoothing: float = 0.1, pad_id: int = PAD_ID,
                 name: str = "label_smoothed_cross_entropy", **kwargs):
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum", **kwargs)
        self.label_smoothing = checks.fraction("label_smoothing", label_smoothing)
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)  # (B, T, V)
        nll = -ops.squeeze(ops.take_along_axis(log_probs, y_true[..., None], axis=-1), -1)
        smooth = -ops.mean(log_probs, axis=-1)  # (B, T): (1/V) Σ_v −log p_v
        eps = self.label_smoothing
        per_token = (1.0 - eps) * nll + eps * smooth
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        tokens = replica_sum(ops.sum(mask))  # of the global batch under a strategy
        return per_token * mask / ops.maximum(tokens, 1.0)

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id)
        return config


@keras.saving.register_keras_serializable(package="nlp")
class MaskedAccuracy(keras.metrics.Metric):
    """Share of non-pad target tokens whose arg-max prediction is right."""

    def __init__(self, pad_id: int = PAD_ID, name: str = "accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        hit = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true),
                       "float32")
        self.correct.assign_add(ops.sum(hit * mask))
        self.total.assign_add(ops.sum(mask))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
