"""N-best lists of the beam search: sorted, distinct, rescorable by teacher forcing, the brute
force's top k, the same alone and in a batch, transformers' convention, greedy's scores."""

import os
import sys

import numpy as np
import pytest

from nlp.search import decoding
from nlp.search.decoding import DecodingSettings
from nlp.text.special_ids import BOS_ID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from search_models import (  # noqa: E402
    BRUTE_MAX_LENGTH,
    BRUTE_VOCAB,
    EOS,
    SOURCE,
    log_softmax,
    never_eos_model,
    penalized,
    random_model,
)


def _teacher_forced(model, source, hypotheses):
    """The float64 logits ``(n, V)`` of each hypothesis (token ids through eos) of ``source``,
    by teacher forcing: one decoder pass over all of them, each row padded after its end (the
    causal mask: padding changes none of the logits of the row's own positions)."""
    width = max(len(h) for h in hypotheses)
    target_in = np.array([[BOS_ID, *h[:-1]] + [0] * (width - len(h)) for h in hypotheses],
                         "int32")
    memory, mask = model.encode(np.repeat(source[None], len(hypotheses), axis=0))
    logits = np.asarray(model.decode(target_in, memory, mask)).astype("float64")  # (K, n, V)
    return [row[: len(h)] for h, row in zip(hypotheses, logits)]


def _rescore(model, source, hypotheses, length_penalty, extra_length):
    """The scores of the hypotheses (ids, through eos, of ``source``), computed by teacher
    forcing: the log-probability of every token among those allowed at its step, over the
    GNMT length penalty."""
    seqs = [list(ids)[: list(ids).index(EOS) + 1] for ids in hypotheses]
    limit = int(np.sum(source != 0)) + extra_length
    scores = []
    for seq, logits in zip(seqs, _teacher_forced(model, source, seqs)):
        logp = 0.0
        for t, token in enumerate(seq):
            masked = logits[t].copy()
            masked[[0, 1, BOS_ID]] = -np.inf  # pad, unk, bos
            if t == limit - 1:
                masked[np.arange(len(masked)) != EOS] = -np.inf
            logp += log_softmax(masked)[token]
        scores.append(logp / ((5 + len(seq)) / 6) ** length_penalty)
    return scores


@pytest.fixture(scope="module")
def model4():
    """The model of the n-best rescoring tests (built once for them)."""
    return random_model(30, seed=4)


def _hypotheses(row):
    """The token lists (through eos) of one sentence's n-best ids ``(K, N)``."""
    return [tuple(ids[: list(ids).index(EOS) + 1]) for ids in row]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_nbest_lists_are_sorted_distinct_rescorable_and_start_with_the_best(model4,
                                                                             length_penalty):
    model, extra = model4, 5
    kwargs = dict(beam_size=3, length_penalty=length_penalty, extra_length=extra)
    best, best_score = decoding.beam_search(model, SOURCE, return_scores=True, **kwargs)
    ids, scores = decoding.beam_search(model, SOURCE, nbest=True, **kwargs)
    ids, scores = np.asarray(ids), np.asarray(scores)
    assert ids.shape == (3, 3, SOURCE.shape[1] + extra) and scores.shape == (3, 3)
    assert scores.dtype == np.float32
    np.testing.assert_array_equal(ids[:, 0], best)
    np.testing.assert_allclose(scores[:, 0], best_score, rtol=1e-6)
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    for source, row, row_scores in zip(SOURCE, ids, scores):
        hypotheses = _hypotheses(row)
        assert len(set(hypotheses)) == 3  # K different translations
        want = _rescore(model, source, hypotheses, length_penalty, extra)
        np.testing.assert_allclose(row_scores, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("renormalize", [False, True])
def test_transformers_convention_scores_log_p_over_length(model4, renormalize):
    # transformers' generate: log-softmax over the whole vocabulary, the banned ids removed
    # (and, with renormalize_logits, a log-softmax again), score log p / n ** length_penalty;
    # at a row's last step its forced eos replaces the step's scores by 0 for eos alone.
    model, extra = model4, 5
    settings = decoding.DecodingSettings(beam_size=3, length_penalty=1.0, extra_length=extra,
                                         convention="transformers", renormalize=renormalize)
    ids, scores = decoding.search(model, SOURCE, settings, nbest=True)
    best = decoding.search(model, SOURCE, settings)
    np.testing.assert_array_equal(np.asarray(ids)[:, 0], np.asarray(best))
    for source, row, row_scores in zip(SOURCE, np.asarray(ids), np.asarray(scores)):
        limit = int(np.sum(source != 0)) + extra
        hypotheses = _hypotheses(row)
        for hypothesis, score, logits in zip(hypotheses, row_scores,
                                             _teacher_forced(model, source, hypotheses)):
            seq = list(hypothesis)
            logp = 0.0
            for t, token in enumerate(seq):
                step = log_softmax(logits[t])
                step[[0, 1, BOS_ID]] = -np.inf  # pad, unk, bos
                if t == limit - 1:  # ForcedEOSTokenLogitsProcessor: eos alone, log p 0
                    step = np.where(np.arange(len(step)) == EOS, 0.0, -np.inf)
                logp += (log_softmax(step) if renormalize else step)[token]
            np.testing.assert_allclose(score, logp / len(seq), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
def test_nbest_with_a_beam_as_wide_as_the_vocabulary_is_the_brute_force_top_k(brute_force,
                                                                              length_penalty):
    # Every sequence of the two words up to 3 tokens: 1 + 2 + 4 = 7 hypotheses; the 6 best.
    model, sources, every = brute_force
    ids, scores = decoding.beam_search(model, sources, beam_size=BRUTE_VOCAB, nbest=True,
                                       length_penalty=length_penalty,
                                       max_length=BRUTE_MAX_LENGTH)
    ids, scores = np.asarray(ids), np.asarray(scores)
    for row, row_scores, scored in zip(ids, scores, every):
        best = penalized(scored, length_penalty)[:BRUTE_VOCAB]
        assert _hypotheses(row) == [seq for _, seq in best]
        np.testing.assert_allclose(row_scores, [s for s, _ in best], rtol=1e-4)


def test_an_nbest_list_is_the_same_alone_and_in_a_batch():
    # The search runs on until no live hypothesis can enter any sentence's list, so a
    # sentence's list does not depend on how long the rest of its batch decodes.
    model = random_model(30, seed=5, layers=1)
    ids, scores = decoding.beam_search(model, SOURCE, beam_size=3, nbest=True, extra_length=6)
    for row in range(len(SOURCE)):
        alone = SOURCE[row: row + 1, : int(np.sum(SOURCE[row] != 0))]
        one_ids, one_scores = decoding.beam_search(model, alone, beam_size=3, nbest=True,
                                                   extra_length=6)
        assert _hypotheses(np.asarray(one_ids)[0]) == _hypotheses(np.asarray(ids)[row])
        np.testing.assert_allclose(np.asarray(one_scores)[0], np.asarray(scores)[row],
                                   rtol=1e-5)


def test_greedy_scores_and_the_nbest_list_of_a_beam_of_one(greedy2):
    (model, greedy), extra = greedy2, 5
    ids, scores = decoding.greedy_search(model, SOURCE, extra_length=extra, return_scores=True,
                                         length_penalty=0.6)
    np.testing.assert_array_equal(ids, greedy)
    for source, row, score in zip(SOURCE, np.asarray(ids), np.asarray(scores)):
        np.testing.assert_allclose(score, _rescore(model, source, [row], 0.6, extra)[0],
                                   rtol=1e-4)
    settings = DecodingSettings(beam_size=1, length_penalty=0.6, extra_length=extra)
    nbest_ids, nbest_scores = decoding.search(model, SOURCE, settings, nbest=True)
    np.testing.assert_array_equal(np.asarray(nbest_ids)[:, 0], ids)
    np.testing.assert_allclose(np.asarray(nbest_scores)[:, 0], scores)
    wide = DecodingSettings(beam_size=3, length_penalty=0.6, extra_length=extra)
    assert np.asarray(decoding.search(model, SOURCE, wide, nbest=True)[0]).shape == (3, 3, 11)


def test_nbest_lists_hold_k_finished_hypotheses_even_when_the_best_is_found_at_once():
    # eos is the likeliest first token: the best hypothesis is decided after one step, but the
    # list's others are not yet; the search goes on until they are.
    model, extra = never_eos_model(30, seed=8), 5
    bias = np.zeros(30, "float32")
    bias[EOS] = 5.0
    model.output_projection.bias.assign(bias)
    ids, scores = decoding.beam_search(model, SOURCE, beam_size=3, nbest=True,
                                       extra_length=extra)
    ids, scores = np.asarray(ids), np.asarray(scores)
    assert np.all(ids[:, 0, 0] == EOS)  # the best: eos alone
    for source, row, row_scores in zip(SOURCE, ids, scores):
        assert all(EOS in list(hypothesis) for hypothesis in row)  # all finished
        hypotheses = _hypotheses(row)
        assert len(set(hypotheses)) == 3 and all(len(h) > 1 for h in hypotheses[1:])
        np.testing.assert_allclose(row_scores, _rescore(model, source, hypotheses, 0.6, extra),
                                   rtol=1e-4, atol=1e-4)
