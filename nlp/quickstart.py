"""The translation part of the quick start (`tfx_transformer.commands.quickstart`): the tiny
translator on the built-in English→German pairs, its held-out scores and samples, and its export
run."""

from __future__ import annotations

import os

__all__ = ["run"]


def run(root: str, minutes: float) -> None:
    """Trains the tiny translator in ``root/nmt`` for ``minutes``, prints its held-out scores
    and samples, and translates a sentence with its export."""
    import tensorflow as tf

    from nlp import config
    from nlp.export.load import load_translator
    from nlp.training.train import train_nmt
    from tfx_transformer.training.run import RunOptions
    from tfx_transformer.training.workdir import read_metrics

    workdir = os.path.join(root, "nmt")
    print(f"\n== translation: tiny Transformer, English -> German, {minutes:.1f} min ==")
    scores = train_nmt("embedded", workdir, config.preset("tiny"),
                       RunOptions(time_budget=minutes, eval_limit=300))
    print(f"held-out ({scores['n']} sentences): BLEU {scores['bleu']}, chrF {scores['chrf']}, "
          f"exact match {scores['exact_match']:.2f}")
    for sample in read_metrics(workdir)["samples"][:3]:
        print(f"  {sample['source']}\n    -> {sample['translation']}")
    translate = load_translator(os.path.join(workdir, "export"))
    sentence = "There are twenty-one apples in the garden."
    out = translate(tf.constant([sentence])).numpy()[0].decode()
    print(f"exported model ({workdir}/export): {sentence} -> {out}")
