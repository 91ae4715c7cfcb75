"""Tests for DETR's optimizer (`vision.modeling.optimizer.DetrAdamW`): the backbone's learning
rate multiplier, decoupled weight decay per variable, PyTorch's AdamW step and global-norm
clipping."""

import keras
import numpy as np

from vision.config import preset
from vision.modeling.detr import build_model
from vision.modeling.optimizer import DetrAdamW, build_optimizer


def test_backbone_variables_get_the_multiplier_times_the_learning_rate():
    """With the preset's learning rate, then with the trainer's drop (a tenth of it)."""
    config = preset("tiny-detr", hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6,
                    tiny_filters=(8, 16, 16, 32), num_encoder_layers=1, num_decoder_layers=2,
                    weight_decay=0.0)  # a small tiny-detr, 3 classes
    model = build_model(config, 3)
    variables = model.trainable_variables
    backbone = {id(v) for v in model.backbone_variables}
    assert backbone and len(backbone) < len(variables)
    for dropped in (False, True):
        optimizer = build_optimizer(config, model)
        # The trainer's learning-rate drop sets the optimizer's rate; the backbone's follows.
        lr = config.learning_rate * (0.1 if dropped else 1.0)
        optimizer.learning_rate = lr
        for v in variables:
            v.assign(keras.ops.zeros_like(v))  # no float32 rounding of (w - step)
        # A constant gradient: the first Adam step moves every weight by exactly its rate.
        optimizer.apply([keras.ops.ones_like(v) for v in variables], variables)
        for v in variables:
            step = -keras.ops.convert_to_numpy(v)
            expected = lr * config.backbone_lr_multiplier if id(v) in backbone else lr
            np.testing.assert_allclose(step, expected, rtol=1e-3, err_msg=f"{v.path} {dropped=}")
    assert config.backbone_lr_multiplier < 1  # the comparison above is not trivial


def test_weight_decay_uses_each_variable_learning_rate():
    backbone_var = keras.Variable(np.full((2,), 2.0, "float32"), name="backbone_w")
    other_var = keras.Variable(np.full((3,), 2.0, "float32"), name="other_w")
    optimizer = DetrAdamW(learning_rate=0.5, weight_decay=0.1, backbone_lr_multiplier=0.1)
    optimizer.set_backbone_variables([backbone_var])
    zeros = [np.zeros((2,), "float32"), np.zeros((3,), "float32")]
    optimizer.apply(zeros, [backbone_var, other_var])  # zero gradient: decay only
    np.testing.assert_allclose(backbone_var.numpy(), 2.0 * (1 - 0.05 * 0.1), rtol=1e-6)
    np.testing.assert_allclose(other_var.numpy(), 2.0 * (1 - 0.5 * 0.1), rtol=1e-6)


def test_the_step_is_pytorch_adamw_with_epsilon_on_the_bias_corrected_root():
    """Three steps against PyTorch's AdamW written out: m_hat / (sqrt(v_hat) + eps), with
    gradients small enough (1e-8..1e-6) that Keras's eps on the uncorrected root differs."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(5).astype("float64")
    grads = [rng.choice([-1, 1], 5) * 10.0 ** rng.uniform(-8, -6, 5) for _ in range(3)]
    variable = keras.Variable(w0.astype("float32"), name="w")
    optimizer = DetrAdamW(learning_rate=1e-2, weight_decay=0.1, global_clipnorm=None)
    optimizer.set_backbone_variables([])
    w, m, v = w0.copy(), np.zeros(5), np.zeros(5)
    for t, g in enumerate(grads, 1):
        optimizer.apply([g.astype("float32")], [variable])
        w = w - 1e-2 * 0.1 * w
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        w = w - 1e-2 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    np.testing.assert_allclose(variable.numpy(), w, rtol=0, atol=1e-6)
    keras_eps = w0 - 1e-2 * 0.1 * w0 - 1e-2 * np.sqrt(1 - 0.999) / 0.1 * (0.1 * grads[0]) / (
        np.sqrt(0.001 * grads[0] ** 2) + 1e-8)  # Keras's Adam after one step, for contrast
    assert np.max(np.abs(keras_eps - (w0 - 1e-3 * w0 - 1e-2 * grads[0] / (
        np.abs(grads[0]) + 1e-8)))) > 1e-3


def test_gradients_are_clipped_by_the_global_norm_of_all_gradients():
    a = keras.Variable(np.zeros((2,), "float32"), name="a")  # backbone
    b = keras.Variable(np.zeros((3,), "float32"), name="b")
    optimizer = DetrAdamW(learning_rate=1e-3, weight_decay=0.0, global_clipnorm=0.1)
    optimizer.set_backbone_variables([a])
    grads = [np.full((2,), 3.0, "float32"), np.full((3,), 4.0, "float32")]
    optimizer.apply(grads, [a, b])
    total_norm = np.sqrt(2 * 9.0 + 3 * 16.0)
    momentum = {v.name: v.numpy() for v in optimizer.variables if v.name.endswith("_momentum")}
    # First moment after one step = (1 - beta_1) * clipped gradient.
    np.testing.assert_allclose(momentum["a_momentum"], 0.1 * 3.0 * 0.1 / total_norm, rtol=1e-5)
    np.testing.assert_allclose(momentum["b_momentum"], 0.1 * 4.0 * 0.1 / total_norm, rtol=1e-5)
