"""Cross-attention heatmaps of a translation (matplotlib)."""

from __future__ import annotations

import os

import numpy as np

from nlp.search.decoding import greedy_search
from nlp.text.tokenizer import Tokenizer

__all__ = ["cross_attention", "plot_cross_attention"]


def cross_attention(model, tokenizer: Tokenizer, source: str, translation: str | None = None,
                    extra_length: int = 50):
    """Cross-attention weights of every layer and head while producing ``translation``.

    Args:
        model: a ``Seq2SeqTransformer``.
        tokenizer: its tokenizer.
        source: the source sentence.
        translation: the target sentence (default: the model's greedy translation).
        extra_length: greedy decoding length beyond the source length.

    Returns:
        ``(weights (L, H, T, S), source_pieces, target_pieces)``: row ``t`` is the attention
        while predicting target piece ``t`` (the last one is eos).
    """
    src = tokenizer.encode(source) + [tokenizer.eos_id]
    if translation is None:
        ids = np.asarray(greedy_search(model, np.array([src], "int32"),
                                       extra_length=extra_length))[0].tolist()
        tgt = ids[: ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids
    else:
        tgt = tokenizer.encode(translation)
    target_in = np.array([[tokenizer.bos_id] + tgt], "int32")
    weights = model.cross_attention(np.array([src], "int32"), target_in)  # (L, 1, H, T, S)
    weights = np.asarray(weights)[:, 0]  # (L, H, T, S)
    pieces = tokenizer.id_to_piece
    return weights, [pieces(i) for i in src], [pieces(i) for i in tgt] + ["</s>"]


def plot_cross_attention(model, tokenizer: Tokenizer, source: str, path: str | os.PathLike,
                         translation: str | None = None, layer: int = -1) -> str:
    """Draws every head of one decoder layer's cross-attention as a grid of heatmaps (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights, src, tgt = cross_attention(model, tokenizer, source, translation)
    heads = weights[layer]
    cols = min(4, len(heads))
    rows = -(-len(heads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= len(heads):
            ax.axis("off")
            continue
        ax.imshow(heads[h], cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h + 1}", fontsize=9)
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=7)
    layer_number = layer % len(weights) + 1
    fig.suptitle(f"decoder layer {layer_number} cross-attention: {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
