"""Fixtures the search tests share (one model and one brute-force scoring per process)."""

import itertools
import os
import sys

import numpy as np
import pytest

from nlp.search import decoding
from nlp.text.special_ids import BOS_ID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from search_models import BRUTE_MAX_LENGTH, BRUTE_VOCAB, EOS, SOURCE, log_softmax, random_model  # noqa: E402


@pytest.fixture(scope="session")
def brute_force():
    """(model, sources, every): a six-id model (pad/bos/unk are never generated) and, for each
    source, every eos-terminated sequence of the two words up to 3 tokens (1 + 2 + 4 = 7) with
    its log-probability, scored independently of any search: teacher forcing, each step
    normalized over the ids allowed there. Shared by the brute-force tests (one model, one
    scoring); each scores the sequences with its own length penalty."""
    model = random_model(BRUTE_VOCAB, seed=3, sharpen=2.0, layers=1)
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
                logp += log_softmax(masked)[token]
            scored.append((tuple(seq), logp))
        every.append(scored)
    return model, sources, every


@pytest.fixture(scope="session")
def greedy2():
    """(model, ids): a one-layer model and its greedy translation of SOURCE (extra_length 5),
    decoded once for the tests of `search` and of greedy scores."""
    model = random_model(30, seed=2, layers=1)
    return model, np.asarray(decoding.greedy_search(model, SOURCE, extra_length=5))
