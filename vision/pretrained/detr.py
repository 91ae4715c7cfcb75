"""The published DETR checkpoints, read into this project's Keras weight paths.

Two layouts are read:

- facebookresearch/detr's ``.pth`` files (``{"model": state_dict}``: ``backbone.0.body.*``,
  ``transformer.encoder.layers.N.self_attn.in_proj_weight``, ``class_embed``, ``bbox_embed``,
  ``query_embed``, ``input_proj``), read with ``torch.load(..., weights_only=True)``: torch is
  needed for these only;
- Hugging Face transformers' ``DetrForObjectDetection`` ``model.safetensors`` (``facebook/
  detr-resnet-50`` and ``-101``: ``model.backbone.conv_encoder.model.*``, ``q_proj``/``k_proj``/
  ``v_proj``/``out_proj``, ``class_labels_classifier``, ``bbox_predictor``,
  ``query_position_embeddings``, ``input_projection``), read with the ``safetensors`` package;
  a ``config.json`` beside it gives the heads and class names.

`read_reference` returns the arrays under the Keras paths of a vanilla `vision.modeling.detr.DETR`
(``encoder/layer_0/self_attention/query/kernel``, ...) with the configuration the checkpoint
implies. COCO checkpoints have 92 class outputs, one per category id 0-90 and "no object"; the
11 ids COCO leaves unused ("N/A") are dropped, so that label ``i`` is COCO category
``category_ids[i]`` with its name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping

import numpy as np

__all__ = ["COCO_CATEGORIES", "ReferenceWeights", "read_reference", "read_state_dict"]

#: COCO 2017's 80 detection categories: ``(id, name)`` as in its annotation files.
COCO_CATEGORIES = (
    (1, "person"), (2, "bicycle"), (3, "car"), (4, "motorcycle"), (5, "airplane"), (6, "bus"),
    (7, "train"), (8, "truck"), (9, "boat"), (10, "traffic light"), (11, "fire hydrant"),
    (13, "stop sign"), (14, "parking meter"), (15, "bench"), (16, "bird"), (17, "cat"),
    (18, "dog"), (19, "horse"), (20, "sheep"), (21, "cow"), (22, "elephant"), (23, "bear"),
    (24, "zebra"), (25, "giraffe"), (27, "backpack"), (28, "umbrella"), (31, "handbag"),
    (32, "tie"), (33, "suitcase"), (34, "frisbee"), (35, "skis"), (36, "snowboard"),
    (37, "sports ball"), (38, "kite"), (39, "baseball bat"), (40, "baseball glove"),
    (41, "skateboard"), (42, "surfboard"), (43, "tennis racket"), (44, "bottle"),
    (46, "wine glass"), (47, "cup"), (48, "fork"), (49, "knife"), (50, "spoon"), (51, "bowl"),
    (52, "banana"), (53, "apple"), (54, "sandwich"), (55, "orange"), (56, "broccoli"),
    (57, "carrot"), (58, "hot dog"), (59, "pizza"), (60, "donut"), (61, "cake"), (62, "chair"),
    (63, "couch"), (64, "potted plant"), (65, "bed"), (67, "dining table"), (70, "toilet"),
    (72, "tv"), (73, "laptop"), (74, "mouse"), (75, "remote"), (76, "keyboard"),
    (77, "cell phone"), (78, "microwave"), (79, "oven"), (80, "toaster"), (81, "sink"),
    (82, "refrigerator"), (84, "book"), (85, "clock"), (86, "vase"), (87, "scissors"),
    (88, "teddy bear"), (89, "hair drier"), (90, "toothbrush"),
)

_TORCH_FORMATS = (".pth", ".pt", ".bin")
_LAYOUTS = {  # checkpoint layout -> its names of each part
    "detr": dict(backbone="backbone.0.body.", input_proj="input_proj", query="query_embed.weight",
                 encoder="transformer.encoder.layers.", decoder="transformer.decoder.layers.",
                 decoder_norm="transformer.decoder.norm", class_head="class_embed",
                 box_head="bbox_embed.layers."),
    "transformers": dict(backbone="model.backbone.conv_encoder.model.",
                         input_proj="model.input_projection",
                         query="model.query_position_embeddings.weight",
                         encoder="model.encoder.layers.", decoder="model.decoder.layers.",
                         decoder_norm="model.decoder.layernorm",
                         class_head="class_labels_classifier", box_head="bbox_predictor.layers."),
}
# Per layout: our sub-layer -> the checkpoint's (attention, its norm), then the feed-forward.
_ENCODER_PARTS = {
    "detr": [("self_attention", "self_attn", "norm1")],
    "transformers": [("self_attention", "self_attn", "self_attn_layer_norm")],
}
_DECODER_PARTS = {
    "detr": [("self_attention", "self_attn", "norm1"),
             ("cross_attention", "multihead_attn", "norm2")],
    "transformers": [("self_attention", "self_attn", "self_attn_layer_norm"),
                     ("cross_attention", "encoder_attn", "encoder_attn_layer_norm")],
}
_FEEDFORWARD = {"detr": ("linear1", "linear2"), "transformers": ("fc1", "fc2")}
_FEEDFORWARD_NORM = {"detr": {"encoder": "norm2", "decoder": "norm3"},
                     "transformers": {"encoder": "final_layer_norm",
                                      "decoder": "final_layer_norm"}}


@dataclasses.dataclass(frozen=True)
class ReferenceWeights:
    """A reference checkpoint read into Keras paths.

    Attributes:
        arrays: ``{Keras weight path: array}`` of a vanilla DETR (class heads with the kept
            classes only).
        config: the `vision.config.DetrConfig` fields the checkpoint implies (``backbone``,
            sizes, ``num_queries``) to apply to the ``r50-detr`` preset.
        class_names, category_ids: the kept classes (label ``i``), and their COCO ids (None
            when the checkpoint's classes are not COCO's).
        layout: ``"detr"`` or ``"transformers"``.
        where: the file.
    """

    arrays: dict[str, np.ndarray]
    config: dict
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...] | None
    layout: str
    where: str


def read_state_dict(path: str | os.PathLike, flag: str = "checkpoint") -> dict[str, np.ndarray]:
    """``{name: float32 array}`` of a PyTorch ``.pth`` (torch needed) or ``.safetensors`` file.

    A ``.pth`` holding ``{"model": state_dict}`` (facebookresearch/detr's) gives that dict.

    Raises:
        ValueError: no such file, another format, torch missing for a ``.pth``, or a file that
            cannot be read; the message names ``flag`` and the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path}: no such file")
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            state = load_file(path)
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{flag} {path}: not a readable safetensors file ({error})") from None
    elif path.endswith(_TORCH_FORMATS):
        state = _torch_state(path, flag)
    else:
        raise ValueError(f"{flag} {path}: not a .pth or .safetensors file")
    return {name: np.asarray(array, dtype="float32") for name, array in state.items()
            if not name.endswith("num_batches_tracked")}


def _torch_state(path: str, flag: str) -> dict:
    try:
        import torch
    except ImportError:
        raise ValueError(
            f"{flag} {path}: reading a PyTorch checkpoint needs torch, which is not installed "
            "(pip install torch, or the [reference] extra); a .safetensors file needs no torch"
        ) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle errors, a truncated file, a foreign object: one line
        raise ValueError(f"{flag} {path}: cannot be read with torch.load ("
                         f"{type(error).__name__}: {str(error)[:200]})") from None
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):
        state = state["model"]
    if not isinstance(state, Mapping):
        raise ValueError(f"{flag} {path}: holds a {type(state).__name__}, not a state dict")
    return {name: value.detach().float().numpy() for name, value in state.items()
            if hasattr(value, "detach")}


def _layout(state: Mapping[str, np.ndarray], where: str) -> str:
    for name, parts in _LAYOUTS.items():
        if parts["query"] in state and parts["class_head"] + ".weight" in state:
            return name
    raise ValueError(f"{where}: not a DETR checkpoint of facebookresearch/detr (query_embed, "
                     "class_embed) nor of transformers' DetrForObjectDetection")


def _count(state: Mapping, prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for name in state if (m := pattern.match(name))}
    return max(found) + 1 if found else 0


def read_reference(path: str | os.PathLike, flag: str = "checkpoint") -> ReferenceWeights:
    """Reads a facebookresearch/detr ``.pth`` or a transformers ``model.safetensors``.

    Raises:
        ValueError: see `read_state_dict`; also a file of neither layout, or a weight with an
            unexpected shape (the message names it).
    """
    where = f"{flag} {os.fspath(path)}"
    state = read_state_dict(path, flag)
    layout = _layout(state, where)
    names = _LAYOUTS[layout]
    used: set[str] = set()

    def take(name: str) -> np.ndarray:
        if name not in state:
            raise ValueError(f"{where}: it has no {name!r}")
        used.add(name)
        return state[name]

    hidden = take(names["input_proj"] + ".weight").shape[0]
    extra = _hf_config(path) if layout == "transformers" else {}
    heads = int(extra.get("encoder_attention_heads", 8))
    config = {
        "backbone": _backbone_name(state, names["backbone"], where),
        "hidden_dim": int(hidden), "num_heads": heads,
        "num_encoder_layers": _count(state, names["encoder"]),
        "num_decoder_layers": _count(state, names["decoder"]),
        "ffn_dim": int(state[f"{names['encoder']}0.{_FEEDFORWARD[layout][0]}.weight"].shape[0]),
        "num_queries": int(state[names["query"]].shape[0]),
    }
    arrays = _backbone_arrays(state, names["backbone"], used)
    arrays["input_proj/kernel"] = take(names["input_proj"] + ".weight").transpose(2, 3, 1, 0)
    arrays["input_proj/bias"] = take(names["input_proj"] + ".bias")
    arrays["queries/query_embed"] = take(names["query"])
    for stack, count, parts in (("encoder", config["num_encoder_layers"], _ENCODER_PARTS),
                                ("decoder", config["num_decoder_layers"], _DECODER_PARTS)):
        for i in range(count):
            source, target = f"{names[stack]}{i}.", f"{stack}/layer_{i}/"
            for ours, theirs, norm in parts[layout]:
                arrays.update(_attention(take, source + theirs, target + ours, layout, heads))
                arrays.update(_norm(take, source + norm, target + ours + "_norm"))
            inner, outer = _FEEDFORWARD[layout]
            arrays.update(_dense(take, source + inner, target + "feedforward/inner"))
            arrays.update(_dense(take, source + outer, target + "feedforward/outer"))
            arrays.update(_norm(take, source + _FEEDFORWARD_NORM[layout][stack],
                                target + "feedforward_norm"))
    arrays.update(_norm(take, names["decoder_norm"], "decoder/final_norm"))
    for i in range(3):
        arrays.update(_dense(take, f"{names['box_head']}{i}", f"box_head/box_head_{i}"))
    class_names, category_ids, columns = _classes(
        take(names["class_head"] + ".weight").shape[0], extra.get("id2label"), where)
    head = _dense(take, names["class_head"], "class_head")
    arrays["class_head/kernel"] = head["class_head/kernel"][:, columns]
    arrays["class_head/bias"] = head["class_head/bias"][columns]
    unused = sorted(set(state) - used)
    if unused:
        raise ValueError(f"{where}: {len(unused)} weights are not part of a detector DETR "
                         f"reads (the first: {unused[0]!r}; a segmentation checkpoint?)")
    return ReferenceWeights(arrays, config, class_names, category_ids, layout,
                            os.fspath(path))


def _hf_config(path) -> dict:
    """The ``config.json`` beside a transformers checkpoint, or {} without one."""
    config = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if not os.path.isfile(config):
        return {}
    with open(config, encoding="utf-8") as f:
        info = json.load(f)
    return info if isinstance(info, dict) else {}


def _backbone_name(state: Mapping, prefix: str, where: str) -> str:
    from vision.modeling.resnet import DEPTHS

    blocks = tuple(_count(state, f"{prefix}layer{stage}.") for stage in (1, 2, 3, 4))
    for depth, counts in DEPTHS.items():
        if blocks == counts:
            return f"resnet{depth}"
    raise ValueError(f"{where}: its backbone has {blocks} blocks per stage, neither ResNet-50 "
                     f"{DEPTHS[50]} nor ResNet-101 {DEPTHS[101]}")


def _backbone_arrays(state: Mapping, prefix: str, used: set) -> dict[str, np.ndarray]:
    """The backbone's arrays under their Keras paths (``backbone/layer1_0_conv1/kernel``)."""
    from vision.modeling.resnet import torchvision_arrays

    names = [name for name in state if name.startswith(prefix)]
    used.update(names)
    inner = {name[len(prefix):]: state[name] for name in names}
    return {f"backbone/{path}": array for path, array in torchvision_arrays(inner)}


def _dense(take, source: str, target: str) -> dict[str, np.ndarray]:
    return {f"{target}/kernel": take(source + ".weight").T,
            f"{target}/bias": take(source + ".bias")}


def _norm(take, source: str, target: str) -> dict[str, np.ndarray]:
    return {f"{target}/gamma": take(source + ".weight"), f"{target}/beta": take(source + ".bias")}


def _attention(take, source: str, target: str, layout: str, heads: int) -> dict:
    """One attention's projections: PyTorch ``(out, in)`` matrices -> Keras einsum kernels
    ``(d, H, k)`` (query, key, value) and ``(H, k, d)`` (output)."""
    if layout == "detr":  # packed q, k, v
        weights = np.split(take(source + ".in_proj_weight"), 3)
        biases = np.split(take(source + ".in_proj_bias"), 3)
    else:
        weights = [take(f"{source}.{p}_proj.weight") for p in "qkv"]
        biases = [take(f"{source}.{p}_proj.bias") for p in "qkv"]
    d = weights[0].shape[1]
    arrays = {}
    for name, weight, bias in zip(("query", "key", "value"), weights, biases):
        arrays[f"{target}/{name}/kernel"] = weight.T.reshape(d, heads, -1)
        arrays[f"{target}/{name}/bias"] = bias.reshape(heads, -1)
    out = take(source + ".out_proj.weight")  # (d, H * k)
    arrays[f"{target}/attention_output/kernel"] = out.T.reshape(heads, -1, out.shape[0])
    arrays[f"{target}/attention_output/bias"] = take(source + ".out_proj.bias")
    return arrays


def _classes(outputs: int, id2label, where: str):
    """``(names, category ids | None, kept class-head columns)`` of a head with ``outputs``
    columns (the last one "no object")."""
    if id2label:  # a transformers config.json
        labels = {int(k): str(v) for k, v in id2label.items()}
        if sorted(labels) != list(range(outputs - 1)):
            raise ValueError(f"{where}: config.json names {len(labels)} classes, the class "
                             f"head has {outputs - 1} (and no object)")
        kept = [i for i in range(outputs - 1) if labels[i] != "N/A"]
        names = tuple(labels[i] for i in kept)
        coco = dict(COCO_CATEGORIES)
        ids = tuple(kept) if all(coco.get(i) == labels[i] for i in kept) else None
        return names, ids, kept + [outputs - 1]
    if outputs != 92:
        raise ValueError(f"{where}: its class head has {outputs} outputs, not COCO's 92, and "
                         "no config.json beside it names the classes")
    ids = tuple(i for i, _ in COCO_CATEGORIES)
    return tuple(name for _, name in COCO_CATEGORIES), ids, list(ids) + [outputs - 1]
