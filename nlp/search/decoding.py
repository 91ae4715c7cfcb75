"""Greedy and beam-search decoding with the KV cache, each one compiled loop (no Python loop
per token).

Both searches run in ``keras.ops.while_loop``; ``compile_search`` wraps one in
``tf.function`` (TensorFlow backend) or ``jax.jit`` (JAX backend). ``DecodingSettings`` holds
what a translator decodes with, and ``search`` runs the search those settings ask for.

Conventions shared by both:

* the model's ``banned_ids`` are never generated (``pad``, ``bos`` and ``unk`` for this
  project's models; the pad id, which is also the decoder start, for Marian models);
* each sentence gets at most its own limit of tokens, eos included: its source length (the
  non-pad ids, eos included) + ``extra_length``, or ``max_length`` when one is given; its last
  step may only be eos. So a sentence decodes the same alone and in a batch with longer ones
  (padding is masked and changes no limit);
* the output is ``(B, N)`` ids without the leading bos, eos then pad after the end, where
  ``N = S + extra_length`` (``S`` the padded source width) or ``max_length``;
* the loop ends as soon as every sentence of the batch is decided;
* the self-attention caches (one tensor per decoder layer, so no step copies them into one
  and back) start ``min(N, S + S // 4 + 8)`` positions wide and are padded to ``N`` only when
  a batch decodes past that. Every step rewrites the caches (beam search reorders them), so
  caches no wider than the translations are most of the speed; the tokens are the same, since
  positions not yet decoded are masked.
* with the TensorFlow backend (not under XLA, whose shapes are static), a sentence's rows
  leave the caches, the memory and the batch at the step that decides it
  (``drop_finished``), so later steps compute only the open sentences, as CTranslate2 does;
  beam search folds that into the gather that reorders its caches.

Beam search keeps ``K = beam_size`` live hypotheses. Every step scores all ``K·V`` extensions
by total log-probability (a top-``2K`` of each hypothesis's ``V``, then of those ``K·2K``);
extensions ending in eos that rank in the top ``K`` become finished hypotheses, scored with the
GNMT length penalty ``log p / ((5 + n) / 6) ** length_penalty`` (``n`` tokens, eos included);
the ``K`` best extensions not ending in eos stay live. The search stops for a sentence once no
live hypothesis can beat its best finished one (``log p`` only falls, so ``log p / lp(limit)``
bounds it), or, for an n-best list (``nbest=True``), its
``K``-th best one. With ``beam_size=1`` and ``length_penalty=0`` this is exactly greedy
search; with a beam at least as wide as the number of hypotheses it is exact.

``convention="transformers"`` decodes as transformers' ``generate`` does with its defaults
(``length_penalty=1.0``, ``early_stopping=False``), so that a converted Marian model
translates token for token as it did there: a finished hypothesis scores ``log p / n **
length_penalty``; the log-probabilities are normalized over the whole vocabulary, then the
banned ids are removed, then (``renormalize``, transformers' ``renormalize_logits``) they
are normalized again (bit for bit: one log-softmax over the allowed ids, the same up to
rounding, changed a translation); and a sentence
is done, its finished hypotheses frozen, once ``K`` have finished and the best live
hypothesis's ``log p / n ** length_penalty`` at its current length ``n`` does not beat the
``K``-th (a heuristic: a longer live hypothesis may still have scored higher).
"""

from __future__ import annotations

import dataclasses

import keras

from nlp.search.beam import beam_search, beam_search_uncached
from nlp.search.greedy import greedy_search, greedy_search_uncached
from tfx_transformer import checks

__all__ = [
    "CONVENTIONS",
    "DecodingSettings",
    "beam_search",
    "beam_search_uncached",
    "compile_search",
    "greedy_search",
    "greedy_search_uncached",
    "search",
]


CONVENTIONS = ("gnmt", "transformers")


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How a translator decodes (validated on construction).

    Attributes:
        beam_size: beam width ``K``; 1 means greedy search.
        length_penalty: GNMT exponent: score = ``log p / ((5 + len) / 6) ** length_penalty``
            (0 = plain log-probability).
        extra_length: decode at most source length + this many tokens.
        convention: ``"gnmt"`` (the GNMT penalty and an exact stopping rule) or
            ``"transformers"`` (transformers' ``generate``: ``log p / len ** length_penalty``
            and its stopping heuristic; see the module docstring).
        renormalize: the log-probabilities of a step are normalized over the ids that may
            be generated (the banned ids and, at a sentence's last step, all but eos
            removed); else over the whole vocabulary, the removed ids' share lost
            (transformers' ``renormalize_logits=False``).
        forced_bos_id: the id every translation starts with, at log-probability 0 (it counts
            as a generated token): transformers' ``forced_bos_token_id``, the target-language
            token of NLLB / M2M100 models; None: no forced first token.
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    extra_length: int = 50
    convention: str = "gnmt"
    renormalize: bool = True
    forced_bos_id: int | None = None

    def __post_init__(self):
        owner = type(self).__name__
        if self.convention not in CONVENTIONS:
            raise ValueError(f"`{owner}.convention` must be one of {CONVENTIONS}. Received: "
                             f"convention={self.convention!r}")
        checks.positive_int(f"{owner}.beam_size", self.beam_size)
        checks.non_negative_number(f"{owner}.length_penalty", self.length_penalty)
        checks.non_negative_int(f"{owner}.extra_length", self.extra_length)
        checks.boolean(f"{owner}.renormalize", self.renormalize)
        if self.forced_bos_id is not None:
            checks.non_negative_int(f"{owner}.forced_bos_id", self.forced_bos_id)

    def greedy(self) -> DecodingSettings:
        """The same settings with ``beam_size=1``."""
        return dataclasses.replace(self, beam_size=1)


def search(model, source, settings: DecodingSettings, max_length=None, nbest: bool = False,
           drop_finished: bool | None = None):
    """Decodes ``source`` as ``settings`` say: beam search, or greedy for ``beam_size=1``.

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids.
        settings: the ``DecodingSettings``.
        max_length: most tokens to generate for every sentence; default: each sentence's
            source length (non-pad ids) + ``settings.extra_length``.
        nbest: return the ``K = beam_size`` best hypotheses of every sentence and their
            scores (`beam_search` with ``nbest``; for ``beam_size=1`` the greedy translation
            with its score).
        drop_finished: decode only the open sentences (`beam_search`); default: on with
            TensorFlow, to be turned off under XLA.

    Returns:
        ``(B, N)`` int32 ids (``N = max_length`` or ``S + extra_length``); with ``nbest``,
        ids ``(B, K, N)`` and float32 scores ``(B, K)``, best first.
    """
    if not isinstance(settings, DecodingSettings):
        raise TypeError("`settings` must be a DecodingSettings. "
                        f"Received: type={type(settings).__name__}")
    if settings.beam_size > 1:
        return beam_search(model, source, beam_size=settings.beam_size,
                           length_penalty=settings.length_penalty, max_length=max_length,
                           extra_length=settings.extra_length, nbest=nbest,
                           convention=settings.convention, renormalize=settings.renormalize,
                           forced_bos_id=settings.forced_bos_id,
                           drop_finished=drop_finished)
    if nbest:
        ids, scores = greedy_search(model, source, max_length=max_length,
                                    extra_length=settings.extra_length, return_scores=True,
                                    length_penalty=settings.length_penalty,
                                    convention=settings.convention,
                                    renormalize=settings.renormalize,
                                    forced_bos_id=settings.forced_bos_id,
                                    drop_finished=drop_finished)
        return ids[:, None], scores[:, None]
    return greedy_search(model, source, max_length=max_length,
                         extra_length=settings.extra_length,
                         forced_bos_id=settings.forced_bos_id, drop_finished=drop_finished)


def compile_search(model, method: str = "beam", jit_compile: bool = False, **kwargs):
    """One compiled function ``source (B, S) -> ids (B, N)`` for the current backend.

    Args:
        model: a ``Seq2SeqTransformer``.
        method: ``"beam"``, ``"beam_uncached"``, ``"greedy"`` or ``"greedy_uncached"``.
        jit_compile: compile with XLA (TensorFlow backend; JAX always compiles). The uncached
            searches cannot be: their prefix grows. The cached ones then keep finished
            sentences in the batch (``drop_finished=False``: XLA's shapes are static).
        **kwargs: passed to the search (``beam_size``, ``length_penalty``, ``extra_length``,
            ``max_length``, ``nbest``...).
    """
    searches = {"beam": beam_search, "beam_uncached": beam_search_uncached,
                "greedy": greedy_search, "greedy_uncached": greedy_search_uncached}
    if method not in searches:
        raise ValueError(f"`method` must be one of {sorted(searches)}. Received: {method!r}")
    fn = searches[method]
    if method in ("beam", "greedy") and (jit_compile or keras.backend.backend() == "jax"):
        kwargs = {"drop_finished": False, **kwargs}

    def run(source):
        return fn(model, source, **kwargs)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(run, jit_compile=jit_compile, reduce_retracing=True, autograph=False)
    if backend == "jax":
        import jax

        return jax.jit(run)
    return run
