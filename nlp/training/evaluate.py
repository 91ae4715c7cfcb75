"""Corpus BLEU / chrF (sacrebleu) and exact match of a translator over sentence pairs.

A translator is any ``texts (N,) tf.string -> (N,) tf.string``:
`nlp.export.translator.make_translate_fn` in process, or `nlp.export.load.load_translator` for an
exported SavedModel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import sacrebleu
import tensorflow as tf

from tfx_transformer import checks

__all__ = ["translate_all", "nbest_all", "score", "evaluate"]


def _in_length_order(run: Callable, sources: Sequence[str], batch_size: int,
                     progress: bool) -> list:
    """``run(texts)`` (a list of one result per text) over ``sources``, in batches of
    similar length (sorted by characters: a batch decodes until its slowest sentence is done,
    and pads to its longest), the results in the order of ``sources``."""
    checks.positive_int("batch_size", batch_size)
    order = np.argsort([len(s) for s in sources], kind="stable")
    out: list = [None] * len(sources)
    bar = keras.utils.Progbar(len(sources), unit_name="sentence") if progress else None
    for start in range(0, len(sources), batch_size):
        index = order[start:start + batch_size]
        for i, result in zip(index, run(tf.constant([sources[i] for i in index], tf.string))):
            out[i] = result
        if bar is not None:
            bar.add(len(index))
    return out


def translate_all(translate: Callable, sources: Sequence[str], batch_size: int = 64,
                  progress: bool = True) -> list[str]:
    """Translates ``sources`` in batches of similar length, keeping their order.

    Each sentence translates as it would alone (`nlp.search.decoding`: padding changes nothing), so
    the order of the batches changes no translation.

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """
    def run(texts):
        return [text.decode("utf-8") for text in translate(texts).numpy()]

    return _in_length_order(run, sources, batch_size, progress)


def nbest_all(translate_nbest: Callable, sources: Sequence[str], nbest: int | None = None,
              batch_size: int = 64, progress: bool = True) -> list[list[tuple[float, str]]]:
    """The n-best lists of ``sources``, in batches of similar length, keeping their order.

    Args:
        translate_nbest: ``texts (N,) -> (hypotheses (N, K), scores (N, K))``, e.g. a loaded
            translator's ``translate_nbest``.
        sources: the sentences.
        nbest: keep the first this many of each list (default: all ``K``).
        batch_size: sentences per call.
        progress: show a progress bar.

    Returns:
        One list per source of ``(score, hypothesis)``, best first.

    Raises:
        ValueError: ``batch_size`` or ``nbest`` is not a positive integer.
    """
    checks.positive_int("nbest", nbest, optional=True)

    def run(texts):
        hypotheses, scores = translate_nbest(texts)
        return [[(float(s), h.decode("utf-8")) for s, h in zip(row_scores, row)][:nbest]
                for row, row_scores in zip(hypotheses.numpy(), scores.numpy())]

    return _in_length_order(run, sources, batch_size, progress)


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacrebleu corpus BLEU and chrF, and the share of exact matches."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)], force=True)
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    exact = np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)])
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2),
            "exact_match": round(float(exact) if len(references) else 0.0, 4),
            "n": len(references)}


def evaluate(translate: Callable, pairs: Sequence[tuple[str, str]], batch_size: int = 64,
             progress: bool = True) -> tuple[dict, list[str]]:
    """Scores ``translate`` on ``(source, reference)`` pairs; returns (scores, hypotheses)."""
    hypotheses = translate_all(translate, [s for s, _ in pairs], batch_size, progress)
    return score(hypotheses, [t for _, t in pairs]), hypotheses
