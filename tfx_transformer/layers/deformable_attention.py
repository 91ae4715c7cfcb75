"""Multi-scale deformable attention (Deformable DETR, RT-DETR, D-FINE), sampled by gather."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from tfx_transformer import checks
from tfx_transformer.layers.output import AttentionOutput, call_arguments
from tfx_transformer.layers.projection import dense_call

__all__ = ["MultiScaleDeformableAttention"]

METHODS = ("default", "discrete")


def _offset_bias(num_heads: int, num_points: list[int]) -> np.ndarray:
    """Deformable DETR's initial sampling offsets: head ``h`` looks along the direction
    ``2 pi h / num_heads`` (scaled to the unit square's border), its ``k``-th point of a level
    ``k + 1`` steps out. ``(H * P * 2,)`` in the layout of the ``sampling_offsets`` units."""
    thetas = np.arange(num_heads, dtype="float64") * (2.0 * math.pi / num_heads)
    grid = np.stack([np.cos(thetas), np.sin(thetas)], -1)
    grid = grid / np.abs(grid).max(-1, keepdims=True)  # (H, 2)
    steps = np.concatenate([np.arange(1, n + 1) for n in num_points])  # (P,)
    return (grid[:, None, :] * steps[None, :, None]).reshape(-1).astype("float32")


@keras.saving.register_keras_serializable(package="tfx_transformer")
class MultiScaleDeformableAttention(keras.layers.Layer):
    """Each query attends to a few points sampled around its reference on every feature level.

    For head ``h`` and point ``p`` (on level ``l``) a query predicts an offset
    (``sampling_offsets``) and a weight (``attention_weights``, softmaxed over all the points
    of all the levels of its head); the output is the weighted sum of the (projected) values
    bilinearly interpolated at ``reference + offset``, as in Deformable DETR and transformers'
    ``RTDetrMultiscaleDeformableAttention`` / ``DFineMultiscaleDeformableAttention``:

    * a point reference ``(x, y)``: ``location = ref + offset / (W_l, H_l)``;
    * a box reference ``(cx, cy, w, h)``: ``location = (cx, cy) + offset / n_l * (w, h) *
      offset_scale``.

    Sampling matches ``torch.nn.functional.grid_sample(align_corners=False,
    padding_mode="zeros")``: pixel ``(i, j)`` of a level sits at ``((j + 0.5) / W, (i + 0.5) /
    H)``; the four neighbours of a location are weighted bilinearly, a neighbour outside the
    map counts as zero. It is written as one integer gather from the flattened values (indices
    clipped into range, the weights of outside neighbours zeroed), not ``grid_sample``, so the
    graph has only ops that TensorFlow Lite's builtins and ONNX hold (gather, floor, cast,
    compare, select, matmul); locations and bilinear weights are computed in float32.

    Variants:

    * RT-DETR / Deformable DETR: ``use_projections=True``, ``num_points`` an int,
      ``method="default"``, ``offset_scale=0.5``.
    * D-FINE: ``use_projections=False`` (its decoder layer has no value or output
      projection), ``num_points`` per level (``decoder_n_points``), ``offset_scale``
      (``decoder_offset_scale``) and ``method`` (``decoder_method``): ``"discrete"`` takes
      the nearest pixel, ``floor(location * (W, H) + 0.5)`` clipped into the map, with
      weight 1 instead of interpolating. (transformers' D-FINE reshapes point references
      with the memory length, so it takes box references only; here both work.)

    Weights (named as transformers' so that a checkpoint converts by transposing each
    ``nn.Linear`` weight): ``sampling_offsets`` Dense ``(d, H * P * 2)``, units ordered
    ``(head, point, xy)`` with the points level after level; ``attention_weights`` Dense
    ``(d, H * P)``; ``value_proj`` and ``output_proj`` Dense ``(d, d)`` when
    ``use_projections``. Initialized as transformers does: zero offset and weight kernels,
    the offset bias of ``_offset_bias``, Glorot-uniform (``xavier_uniform_``) projections.

    Args:
        num_heads: attention heads; the value width must be divisible by it.
        num_levels: feature levels ``L``.
        num_points: sampling points per head and level: an int, or one int per level.
        offset_scale: scale of box-relative offsets (0.5 in RT-DETR and D-FINE).
        method: ``"default"`` (bilinear) or ``"discrete"`` (nearest pixel, D-FINE).
        use_projections: project the values (``value_proj``) and the output
            (``output_proj``) to the query width ``d``.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        **kwargs: base layer arguments.

    Call arguments:
        query: ``(B, Q, d)``, position embedding already added.
        value: ``(B, S, d_v)`` the levels' feature maps flattened row-major and concatenated,
            ``S = sum(H_l * W_l)``.
        reference_points: ``(B, Q, 2)`` points or ``(B, Q, 4)`` boxes, normalized to
            ``[0, 1]``; or ``(B, Q, L, c)`` / ``(B, Q, 1, c)``, one per level.
        spatial_shapes: keyword-only, the levels' ``(H_l, W_l)``: Python ints, or scalar int
            tensors where a traced function's image size is not static.
        value_mask: boolean ``(B, S)``, ``True`` = valid; invalid values count as zero.
        return_attention_scores: also return the attention weights.

    Returns:
        ``AttentionOutput(output, attention, None)``: ``output`` ``(B, Q, d)`` (``(B, Q, d_v)``
        without projections); ``attention`` ``(B, H, Q, P)`` (``P`` = all the points of all
        the levels, level after level) when asked, else ``None``.
    """

    def __init__(
        self,
        num_heads: int,
        num_levels: int,
        num_points: int | list[int] = 4,
        offset_scale: float = 0.5,
        method: str = "default",
        use_projections: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.num_levels = checks.positive_int("num_levels", num_levels)
        if isinstance(num_points, (list, tuple)):
            self.num_points = checks.positive_ints("num_points", num_points, length=num_levels)
            self.num_points = list(self.num_points)
            self._points = self.num_points
        else:
            self.num_points = checks.positive_int("num_points", num_points)
            self._points = [self.num_points] * self.num_levels
        self.offset_scale = checks.positive_number("offset_scale", offset_scale)
        if method not in METHODS:
            raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}")
        self.method = method
        self.use_projections = checks.boolean("use_projections", use_projections)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        # The level of each point, level after level: (P,)
        self._levels = np.repeat(np.arange(self.num_levels), self._points).astype("int32")

    def _dense(self, units, name, zero=False):
        clone = lambda init: init.__class__.from_config(init.get_config())  # noqa: E731
        return keras.layers.Dense(
            units,
            kernel_initializer="zeros" if zero else clone(self.kernel_initializer),
            bias_initializer="zeros" if zero else clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, reference_points_shape=None,
              value_mask_shape=None):
        d_model, width = query_shape[-1], value_shape[-1]
        if self.use_projections:
            width = d_model
        if width % self.num_heads:
            raise ValueError(
                "The value width must be divisible by `num_heads`. Received: "
                f"width={width}, num_heads={self.num_heads}"
            )
        heads, points = self.num_heads, sum(self._points)
        self.sampling_offsets = self._dense(heads * points * 2, "sampling_offsets", zero=True)
        self.sampling_offsets.build(query_shape)
        self.sampling_offsets.bias.assign(_offset_bias(heads, self._points))
        self.attention_weights = self._dense(heads * points, "attention_weights", zero=True)
        self.attention_weights.build(query_shape)
        if self.use_projections:
            self.value_proj = self._dense(d_model, "value_proj")
            self.value_proj.build(value_shape)
            self.output_proj = self._dense(d_model, "output_proj")
            self.output_proj.build((*query_shape[:-1], d_model))

    def _point_table(self, value, reference_points, spatial_shapes):
        """Checks the inputs; returns each point's level ``(height, width)`` float32 and its
        level's first row in ``value``, int32, each ``(P,)``: constants when the shapes are
        Python ints, tensors when they are scalar tensors (a traced image size)."""
        shapes = [tuple(s) for s in spatial_shapes]
        static = all(isinstance(n, (int, np.integer)) for s in shapes for n in s)
        if len(shapes) != self.num_levels or any(len(s) != 2 for s in shapes) or (
            static and any(n <= 0 for s in shapes for n in s)
        ):
            raise ValueError(
                f"`spatial_shapes` must be {self.num_levels} pairs (height, width) of positive "
                f"ints or scalar int tensors. Received: spatial_shapes={spatial_shapes}"
            )
        length = sum(h * w for h, w in shapes) if static else None
        if length is not None and value.shape[1] is not None and value.shape[1] != length:
            raise ValueError(
                "`value` must hold sum(height * width) of `spatial_shapes` positions. Received: "
                f"value.shape={tuple(value.shape)}, spatial_shapes={shapes} ({length} positions)"
            )
        rank, coords = len(reference_points.shape), reference_points.shape[-1]
        if rank not in (3, 4) or coords not in (2, 4) or (
            rank == 4 and reference_points.shape[2] not in (1, self.num_levels)
        ):
            raise ValueError(
                "`reference_points` must have shape (B, Q, 2|4) or (B, Q, 1|num_levels, 2|4). "
                f"Received: shape={tuple(reference_points.shape)}"
            )
        if static:
            table = np.array(shapes, "int32")  # (L, 2)
            areas = table[:, 0] * table[:, 1]
            starts = (np.cumsum(areas) - areas)[self._levels]
            return table[self._levels].astype("float32"), starts.astype("int32")
        table = ops.stack([ops.cast(ops.stack(s), "int32") for s in shapes])  # (L, 2)
        areas = table[:, 0] * table[:, 1]
        starts = ops.take(ops.cumsum(areas) - areas, self._levels, axis=0)
        return ops.cast(ops.take(table, self._levels, axis=0), "float32"), starts

    def _locations(self, offsets, reference_points, sizes):
        """``(B, Q, H, P, 2)`` float32 sampling locations, normalized to ``[0, 1]``."""
        ref = ops.cast(reference_points, "float32")
        if len(ref.shape) == 3:
            ref = ops.expand_dims(ref, 2)  # (B, Q, 1, c)
        if ref.shape[2] > 1:
            ref = ops.take(ref, self._levels, axis=2)  # (B, Q, P, c): each point's level
        ref = ops.expand_dims(ref, 2)  # (B, Q, 1, P or 1, c)
        if ref.shape[-1] == 2:
            return ref + offsets / ops.flip(sizes, axis=-1)  # sizes (P, 2): (height, width)
        scale = np.array([[1.0 / self._points[level]] for level in self._levels], "float32")
        return ref[..., :2] + offsets * scale * ref[..., 2:] * self.offset_scale

    def _corners(self, locations, sizes, starts):
        """The gather rows within a batch item and head, ``(B, Q, H, P, K)`` int32 (``K`` = 4
        neighbours, or 1 for ``"discrete"``), and their float32 weights of the same shape."""
        heights, widths = sizes[:, 0], sizes[:, 1]  # (P,)
        x, y = locations[..., 0] * widths, locations[..., 1] * heights  # (B, Q, H, P)
        if self.method == "discrete":
            xs = ops.clip(ops.floor(x + 0.5), 0.0, widths - 1.0)[..., None]  # (B, Q, H, P, 1)
            ys = ops.clip(ops.floor(y + 0.5), 0.0, heights - 1.0)[..., None]
            weights = ops.ones_like(xs)
        else:
            # Pixel coordinates (grid_sample, align_corners=False); far-off locations are
            # clipped to just outside the map first, which keeps their weights zero and the
            # int32 cast in range.
            x = ops.clip(x - 0.5, -2.0, widths + 1.0)
            y = ops.clip(y - 0.5, -2.0, heights + 1.0)
            x0, y0 = ops.floor(x), ops.floor(y)
            fx, fy = x - x0, y - y0
            xs = ops.stack([x0, x0 + 1.0, x0, x0 + 1.0], axis=-1)  # (B, Q, H, P, 4)
            ys = ops.stack([y0, y0, y0 + 1.0, y0 + 1.0], axis=-1)
            weights = ops.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy],
                                axis=-1)
            w, h = widths[:, None], heights[:, None]  # (P, 1)
            inside = (xs >= 0.0) & (xs <= w - 1.0) & (ys >= 0.0) & (ys <= h - 1.0)
            weights = ops.where(inside, weights, ops.zeros_like(weights))
            xs, ys = ops.clip(xs, 0.0, w - 1.0), ops.clip(ys, 0.0, h - 1.0)
        xs, ys = ops.cast(xs, "int32"), ops.cast(ys, "int32")
        rows = starts[:, None] + ys * ops.cast(widths, "int32")[:, None] + xs
        return rows, weights

    def call(
        self,
        query,
        value,
        reference_points,
        *,
        spatial_shapes,
        value_mask=None,
        return_attention_scores: bool = False,
        training=None,
    ):
        sizes, starts = self._point_table(value, reference_points, spatial_shapes)
        heads, points = self.num_heads, sum(self._points)
        batch, queries, length = ops.shape(query)[0], ops.shape(query)[1], ops.shape(value)[1]
        if self.use_projections:
            value = dense_call(self.value_proj, value)
        if value_mask is not None:
            value = ops.where(ops.cast(value_mask, "bool")[..., None], value,
                              ops.zeros_like(value))
        head_dim = value.shape[-1] // heads
        offsets = ops.cast(dense_call(self.sampling_offsets, query), "float32")
        offsets = ops.reshape(offsets, (batch, queries, heads, points, 2))
        logits = ops.cast(dense_call(self.attention_weights, query), "float32")
        attention = ops.softmax(ops.reshape(logits, (batch, queries, heads, points)), axis=-1)

        locations = self._locations(offsets, reference_points, sizes)
        rows, weights = self._corners(locations, sizes, starts)  # (B, Q, H, P, K)
        weights = weights * attention[..., None]
        # value (B, S, H, D) row-major as (B * S * H, D): row (b * S + s) * H + h
        base = ops.arange(batch, dtype="int32")[:, None, None, None, None] * (length * heads)
        rows = base + rows * heads + np.arange(heads, dtype="int32")[:, None, None]
        k = rows.shape[-1]
        rows = ops.reshape(rows, (-1, points * k))  # (B * Q * H, P * K)
        sampled = ops.take(ops.reshape(value, (-1, head_dim)), rows, axis=0)  # (BQH, PK, D)
        weights = ops.reshape(ops.cast(weights, sampled.dtype), (-1, 1, points * k))
        output = ops.reshape(ops.matmul(weights, sampled), (batch, queries, heads * head_dim))
        if self.use_projections:
            output = dense_call(self.output_proj, output)
        scores = None
        if return_attention_scores:
            scores = ops.cast(ops.transpose(attention, (0, 2, 1, 3)), self.compute_dtype)
        return AttentionOutput(output, scores, None)

    def compute_output_shape(self, query_shape, value_shape, reference_points_shape=None,
                             value_mask_shape=None):
        """The shape of the ``output`` field."""
        width = query_shape[-1] if self.use_projections else value_shape[-1]
        return (*query_shape[:-1], width)

    def compute_output_spec(self, *args, **kwargs) -> AttentionOutput:
        arguments = call_arguments(self, args, kwargs)
        query, value = arguments["query"], arguments["value"]
        output = keras.KerasTensor(self.compute_output_shape(query.shape, value.shape),
                                   dtype=self.compute_dtype)
        scores = None
        if arguments["return_attention_scores"]:
            shape = (query.shape[0], self.num_heads, query.shape[1], sum(self._points))
            scores = keras.KerasTensor(shape, dtype=self.compute_dtype)
        return AttentionOutput(output, scores, None)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_levels=self.num_levels,
            num_points=self.num_points,
            offset_scale=self.offset_scale,
            method=self.method,
            use_projections=self.use_projections,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
