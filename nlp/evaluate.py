"""Corpus BLEU / chrF (sacrebleu) and exact match of a translator over sentence pairs.

A translator is any ``texts (N,) tf.string -> (N,) tf.string``: `nlp.export.make_translate_fn`
in process, or `nlp.export.load_translator` for an exported SavedModel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import sacrebleu
import tensorflow as tf

__all__ = ["translate_all", "score", "evaluate"]


def translate_all(translate: Callable, sources: Sequence[str], batch_size: int = 64,
                  progress: bool = True) -> list[str]:
    """Translates ``sources`` in batches of similar length, keeping their order.

    Raises:
        ValueError: ``batch_size`` is not a positive integer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}"
        )
    order = np.argsort([len(s) for s in sources], kind="stable")
    out: list[str] = [""] * len(sources)
    bar = keras.utils.Progbar(len(sources), unit_name="sentence") if progress else None
    for start in range(0, len(sources), batch_size):
        index = order[start:start + batch_size]
        texts = tf.constant([sources[i] for i in index], tf.string)
        for i, text in zip(index, translate(texts).numpy()):
            out[i] = text.decode("utf-8")
        if bar is not None:
            bar.add(len(index))
    return out


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
