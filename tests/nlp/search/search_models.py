"""The random models and the written-out scoring the search tests share."""

import keras
import numpy as np

from nlp.modeling.model import Seq2SeqTransformer
from nlp.text.special_ids import EOS_ID

EOS = EOS_ID


def random_model(vocab_size, seed=0, sharpen=4.0, layers=2):
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


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def penalized(scored, length_penalty):
    """``(score, seq)`` of every sequence, with the GNMT length penalty, best first."""
    return sorted(((logp / ((5 + len(seq)) / 6) ** length_penalty, seq) for seq, logp in scored),
                  reverse=True)


def never_eos_model(vocab_size, seed=0):
    """A random model whose output bias rules eos out, so every sentence runs to its limit."""
    keras.utils.set_random_seed(seed)
    model = Seq2SeqTransformer(vocab_size=vocab_size, num_encoder_layers=1, num_decoder_layers=1,
                               d_model=32, num_heads=4, ffn_dim=64, dropout=0.0,
                               tie_embeddings=False)
    bias = np.zeros(vocab_size, "float32")
    bias[EOS] = -1e4
    model.output_projection.bias.assign(bias)
    return model


BRUTE_VOCAB, BRUTE_MAX_LENGTH = 6, 3  # pad, unk, bos, eos and two words; at most 3 tokens
