"""Greedy and beam search: cache equivalence, beam 1 = greedy, exactness against brute force."""

import os
import sys

import keras
import numpy as np
import pytest

from nlp.search import beam, decoding, steps
from nlp.search.decoding import DecodingSettings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from search_models import (  # noqa: E402
    BRUTE_MAX_LENGTH,
    BRUTE_VOCAB,
    EOS,
    SOURCE,
    never_eos_model,
    penalized,
    random_model,
)


def test_cached_and_uncached_greedy_give_identical_tokens():
    # Eager: a trace costs seconds, and the searches are the same code traced or not (the
    # traced and XLA-compiled search: test_cached_search_compiles_with_xla).
    model = random_model(40)
    cached = decoding.greedy_search(model, SOURCE, extra_length=12)
    uncached = decoding.greedy_search_uncached(model, SOURCE, extra_length=12)
    cached, uncached = np.asarray(cached), np.asarray(uncached)
    assert cached.shape == (3, 18)
    np.testing.assert_array_equal(cached, uncached)
    # Every row ends with eos, then padding only.
    for row in cached:
        end = list(row).index(EOS)
        assert np.all(row[end + 1:] == 0) and np.all(row[:end] > 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_of_one_without_length_penalty_is_greedy(seed):
    model = random_model(30, seed, layers=1)
    greedy = decoding.greedy_search(model, SOURCE, extra_length=8)
    beam = decoding.beam_search(model, SOURCE, beam_size=1, length_penalty=0.0,
                                extra_length=8)
    np.testing.assert_array_equal(np.asarray(beam), np.asarray(greedy))


@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 2.0])
def test_beam_as_wide_as_vocabulary_finds_brute_force_optimum(brute_force, length_penalty):
    model, sources, every = brute_force
    ids, scores = decoding.beam_search(model, sources, beam_size=BRUTE_VOCAB,
                                       length_penalty=length_penalty,
                                       max_length=BRUTE_MAX_LENGTH, return_scores=True)
    ids, scores = np.asarray(ids), np.asarray(scores)
    for row, score, scored in zip(ids, scores, every):
        want_score, want = penalized(scored, length_penalty)[0]
        got = list(row[: list(row).index(EOS) + 1])
        assert got == list(want)
        np.testing.assert_allclose(score, want_score, rtol=1e-4)


def test_beam_search_rejects_bad_width():
    with pytest.raises(ValueError, match="beam_size=0"):
        decoding.beam_search(random_model(10), SOURCE, beam_size=0)


def test_search_runs_what_the_settings_say(greedy2):
    model, greedy = greedy2
    beam = decoding.beam_search(model, SOURCE, beam_size=3, length_penalty=1.0, extra_length=5)
    settings = DecodingSettings(beam_size=3, length_penalty=1.0, extra_length=5)
    np.testing.assert_array_equal(decoding.search(model, SOURCE, settings), beam)
    np.testing.assert_array_equal(decoding.search(model, SOURCE, settings.greedy()), greedy)
    assert np.asarray(greedy).shape == (3, SOURCE.shape[1] + 5)
    with pytest.raises(TypeError, match="DecodingSettings"):
        decoding.search(model, SOURCE, 3)


def test_decoding_settings_defaults_and_greedy():
    settings = DecodingSettings()
    assert (settings.beam_size, settings.length_penalty, settings.extra_length) == (4, 0.6, 50)
    assert settings.greedy() == DecodingSettings(beam_size=1)
    assert DecodingSettings(length_penalty=0, extra_length=0).extra_length == 0


@pytest.mark.parametrize("field, value, message", [
    ("beam_size", 0, "`DecodingSettings.beam_size` must be a positive integer. "
                     "Received: beam_size=0"),
    ("beam_size", 2.0, "beam_size=2.0"),
    ("beam_size", True, "beam_size=True"),
    ("length_penalty", -0.1, "`DecodingSettings.length_penalty` must be a non-negative number. "
                             "Received: length_penalty=-0.1"),
    ("length_penalty", float("nan"), "length_penalty=nan"),
    ("length_penalty", "0.6", "length_penalty='0.6'"),
    ("extra_length", -1, "`DecodingSettings.extra_length` must be a non-negative integer. "
                         "Received: extra_length=-1"),
])
def test_decoding_settings_reject_bad_values(field, value, message):
    with pytest.raises(ValueError) as info:
        DecodingSettings(**{field: value})
    assert message in str(info.value)


@pytest.mark.parametrize("method, kwargs", [
    ("greedy", {}), ("greedy_uncached", {}), ("beam", dict(beam_size=3, length_penalty=0.6)),
])
def test_a_sentence_decodes_the_same_alone_and_beside_a_much_longer_one(method, kwargs):
    # Each sentence's limit is its own length (eos included) + extra_length, not the padded
    # batch's width: a sentence that runs to its limit decodes identically in both cases.
    # (Eager: tracing the search for each batch shape costs seconds; the traced search:
    # test_translator_export's loaded translator against eager `search`.)
    model, extra = never_eos_model(30), 4
    short, long = [5, 6, EOS], [*range(4, 24), EOS]
    searches = {"greedy": decoding.greedy_search, "greedy_uncached":
                decoding.greedy_search_uncached, "beam": decoding.beam_search}

    def run(source):
        return searches[method](model, source, extra_length=extra, **kwargs)

    alone = np.asarray(run(np.array([short], "int32")))[0]
    batch = np.asarray(run(np.array([short + [0] * (len(long) - len(short)), long], "int32")))
    limit = len(short) + extra
    assert alone.shape == (limit,) and batch.shape == (2, len(long) + extra)
    assert list(alone).index(EOS) == limit - 1 and np.all(alone[:-1] > EOS)  # ran to its limit
    np.testing.assert_array_equal(batch[0, :limit], alone)
    assert np.all(batch[0, limit:] == 0)  # then padding only, however long the batch
    assert list(batch[1]).index(EOS) == len(long) + extra - 1  # the long one: its own limit


def test_an_explicit_max_length_applies_to_every_sentence():
    model = never_eos_model(30)
    ids = np.asarray(decoding.greedy_search(model, SOURCE, max_length=7))
    assert ids.shape == (3, 7) and np.all(ids[:, 6] == EOS) and np.all(ids[:, :6] > EOS)


@pytest.mark.parametrize("nbest, traced", [(False, False), (True, True)])
def test_cached_beam_search_equals_uncached_past_the_first_cache_width(nbest, traced):
    # The never-ending model decodes every sentence to its limit (length + 12), beyond the
    # cache's first width (S + S // 4 + 8), so the padded cache is used too. The cached search
    # runs eagerly and, once, traced (a tf.function: the loops' shrinking shapes and the cache
    # padding between them in a graph); the uncached reference eagerly (a trace costs seconds).
    model, extra = never_eos_model(30, seed=1), 12
    source = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]], "int32")
    assert steps.FIRST_WIDTH_EXTRA + 5 + 5 // 4 < 5 + extra
    kwargs = dict(beam_size=3, length_penalty=0.6, extra_length=extra, nbest=nbest,
                  return_scores=True)
    cached = (decoding.compile_search(model, "beam", **kwargs)(source) if traced
              else decoding.beam_search(model, source, **kwargs))
    uncached = decoding.beam_search_uncached(model, source, **kwargs)
    np.testing.assert_array_equal(np.asarray(cached[0]), np.asarray(uncached[0]))
    np.testing.assert_allclose(np.asarray(cached[1]), np.asarray(uncached[1]), rtol=1e-5)
    ids = np.asarray(cached[0])
    ends = [list(r).index(EOS) for r in (ids[:, 0] if nbest else ids)]
    assert ends == [3 + extra, 4 + extra]  # ran to each sentence's limit


def test_cached_search_compiles_with_xla():
    # Static shapes: both cache widths and the padding between them are known to XLA. (Greedy
    # search: it shares the cache handling with beam search and compiles in half the time.)
    # Both compiled searches decode past the first cache width (S + S // 4 + 8 = 14) and equal
    # the uncached search (eager).
    model = never_eos_model(30, seed=3)
    source = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]], "int32")
    kwargs = dict(extra_length=12, return_scores=True)
    plain = decoding.compile_search(model, "greedy", **kwargs)(source)
    xla = decoding.compile_search(model, "greedy", jit_compile=True, **kwargs)(source)
    np.testing.assert_array_equal(np.asarray(xla[0]), np.asarray(plain[0]))
    np.testing.assert_allclose(np.asarray(xla[1]), np.asarray(plain[1]), rtol=1e-4)
    assert [list(r).index(EOS) for r in np.asarray(xla[0])] == [15, 16]  # past the first width
    uncached = decoding.greedy_search_uncached(model, source, extra_length=12)
    np.testing.assert_array_equal(np.asarray(plain[0]), np.asarray(uncached))


@pytest.mark.parametrize("beam_size, vocab_size", [(3, 40), (4, 5)])
def test_per_hypothesis_top_k_is_the_global_top_k_ties_included(beam_size, vocab_size):
    # Integer log-probabilities tie often; a dead hypothesis (NEG) and a vocabulary narrower
    # than 2K are the edge cases. The reference: one stable sort of all K·V extensions.
    rng = np.random.default_rng(0)
    batch = 6
    logp = -rng.integers(0, 4, (batch * beam_size, vocab_size)).astype("float32")
    alive = -rng.integers(0, 3, (batch, beam_size)).astype("float32")
    alive[0, 1:] = steps.NEG
    score, parent, token = (np.asarray(x) for x in beam._best_extensions(
        keras.ops.convert_to_tensor(alive), keras.ops.convert_to_tensor(logp), beam_size))
    flat = (alive[..., None] + logp.reshape(batch, beam_size, vocab_size)).reshape(batch, -1)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :2 * beam_size]
    np.testing.assert_array_equal(score, np.take_along_axis(flat, order, axis=1))
    np.testing.assert_array_equal(parent, order // vocab_size)
    np.testing.assert_array_equal(token, order % vocab_size)
