"""Dense projections of ``(..., d_in)`` tensors as one 2-D matrix product."""

from __future__ import annotations

from keras import ops

__all__ = ["dense_call", "matmul_last_axis"]


def matmul_last_axis(x, kernel, bias=None, trailing: tuple | None = None):
    """``x (..., d_in) @ kernel (d_in, d_out) + bias`` as one 2-D product, its last axis
    reshaped to ``trailing`` (default ``(d_out,)``).

    `keras.ops.matmul` of a tensor of rank above 2 with a matrix runs, under TensorFlow,
    through its ``tensordot``, whose shape arithmetic for an unknown batch and length
    (gathers, products, concatenations, a transpose) is traced, optimized and run with every
    product: in a tiny Transformer's traced beam search, 430 of 3,400 graph nodes. Flattened
    to 2-D it is two reshapes and one matrix product, with the same result.
    """
    lead = ops.shape(x)[:-1]
    y = ops.matmul(ops.reshape(x, (-1, kernel.shape[0])), kernel)
    if bias is not None:
        y = y + bias
    return ops.reshape(y, (*lead, *(trailing or (kernel.shape[-1],))))


def dense_call(dense, x):
    """``dense(x)`` of a built ``keras.layers.Dense``, its product by `matmul_last_axis`.

    Call it inside the calling layer's own ``call`` (the kernel is read in that layer's
    compute dtype). A LoRA-enabled or quantized layer keeps its own call.
    """
    if dense.lora_enabled or dense.quantization_mode is not None:
        return dense(x)
    y = matmul_last_axis(x, dense.kernel, dense.bias)
    return y if dense.activation is None else dense.activation(y)
