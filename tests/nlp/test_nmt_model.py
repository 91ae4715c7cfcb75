"""Seq2SeqTransformer, its loss and metric, presets."""

import math

import keras
import numpy as np
import pytest

from nlp.config import preset
from nlp.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from nlp.model import Seq2SeqTransformer, build_model


def test_label_smoothed_loss_equals_hand_computation_with_padding():
    # Batch of 2 sentences, 3 target positions, vocabulary of 4; sentence 2 ends in padding.
    y_true = np.array([[1, 2, 3], [3, 0, 0]])
    logits = np.array([
        [[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
        [[1.0, 2.0, 3.0, 4.0], [9.0, 0.0, 0.0, 0.0], [0.0, 9.0, 0.0, 0.0]],
    ], "float32")
    eps, vocab = 0.1, 4
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if y_true[b, t] == 0:
                continue
            z = logits[b, t]
            log_p = [v - math.log(sum(math.exp(u) for u in z)) for v in z]
            target = [eps / vocab + (1 - eps) * (v == y_true[b, t]) for v in range(vocab)]
            total += -sum(q * lp for q, lp in zip(target, log_p))
            count += 1
    loss = MaskedLabelSmoothedCrossEntropy(label_smoothing=eps)
    np.testing.assert_allclose(float(loss(y_true, logits)), total / count, rtol=1e-6)
    # Pad positions contribute nothing: changing their logits changes nothing.
    changed = logits.copy()
    changed[1, 1:] = np.random.default_rng(0).normal(size=(2, 4)) * 10
    np.testing.assert_allclose(float(loss(y_true, changed)), total / count, rtol=1e-6)


def test_masked_accuracy_ignores_padding():
    y_true = np.array([[1, 2, 3], [3, 0, 0]])
    pred = np.zeros((2, 3, 4), "float32")
    pred[0, 0, 1] = pred[0, 1, 0] = pred[0, 2, 3] = 1  # right, wrong, right
    pred[1, 0, 3] = 1  # right; pad positions predict id 0 ("right" if padding counted)
    metric = MaskedAccuracy()
    metric.update_state(y_true, pred)
    assert float(metric.result()) == pytest.approx(3 / 4)


def _tiny(**kw):
    return Seq2SeqTransformer(vocab_size=50, num_encoder_layers=1, num_decoder_layers=1,
                              d_model=16, num_heads=2, ffn_dim=32, **kw)


BATCH = {"source": np.array([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0]], "int32"),
         "target_in": np.array([[2, 9, 10, 11], [2, 12, 0, 0]], "int32")}


def test_padding_in_source_does_not_change_outputs():
    model = _tiny(dropout=0.0)
    logits = np.asarray(model(BATCH))
    longer = {"source": np.pad(BATCH["source"], ((0, 0), (0, 3))),
              "target_in": BATCH["target_in"]}
    np.testing.assert_allclose(np.asarray(model(longer)), logits, atol=1e-5)
    assert logits.shape == (2, 4, 50) and logits.dtype == np.float32


def test_tied_embeddings_share_one_matrix():
    tied, untied = _tiny(), _tiny(tie_embeddings=False)
    tied(BATCH), untied(BATCH)
    assert len(untied.weights) - len(tied.weights) == 3  # target embedding + Dense kernel, bias
    h = np.random.default_rng(0).normal(size=(1, 16)).astype("float32")
    np.testing.assert_allclose(tied.project(h), h @ np.asarray(tied.embedding.embeddings).T,
                               rtol=1e-5, atol=1e-5)


def test_fit_step_save_and_load(tmp_path):
    model = _tiny()
    model.compile(optimizer="adam", loss=MaskedLabelSmoothedCrossEntropy(),
                  metrics=[MaskedAccuracy()])
    y = np.array([[9, 10, 11, 3], [12, 3, 0, 0]], "int32")
    before = np.asarray(model.embedding.embeddings).copy()
    history = model.fit(BATCH, y, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(before, model.embedding.embeddings)
    path = tmp_path / "nmt.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(BATCH), model(BATCH), atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_logits_are_float32_and_finite(policy):
    model = _tiny(dtype=policy)
    logits = model(BATCH)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.isfinite(np.asarray(logits)).all()


def test_presets():
    tiny, big = preset("tiny"), preset("big", dropout=0.2)
    assert (tiny.num_encoder_layers, tiny.d_model, tiny.num_heads, tiny.ffn_dim) == (2, 128, 4, 512)
    assert (big.d_model, big.num_heads, big.ffn_dim, big.dropout) == (1024, 16, 4096, 0.2)
    base = build_model(preset("base"), vocab_size=100)
    assert base.count_params() > 40_000_000
    with pytest.raises(ValueError, match="preset"):
        preset("huge")
    with pytest.raises(ValueError, match="d_modle"):
        preset("tiny", d_modle=3)
