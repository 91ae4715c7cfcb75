"""Greedy and beam search: cache equivalence, beam 1 = greedy, exactness against brute force."""

import itertools

import keras
import numpy as np
import pytest

from nlp.modeling.model import Seq2SeqTransformer
from nlp.search import beam, decoding, steps
from nlp.search.decoding import DecodingSettings
from nlp.text.special_ids import BOS_ID, EOS_ID

EOS = EOS_ID


def _model(vocab_size, seed=0, sharpen=4.0, layers=2):
    """A random model; two layers where the caches of several decoder layers are under test
    (and the n-best rescoring), one where only the search's own logic is."""
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(vocab_size=vocab_size, num_encoder_layers=layers,
                               num_decoder_layers=layers, d_model=32, num_heads=4, ffn_dim=64,
                               dropout=0.0)
    model.build()
    # Larger embeddings make the next-token distributions peaked, so hypotheses differ clearly.
    model.embedding.embeddings.assign(model.embedding.embeddings * sharpen)
    return model


SOURCE = np.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0], [4, 3, 0, 0, 0, 0]], "int32")


def test_cached_and_uncached_greedy_give_identical_tokens():
    # Eager: a trace costs seconds, and the searches are the same code traced or not (the
    # traced and XLA-compiled search: test_cached_search_compiles_with_xla).
    model = _model(40)
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
    model = _model(30, seed, layers=1)
    greedy = decoding.greedy_search(model, SOURCE, extra_length=8)
    beam = decoding.beam_search(model, SOURCE, beam_size=1, length_penalty=0.0,
                                extra_length=8)
    np.testing.assert_array_equal(np.asarray(beam), np.asarray(greedy))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


BRUTE_VOCAB, BRUTE_MAX_LENGTH = 6, 3  # pad, unk, bos, eos and two words; at most 3 tokens


@pytest.fixture(scope="module")
def brute_force():
    """(model, sources, every): a six-id model (pad/bos/unk are never generated) and, for each
    source, every eos-terminated sequence of the two words up to 3 tokens (1 + 2 + 4 = 7) with
    its log-probability, scored independently of any search: teacher forcing, each step
    normalized over the ids allowed there. Shared by the brute-force tests (one model, one
    scoring); each scores the sequences with its own length penalty."""
    model = _model(BRUTE_VOCAB, seed=3, sharpen=2.0, layers=1)
    sources = np.array([[4, 5, 3], [5, 3, 0], [4, 4, 3]], "int32")
    seqs = [[*body, EOS] for n in range(1, BRUTE_MAX_LENGTH + 1)
            for body in itertools.product([4, 5], repeat=n - 1)]
    # One row per sequence, padded after its end (the causal mask: padding changes no logit
    # of the sequence's own positions).
    target_in = np.array([[BOS_ID, *seq[:-1]] + [0] * (BRUTE_MAX_LENGTH - len(seq))
                          for seq in seqs], "int32")
    every = []
    for source in sources:
        memory, mask = model.encode(np.repeat(source[None], len(seqs), axis=0))
        logits = np.asarray(model.decode(target_in, memory, mask))  # (7, 3, V)
        scored = []
        for seq, row in zip(seqs, logits):
            logp = 0.0
            for t, token in enumerate(seq):
                allowed = [EOS] if t == BRUTE_MAX_LENGTH - 1 else [EOS, 4, 5]
                masked = np.full(BRUTE_VOCAB, -np.inf)
                masked[allowed] = row[t, allowed]
                logp += _log_softmax(masked)[token]
            scored.append((tuple(seq), logp))
        every.append(scored)
    return model, sources, every


def _penalized(scored, length_penalty):
    """``(score, seq)`` of every sequence, with the GNMT length penalty, best first."""
    return sorted(((logp / ((5 + len(seq)) / 6) ** length_penalty, seq) for seq, logp in scored),
                  reverse=True)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 2.0])
def test_beam_as_wide_as_vocabulary_finds_brute_force_optimum(brute_force, length_penalty):
    model, sources, every = brute_force
    ids, scores = decoding.beam_search(model, sources, beam_size=BRUTE_VOCAB,
                                       length_penalty=length_penalty,
                                       max_length=BRUTE_MAX_LENGTH, return_scores=True)
    ids, scores = np.asarray(ids), np.asarray(scores)
    for row, score, scored in zip(ids, scores, every):
        want_score, want = _penalized(scored, length_penalty)[0]
        got = list(row[: list(row).index(EOS) + 1])
        assert got == list(want)
        np.testing.assert_allclose(score, want_score, rtol=1e-4)


def test_beam_search_rejects_bad_width():
    with pytest.raises(ValueError, match="beam_size=0"):
        decoding.beam_search(_model(10), SOURCE, beam_size=0)


@pytest.fixture(scope="module")
def greedy2():
    """(model, ids): a one-layer model and its greedy translation of SOURCE (extra_length 5),
    decoded once for the tests of `search` and of greedy scores."""
    model = _model(30, seed=2, layers=1)
    return model, np.asarray(decoding.greedy_search(model, SOURCE, extra_length=5))


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


def _never_eos(vocab_size, seed=0):
    """A random model whose output bias rules eos out, so every sentence runs to its limit."""
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(vocab_size=vocab_size, num_encoder_layers=1, num_decoder_layers=1,
                               d_model=32, num_heads=4, ffn_dim=64, dropout=0.0,
                               tie_embeddings=False)
    bias = np.zeros(vocab_size, "float32")
    bias[EOS] = -1e4
    model.output_projection.bias.assign(bias)
    return model


@pytest.mark.parametrize("method, kwargs", [
    ("greedy", {}), ("greedy_uncached", {}), ("beam", dict(beam_size=3, length_penalty=0.6)),
])
def test_a_sentence_decodes_the_same_alone_and_beside_a_much_longer_one(method, kwargs):
    # Each sentence's limit is its own length (eos included) + extra_length, not the padded
    # batch's width: a sentence that runs to its limit decodes identically in both cases.
    # (Eager: tracing the search for each batch shape costs seconds; the traced search:
    # test_translator_export's loaded translator against eager `search`.)
    model, extra = _never_eos(30), 4
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
    model = _never_eos(30)
    ids = np.asarray(decoding.greedy_search(model, SOURCE, max_length=7))
    assert ids.shape == (3, 7) and np.all(ids[:, 6] == EOS) and np.all(ids[:, :6] > EOS)


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
            logp += _log_softmax(masked)[token]
        scores.append(logp / ((5 + len(seq)) / 6) ** length_penalty)
    return scores


@pytest.fixture(scope="module")
def model4():
    """The model of the n-best rescoring tests (built once for them)."""
    return _model(30, seed=4)


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
                step = _log_softmax(logits[t])
                step[[0, 1, BOS_ID]] = -np.inf  # pad, unk, bos
                if t == limit - 1:  # ForcedEOSTokenLogitsProcessor: eos alone, log p 0
                    step = np.where(np.arange(len(step)) == EOS, 0.0, -np.inf)
                logp += (_log_softmax(step) if renormalize else step)[token]
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
        best = _penalized(scored, length_penalty)[:BRUTE_VOCAB]
        assert _hypotheses(row) == [seq for _, seq in best]
        np.testing.assert_allclose(row_scores, [s for s, _ in best], rtol=1e-4)


def test_an_nbest_list_is_the_same_alone_and_in_a_batch():
    # The search runs on until no live hypothesis can enter any sentence's list, so a
    # sentence's list does not depend on how long the rest of its batch decodes.
    model = _model(30, seed=5, layers=1)
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


@pytest.mark.parametrize("nbest, traced", [(False, False), (True, True)])
def test_cached_beam_search_equals_uncached_past_the_first_cache_width(nbest, traced):
    # The never-ending model decodes every sentence to its limit (length + 12), beyond the
    # cache's first width (S + S // 4 + 8), so the padded cache is used too. The cached search
    # runs eagerly and, once, traced (a tf.function: the loops' shrinking shapes and the cache
    # padding between them in a graph); the uncached reference eagerly (a trace costs seconds).
    model, extra = _never_eos(30, seed=1), 12
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
    model = _never_eos(30, seed=3)
    source = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]], "int32")
    kwargs = dict(extra_length=12, return_scores=True)
    plain = decoding.compile_search(model, "greedy", **kwargs)(source)
    xla = decoding.compile_search(model, "greedy", jit_compile=True, **kwargs)(source)
    np.testing.assert_array_equal(np.asarray(xla[0]), np.asarray(plain[0]))
    np.testing.assert_allclose(np.asarray(xla[1]), np.asarray(plain[1]), rtol=1e-4)
    assert [list(r).index(EOS) for r in np.asarray(xla[0])] == [15, 16]  # past the first width
    uncached = decoding.greedy_search_uncached(model, source, extra_length=12)
    np.testing.assert_array_equal(np.asarray(plain[0]), np.asarray(uncached))


def test_nbest_lists_hold_k_finished_hypotheses_even_when_the_best_is_found_at_once():
    # eos is the likeliest first token: the best hypothesis is decided after one step, but the
    # list's others are not yet; the search goes on until they are.
    model, extra = _never_eos(30, seed=8), 5
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
