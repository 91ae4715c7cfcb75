"""NoamSchedule and the mask helpers."""

import json

import keras
import numpy as np
import pytest

import tfx_transformer as tt
from tfx_transformer.layers.masks import check_mask_rank


def _noam(d, w, s, scale=1.0):
    return scale * d**-0.5 * min(s**-0.5, s * w**-1.5)


@pytest.mark.parametrize("step", [0, 1, 10, 99, 100, 101, 4000, 100000])
def test_noam_equals_formula(step):
    sched = tt.NoamSchedule(512, warmup_steps=100, scale=2.0)
    # Optimizer step `step` is the paper's step `step + 1` (documented).
    np.testing.assert_allclose(float(sched(step)), _noam(512, 100, step + 1, 2.0), rtol=1e-6)


def test_noam_first_step_is_positive_and_peaks_at_warmup():
    sched = tt.NoamSchedule(128, warmup_steps=50)
    values = np.array([float(sched(s)) for s in range(200)])
    assert values[0] > 0
    assert values.argmax() == 49
    assert np.all(np.diff(values[:50]) > 0) and np.all(np.diff(values[50:]) < 0)


def test_noam_config_round_trip_and_in_optimizer():
    sched = tt.NoamSchedule(256, warmup_steps=300, scale=0.5)
    again = tt.NoamSchedule.from_config(json.loads(json.dumps(sched.get_config())))
    assert float(again(123)) == float(sched(123))
    opt = keras.optimizers.Adam(learning_rate=sched, beta_2=0.98, epsilon=1e-9)
    opt2 = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(opt)))
    )
    assert float(opt2.learning_rate) == pytest.approx(float(sched(0)))
    with pytest.raises(ValueError, match="warmup_steps"):
        tt.NoamSchedule(128, warmup_steps=0)


def test_causal_mask_with_offset():
    np.testing.assert_array_equal(tt.causal_mask(3), np.tril(np.ones((3, 3), bool)))
    got = np.asarray(tt.causal_mask(2, 5, offset=2))
    np.testing.assert_array_equal(got, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def test_padding_and_merge_masks():
    ids = np.array([[5, 3, 0, 0], [1, 2, 3, 4]])
    pad = np.asarray(tt.padding_mask(ids, pad_id=0))
    np.testing.assert_array_equal(pad, ids != 0)
    merged = np.asarray(tt.merge_masks(pad[:, None, :], None, tt.causal_mask(4)))
    np.testing.assert_array_equal(merged, (ids != 0)[:, None, :] & np.tril(np.ones((4, 4), bool)))
    assert tt.merge_masks(None, None) is None


def test_key_padding_mask_and_to_attention_mask():
    valid = np.array([[1, 1, 0], [1, 1, 1]], bool)
    keys = np.asarray(tt.key_padding_mask(valid))
    assert keys.shape == (2, 1, 3)
    np.testing.assert_array_equal(keys[:, 0], valid)
    assert tt.key_padding_mask(None) is None
    np.testing.assert_array_equal(tt.to_attention_mask(valid), keys)
    per_query = np.random.default_rng(0).random((2, 4, 3)) > 0.5
    np.testing.assert_array_equal(tt.to_attention_mask(per_query), per_query)
    assert tt.to_attention_mask(None) is None
    with pytest.raises(ValueError, match=r"memory_mask.*\(3,\)"):
        tt.to_attention_mask(np.ones((3,), bool), "memory_mask")


def test_check_mask_rank():
    check_mask_rank(None)
    check_mask_rank(np.ones((2, 3), bool))
    check_mask_rank(np.ones((1, 1, 2, 3), bool))
    with pytest.raises(ValueError, match="attention_mask"):
        check_mask_rank(np.ones((1, 1, 1, 2, 3), bool), "attention_mask")
