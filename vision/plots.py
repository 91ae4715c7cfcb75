"""Pictures of detections: labelled boxes, and where a query looks (matplotlib, PNG)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from keras import ops

__all__ = ["cross_attention", "draw_detections", "plot_query_attention"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure_size(height: int, width: int, columns: int = 1) -> tuple[float, float]:
    scale = max(1.0, 480.0 / max(height, width)) / 100.0  # small images drawn larger
    # At least 2 inches a side, room for the title: an extreme aspect ratio (5000 x 10) is
    # drawn letterboxed instead of in a figure too thin to lay out.
    return columns * max(width * scale, 2.0), max(height * scale, 2.0)


def _draw_boxes(ax, boxes, scores, labels, class_names) -> None:
    import matplotlib.patches as patches
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    for box, score, label in zip(boxes, scores, labels):
        x0, y0, x1, y1 = (float(v) for v in box)
        colour = colours(int(label) % 10)
        ax.add_patch(patches.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False,
                                       edgecolor=colour, linewidth=2))
        name = class_names[int(label)] if class_names is not None else str(int(label))
        ax.text(x0, y0, f"{name} {float(score):.2f}", fontsize=8, color="white",
                verticalalignment="bottom", bbox=dict(facecolor=colour, alpha=0.8, pad=1,
                                                      edgecolor="none"))


def draw_detections(image: np.ndarray, boxes, scores, labels,
                    class_names: Sequence[str] | None, path: str | os.PathLike,
                    threshold: float | None = None, title: str | None = None) -> str:
    """Writes ``image`` with a labelled box per detection ("name score") as a PNG.

    Args:
        image: ``(H, W, 3)`` uint8.
        boxes: ``(N, 4)`` xyxy pixels; ``scores`` ``(N,)``; ``labels`` ``(N,)`` int.
        class_names: name of each label (None: the label number).
        path: output file.
        threshold: draw only detections with ``score > threshold``.
        title: figure title.

    Returns:
        ``path`` as a string.
    """
    plt = _pyplot()
    scores = np.asarray(scores).reshape(-1)
    keep = scores > threshold if threshold is not None else np.ones(scores.shape, bool)
    height, width = image.shape[:2]
    fig, ax = plt.subplots(figsize=_figure_size(height, width))
    ax.imshow(image, extent=(0, width, height, 0))  # pixel (r, c) covers [c, c + 1) x [r, r + 1)
    _draw_boxes(ax, np.asarray(boxes).reshape(-1, 4)[keep], scores[keep],
                np.asarray(labels).reshape(-1)[keep], class_names)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.fspath(path)


def cross_attention(model, inputs: dict) -> tuple[dict, np.ndarray, tuple[int, int]]:
    """DETR's forward pass in inference mode with the decoder's cross-attention weights.

    Args:
        model: a `vision.modeling.detr.DETR`.
        inputs: ``{"images": (B, H, W, 3) float32 normalized, "mask": (B, H, W) bool}``.

    Returns:
        ``(outputs, weights, (h, w))``: ``outputs`` has ``pred_logits`` and ``pred_boxes`` of
        the last layer (equal to ``model(inputs)``'s); ``weights`` ``(L, B, heads, Q, h * w)``
        is each decoder layer's attention of each query over the feature map cells (row-major
        over the ``(h, w)`` grid of stride ``model.backbone.stride``).
    """
    result = model.forward(inputs, training=False, return_cross_attention=True)
    outputs = {k: result.predictions[k] for k in ("pred_logits", "pred_boxes")}
    weights = ops.convert_to_numpy(ops.cast(result.cross_attention, "float32"))
    height, width = result.feature_size
    return outputs, weights, (int(height), int(width))


def plot_query_attention(model, image: np.ndarray, path: str | os.PathLike, image_size: int,
                         max_size: int | None, query: int | None = None, layer: int = -1,
                         class_names: Sequence[str] | None = None) -> str:
    """Draws one query's box and its decoder cross-attention map over the image (PNG).

    Left: the image with the query's box, class and score. Right: the attention of that
    query over the feature map (mean over heads of decoder layer ``layer``), upsampled to
    the image.

    Args:
        model: a `vision.modeling.detr.DETR`.
        image: ``(H, W, 3)`` uint8.
        path: output file.
        image_size, max_size: the evaluation resize (``DetrConfig.image_size``,
            ``max_image_size``).
        query: the query to show (default: the highest-scoring one).
        layer: decoder layer (default: the last).
        class_names: name of each label.

    Returns:
        ``path`` as a string.
    """
    from vision.export.saved_model import preprocess_images  # TensorFlow: only needed here
    from vision.modeling.postprocess import postprocess

    plt = _pyplot()
    image = np.asarray(image, np.uint8)
    inputs, sizes = preprocess_images(image[None], image_size, max_size)
    outputs, weights, (rows, cols) = cross_attention(model, inputs)
    post = {k: ops.convert_to_numpy(v)[0] for k, v in postprocess(outputs, sizes).items()}
    if query is None:
        query = int(np.argmax(post["scores"]))
    num_queries = weights.shape[3]
    if not -num_queries <= query < num_queries:
        raise ValueError(f"`query` must be in [0, {num_queries}). Received: query={query}")
    attention = weights[layer, 0, :, query].mean(axis=0).reshape(rows, cols)  # (h, w)
    height, width = image.shape[:2]
    resized = inputs["images"].shape[1:3]
    stride = model.backbone.stride  # each cell covers stride x stride resized pixels
    extent = [0, cols * stride * width / resized[1], rows * stride * height / resized[0], 0]
    fig, axes = plt.subplots(1, 2, figsize=_figure_size(height, width, 2))
    for ax in axes:
        ax.imshow(image, extent=(0, width, height, 0))
        ax.set_axis_off()
    _draw_boxes(axes[0], post["boxes"][query][None], post["scores"][query][None],
                post["labels"][query][None], class_names)
    axes[1].imshow(attention, cmap="inferno", alpha=0.6, extent=extent,
                   interpolation="bilinear")
    axes[1].set_xlim(0, width)
    axes[1].set_ylim(height, 0)
    layer_number = layer % weights.shape[0] + 1
    axes[0].set_title(f"query {query % num_queries}", fontsize=9)
    axes[1].set_title(f"decoder layer {layer_number} cross-attention", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return os.fspath(path)
