"""Seq2SeqTransformer, its loss and metric, and the layout of its saved files."""

import json
import math
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest

from nlp.modeling.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from nlp.modeling.model import Seq2SeqTransformer
from nlp.text.special_ids import BOS_ID, EOS_ID

LAYOUT = Path(__file__).with_name("seq2seq_weights_layout.json")


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
    traces = []  # the train step is traced once: the optimizer is built before (two otherwise)
    train_step = model.train_step
    model.train_step = lambda data: (traces.append(1), train_step(data))[1]
    history = model.fit(BATCH, y, epochs=2, verbose=0)
    assert len(traces) == 1
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(before, model.embedding.embeddings)
    path = tmp_path / "nmt.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(BATCH), model(BATCH), atol=1e-6)


# Largest |logit difference| to float32 (logits here are about 3 in size): float16 keeps 11
# mantissa bits (seen: <= 0.004), bfloat16 8 (seen: <= 0.04).
MIXED_TOLERANCE = {"mixed_float16": 0.02, "mixed_bfloat16": 0.15}


@pytest.mark.parametrize("policy", sorted(MIXED_TOLERANCE))
def test_mixed_precision_logits_are_float32_and_match_float32(policy):
    keras.utils.set_random_seed(0)
    reference = _tiny()
    model = _tiny(dtype=policy)
    model.set_weights(reference.get_weights())
    logits, want = model(BATCH), np.asarray(reference(BATCH))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    np.testing.assert_allclose(np.asarray(logits), want, atol=MIXED_TOLERANCE[policy], rtol=0)
    # The cached step the searches use agrees with the full pass too.
    memory, mask = model.encode(BATCH["source"])
    cache = model.decoder.empty_cache(2, 4)
    cross = model.decoder.compute_cross_attention_cache(memory)
    step, _ = model.decode_step(BATCH["target_in"][:, :1], 0, cache, cross, mask)
    np.testing.assert_allclose(np.asarray(step), want[:, 0], atol=MIXED_TOLERANCE[policy])


# Relative difference of the first training loss to float32 on the same weights and batch
# (the loss is ~4 here; float32 log-softmax over float32 logits in both): float16 (seen:
# <= 1e-3), bfloat16 (seen: <= 5e-3).
STEP_TOLERANCE = {"mixed_float16": 0.01, "mixed_bfloat16": 0.03}


def test_mixed_precision_training_step_matches_float32():
    """One optimizer step: finite, float32 logits, loss and update close to float32's."""
    y = np.array([[9, 10, 11, 3], [12, 3, 0, 0]], "int32")
    keras.utils.set_random_seed(0)
    reference = _tiny(dropout=0.0)
    reference(BATCH)
    start = reference.get_weights()
    losses, updates = {}, {}
    for name in ("float32", *STEP_TOLERANCE):
        model = _tiny(dropout=0.0, dtype=name)
        model(BATCH)
        model.set_weights(start)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=False,
                      loss=MaskedLabelSmoothedCrossEntropy())
        if name == "mixed_float16":  # Keras scales the loss for float16
            assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert keras.backend.standardize_dtype(model(BATCH).dtype) == "float32"
        losses[name] = float(model.train_on_batch(BATCH, y))
        updates[name] = np.concatenate([(np.asarray(w, "float32") - s).ravel() for w, s in
                                        zip(model.get_weights(), start)])
    for policy, tolerance in STEP_TOLERANCE.items():
        assert np.isfinite(losses[policy])
        assert losses[policy] == pytest.approx(losses["float32"], rel=tolerance), policy
        cosine = updates[policy] @ updates["float32"] / (
            np.linalg.norm(updates[policy]) * np.linalg.norm(updates["float32"]))
        assert cosine > 0.95, policy  # Adam's first step is ~lr·sign(g): the same direction


def _h5_datasets(path) -> dict:
    found = {}

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            found[name] = list(item.shape)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found


@pytest.mark.parametrize("tie", [True, False])
def test_saved_weights_keep_the_layout_of_older_checkpoints(tmp_path, tie):
    # `*.weights.h5` and `.keras` files store variables by attribute path: an older
    # checkpoint loads only while every path and shape below stays the same.
    layout = json.loads(LAYOUT.read_text())
    model = Seq2SeqTransformer(vocab_size=12, num_encoder_layers=1, num_decoder_layers=2,
                               d_model=8, num_heads=2, ffn_dim=8, tie_embeddings=tie)
    model.save_weights(tmp_path / "m.weights.h5")
    assert _h5_datasets(tmp_path / "m.weights.h5") == layout["tied" if tie else "untied"]
    assert sorted(model.get_config()) == layout["config_keys"]


def test_cross_attention_rows_are_distributions_over_real_source_tokens():
    model = _tiny(dropout=0.0)
    weights = np.asarray(model.cross_attention(BATCH["source"], BATCH["target_in"]))
    assert weights.shape == (1, 2, 2, 4, 5)  # (L, B, H, T, S)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(weights[:, 1, :, :, 2:], 0.0)  # source 2 is padded after 2
    assert BOS_ID == 2 and EOS_ID == 3  # the ids BATCH is written with
