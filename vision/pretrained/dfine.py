"""transformers' ``DFineForObjectDetection`` folders (``ustc-community/dfine-*``:
``config.json`` + ``model.safetensors``) as `vision.modeling.dfine.DFine` models.

`vision.pretrained.rtdetr.read_rtdetr` reads them (``model_type`` ``d_fine``) through
`dfine_arrays`, and `vision.pretrained.rtdetr.build_rtdetr` builds them through `build_dfine`;
the arguments come from `vision.pretrained.dfine_config`. Weights are read by their saved names
(``out_proj``, ``fc1``, ``encoder.encoder.N.layers``) or by transformers 5's in-memory ones
(``o_proj``, ``mlp.layers.0``, ``encoder.aifi.N.layers``).
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["RENAMES", "build_dfine", "dfine_arrays"]

# transformers 5's in-memory names -> the saved ones.
RENAMES = ((r"\.o_proj\.", ".out_proj."), (r"layers\.(\d+)\.mlp\.layers\.0\.", r"layers.\1.fc1."),
           (r"layers\.(\d+)\.mlp\.layers\.1\.", r"layers.\1.fc2."),
           (r"model\.encoder\.aifi\.(\d+)\.layers\.", r"model.encoder.encoder.\1.layers."))

_DEPTHWISE = re.compile(r"model\.encoder\.downsample_convs\.\d+\.conv2\.conv\.weight")


def _decoder_arrays(state: dict, settings: dict, used: set) -> dict[str, np.ndarray]:
    """``model.decoder.*`` -> `vision.modeling.dfine_decoder.DFineDecoder`'s Keras paths."""
    def take(name):
        used.add(name)
        return state[name]

    def dense(source, target):
        return {f"decoder/{target}/kernel": take(f"{source}.weight").T,
                f"decoder/{target}/bias": take(f"{source}.bias")}

    def norm(source, target):
        return {f"decoder/{target}/gamma": take(f"{source}.weight"),
                f"decoder/{target}/beta": take(f"{source}.bias")}

    heads, arrays = settings["num_heads"], {}
    for j in range(2):
        arrays.update(dense(f"model.decoder.query_pos_head.layers.{j}",
                            f"query_pos_head/query_pos_head_{j}"))
    for j in range(3):
        arrays.update(dense(f"model.decoder.pre_bbox_head.layers.{j}",
                            f"pre_box_head/pre_box_head_{j}"))
    for i in range(settings["num_layers"]):
        src, dst = f"model.decoder.layers.{i}.", f"layer_{i}/"
        for theirs, ours in (("q", "query"), ("k", "key"), ("v", "value")):
            kernel = take(f"{src}self_attn.{theirs}_proj.weight").T  # (d, H * k)
            arrays[f"decoder/{dst}self_attention/{ours}/kernel"] = kernel.reshape(
                kernel.shape[0], heads, -1)
            arrays[f"decoder/{dst}self_attention/{ours}/bias"] = take(
                f"{src}self_attn.{theirs}_proj.bias").reshape(heads, -1)
        out = take(f"{src}self_attn.out_proj.weight").T
        arrays[f"decoder/{dst}self_attention/attention_output/kernel"] = out.reshape(
            heads, -1, out.shape[-1])
        arrays[f"decoder/{dst}self_attention/attention_output/bias"] = take(
            f"{src}self_attn.out_proj.bias")
        arrays.update(norm(f"{src}self_attn_layer_norm", f"{dst}self_attention_norm"))
        for name in ("sampling_offsets", "attention_weights"):
            arrays.update(dense(f"{src}encoder_attn.{name}", f"{dst}cross_attention/{name}"))
        arrays.update(dense(f"{src}gateway.gate", f"{dst}gate"))
        arrays.update(norm(f"{src}gateway.norm", f"{dst}gate_norm"))
        arrays.update(dense(f"{src}fc1", f"{dst}feedforward/inner"))
        arrays.update(dense(f"{src}fc2", f"{dst}feedforward/outer"))
        arrays.update(norm(f"{src}final_layer_norm", f"{dst}feedforward_norm"))
        arrays.update(dense(f"model.decoder.class_embed.{i}", f"class_head_{i}"))
        for j in range(3):
            arrays.update(dense(f"model.decoder.bbox_embed.{i}.layers.{j}",
                                f"box_head_{i}/box_head_{i}_{j}"))
        for j in range(settings["lqe_layers"]):
            arrays.update(dense(f"model.decoder.lqe_layers.{i}.reg_conf.layers.{j}",
                                f"lqe_{i}/lqe_{i}_{j}"))
    return arrays


def _constants(state: dict, settings: dict, used: set, where: str) -> None:
    """The buffers that must hold what config.json says: ``reg_scale``, ``up`` and each
    deformable attention's ``num_points_scale`` (1 / the points of each point's level)."""
    points = settings["num_points"]
    expected = {"model.decoder.reg_scale": [settings["reg_scale"]],
                "model.decoder.up": [settings["up"]],
                **{f"model.decoder.layers.{i}.encoder_attn.num_points_scale":
                   [1.0 / n for n in points for _ in range(n)]
                   for i in range(settings["num_layers"])}}
    for name, value in expected.items():
        if name not in state:
            raise KeyError(name)
        if not np.allclose(state[name], value):
            raise ValueError(f"{where}: {name} is {np.asarray(state[name]).tolist()[:4]}, not "
                             f"{value[:4]} as config.json's fields give it")
        used.add(name)


def dfine_arrays(state: dict, settings: dict, used: set, where: str) -> dict[str, np.ndarray]:
    """``{Keras path: array}`` of a D-FINE state dict (names already saved-style); the
    names read are added to ``used``."""
    from vision.modeling.hgnetv2 import transformers_arrays as backbone_arrays
    from vision.pretrained.arrays import encoder_arrays, selection_arrays

    state = dict(state)
    for name in [n for n in state if _DEPTHWISE.fullmatch(n)]:
        # (C, 1, k, k) -> DepthwiseConv2D's (k, k, C, 1), passed through conv_norm's
        # (out, in, kh, kw) -> (kh, kw, in, out) transpose as (1, C, k, k).
        state[name] = state[name].transpose(1, 0, 2, 3)
    _constants(state, settings["decoder"], used, where)
    arrays = encoder_arrays(state, settings["encoder"], used, backbone_arrays)
    arrays.update(selection_arrays(state, used))
    arrays.update(_decoder_arrays(state, settings["decoder"], used))
    return arrays


def build_dfine(settings: dict, num_classes: int):
    """The (built, untrained) `DFine` of `vision.pretrained.dfine_config.dfine_settings`."""
    from vision.modeling.dfine import DFine
    from vision.modeling.dfine_decoder import DFineDecoder
    from vision.modeling.dfine_encoder import DFineHybridEncoder
    from vision.modeling.hgnetv2 import HGNetV2Backbone

    backbone = HGNetV2Backbone(**settings["backbone"], name="backbone")
    encoder = DFineHybridEncoder(**settings["encoder"], name="encoder")
    decoder = DFineDecoder(num_classes=num_classes, **settings["decoder"], name="decoder")
    model = DFine(num_classes, backbone, encoder, decoder, **settings["model"], name="dfine")
    model.build((None, None, None, 3))
    return model
