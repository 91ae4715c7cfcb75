"""Greedy and beam search: cache equivalence, beam 1 = greedy, exactness against brute force."""

import itertools

import keras
import numpy as np
import pytest

from nlp import decoding
from nlp.model import Seq2SeqTransformer

EOS = 3


def _model(vocab_size, seed=0, sharpen=4.0):
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(vocab_size=vocab_size, num_encoder_layers=2, num_decoder_layers=2,
                               d_model=32, num_heads=4, ffn_dim=64, dropout=0.0)
    model.build()
    # Larger embeddings make the next-token distributions peaked, so hypotheses differ clearly.
    model.embedding.embeddings.assign(model.embedding.embeddings * sharpen)
    return model


SOURCE = np.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0], [4, 3, 0, 0, 0, 0]], "int32")


def test_cached_and_uncached_greedy_give_identical_tokens():
    model = _model(40)
    cached = decoding.compile_search(model, "greedy", extra_length=12)(SOURCE)
    uncached = decoding.compile_search(model, "greedy_uncached", extra_length=12)(SOURCE)
    cached, uncached = np.asarray(cached), np.asarray(uncached)
    assert cached.shape == (3, 18)
    np.testing.assert_array_equal(cached, uncached)
    # Every row ends with eos, then padding only.
    for row in cached:
        end = list(row).index(EOS)
        assert np.all(row[end + 1:] == 0) and np.all(row[:end] > 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_of_one_without_length_penalty_is_greedy(seed):
    model = _model(30, seed)
    greedy = decoding.greedy_search(model, SOURCE, extra_length=8)
    beam = decoding.beam_search(model, SOURCE, beam_size=1, alpha=0.0, extra_length=8)
    np.testing.assert_array_equal(np.asarray(beam), np.asarray(greedy))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _brute_force(model, source, max_length, alpha, tokens):
    """Best eos-terminated sequence over every sequence of `tokens`, scored independently."""
    memory, mask = model.encode(source[None])
    best, best_score = None, -np.inf
    for n in range(1, max_length + 1):
        for body in itertools.product(tokens, repeat=n - 1):
            seq = list(body) + [EOS]
            target_in = np.array([[2] + seq[:-1]], "int32")
            logits = np.asarray(model.decode(target_in, memory, mask))[0]  # (n, V)
            logp = 0.0
            for t, token in enumerate(seq):
                allowed = [EOS] if t == max_length - 1 else [EOS, *tokens]
                masked = np.full(logits.shape[-1], -np.inf)
                masked[allowed] = logits[t, allowed]
                logp += _log_softmax(masked)[token]
            score = logp / ((5 + n) / 6) ** alpha
            if score > best_score:
                best, best_score = seq, score
    return best, best_score


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_as_wide_as_vocabulary_finds_brute_force_optimum(alpha):
    # Vocabulary: pad, unk, bos, eos and two words; pad/bos/unk are never generated.
    vocab, max_length = 6, 3
    model = _model(vocab, seed=3, sharpen=2.0)
    sources = np.array([[4, 5, 3], [5, 3, 0], [4, 4, 3]], "int32")
    ids, scores = decoding.beam_search(model, sources, beam_size=vocab, alpha=alpha,
                                       max_length=max_length, return_scores=True)
    ids, scores = np.asarray(ids), np.asarray(scores)
    for row, score, source in zip(ids, scores, sources):
        want, want_score = _brute_force(model, source, max_length, alpha, tokens=[4, 5])
        got = list(row[: list(row).index(EOS) + 1])
        assert got == want
        np.testing.assert_allclose(score, want_score, rtol=1e-4)


def test_beam_search_rejects_bad_width():
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_search(_model(10), SOURCE, beam_size=0)
