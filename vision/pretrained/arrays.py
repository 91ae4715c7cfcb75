"""transformers' real-time DETR checkpoints (RT-DETR, D-FINE) as this project's Keras weight
paths: the parts their state dicts share (backbone through ``transformers_arrays`` of its
module, hybrid encoder, input projections, AIFI layers, query selection heads).
"""

from __future__ import annotations

import numpy as np

__all__ = ["BN_NAMES", "attention_arrays", "conv_norm", "encoder_arrays", "keras_path",
           "selection_arrays"]

BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
       "running_var": "moving_variance"}


def attention_arrays(state: dict, source: str, target: str, heads: int) -> dict:
    """PyTorch ``(out, in)`` q/k/v/out projections -> Keras einsum kernels ``(d, H, k)`` and
    ``(H, k, d)``, biases ``(H, k)`` and ``(d,)``."""
    arrays = {}
    for theirs, ours in (("q", "query"), ("k", "key"), ("v", "value")):
        weight = state[f"{source}.{theirs}_proj.weight"]
        arrays[f"{target}/{ours}/kernel"] = weight.T.reshape(weight.shape[1], heads, -1)
        arrays[f"{target}/{ours}/bias"] = state[f"{source}.{theirs}_proj.bias"].reshape(heads,
                                                                                       -1)
    out = state[f"{source}.out_proj.weight"]
    arrays[f"{target}/attention_output/kernel"] = out.T.reshape(heads, -1, out.shape[0])
    arrays[f"{target}/attention_output/bias"] = state[f"{source}.out_proj.bias"]
    return arrays


def keras_path(module: str) -> str:
    """``fpn_blocks.0.bottlenecks.2.conv1.conv`` -> ``fpn_blocks_0/bottlenecks_2/conv1/conv``
    (an index joins the name before it)."""
    parts: list[str] = []
    for token in module.split("."):
        if token.isdigit() and parts:
            parts[-1] += f"_{token}"
        else:
            parts.append(token)
    return "/".join(parts)


def conv_norm(module: str, param: str, array: np.ndarray) -> tuple[str, np.ndarray]:
    """A convolution's weight (``(out, in, kh, kw)`` -> ``(kh, kw, in, out)``) or a
    BatchNorm's tensor under ``module``'s Keras path."""
    if array.ndim == 4:
        return f"{module}/kernel", array.transpose(2, 3, 1, 0)
    return f"{module}/{BN_NAMES[param]}", array


def encoder_arrays(state: dict, encoder: dict, used: set, backbone_arrays=None) -> dict:
    """The backbone's (``backbone_arrays``: its module's ``transformers_arrays``, ResNet-vd's
    by default), the hybrid encoder's and the decoder input projections' arrays."""
    if backbone_arrays is None:
        from vision.modeling.rtdetr_backbone import transformers_arrays as backbone_arrays

    arrays = {f"backbone/{path}": array for path, array in
              backbone_arrays(state, "model.backbone.model.")}
    used.update(n for n in state if n.startswith("model.backbone.model."))
    for name, array in state.items():
        if name.startswith(("model.encoder_input_proj.", "model.decoder_input_proj.")):
            # A Sequential: .0 the convolution, .1 the BatchNorm.
            kind, level, part, param = name.split(".")[1:]
            module = (f"encoder/input_proj_{level}" if kind == "encoder_input_proj"
                      else f"decoder_input_proj_{level}") + ("/conv" if part == "0" else "/norm")
        elif name.startswith("model.encoder.") and not name.startswith("model.encoder.encoder."):
            module, param = name[len("model."):].rsplit(".", 1)
            module = keras_path(module)  # ConvNorm layers: .conv, .norm
        else:
            continue
        if param == "num_batches_tracked":
            continue
        used.add(name)
        path, value = conv_norm(module, param, array)
        arrays[path] = value
    for i in range(len(encoder["encode_proj_layers"]) if encoder["num_layers"] else 0):
        for j in range(encoder["num_layers"]):
            source = f"model.encoder.encoder.{i}.layers.{j}."
            target = f"encoder/aifi_{i}/layer_{j}/"
            used.update(n for n in state if n.startswith(source))
            arrays.update(attention_arrays(state, source + "self_attn", target + "self_attention",
                                     encoder["num_heads"]))
            for theirs, ours in (("self_attn_layer_norm", "self_attention_norm"),
                                 ("final_layer_norm", "feedforward_norm")):
                arrays[f"{target}{ours}/gamma"] = state[f"{source}{theirs}.weight"]
                arrays[f"{target}{ours}/beta"] = state[f"{source}{theirs}.bias"]
            for theirs, ours in (("fc1", "inner"), ("fc2", "outer")):
                arrays[f"{target}feedforward/{ours}/kernel"] = \
                    state[f"{source}{theirs}.weight"].T
                arrays[f"{target}feedforward/{ours}/bias"] = state[f"{source}{theirs}.bias"]
    return arrays


def selection_arrays(state: dict, used: set) -> dict:
    """``enc_output`` (Dense + LayerNorm), ``enc_score_head`` and ``enc_bbox_head``."""
    arrays = {"enc_output/kernel": state["model.enc_output.0.weight"].T,
              "enc_output/bias": state["model.enc_output.0.bias"],
              "enc_output_norm/gamma": state["model.enc_output.1.weight"],
              "enc_output_norm/beta": state["model.enc_output.1.bias"],
              "enc_score_head/kernel": state["model.enc_score_head.weight"].T,
              "enc_score_head/bias": state["model.enc_score_head.bias"]}
    for i in range(3):
        arrays[f"enc_bbox_head/enc_bbox_head_{i}/kernel"] = \
            state[f"model.enc_bbox_head.layers.{i}.weight"].T
        arrays[f"enc_bbox_head/enc_bbox_head_{i}/bias"] = \
            state[f"model.enc_bbox_head.layers.{i}.bias"]
    used.update(n for n in state if n.startswith(("model.enc_output.", "model.enc_score_head.",
                                                   "model.enc_bbox_head.")))
    return arrays
