"""transformers' ``RTDetrForObjectDetection`` folders (``PekingU/rtdetr_r50vd`` and kin:
``config.json`` + ``model.safetensors``) as `vision.modeling.rtdetr.RTDetr` models, and
``DFineForObjectDetection`` ones as `vision.modeling.dfine.DFine` (`vision.dfine_convert`).

`read_rtdetr` reads the folder: the model's arguments from ``config.json``
(`vision.rtdetr_config`: which fields are read, fixed or refused), its image preprocessing from
``preprocessor_config.json`` (the image processor's defaults where the folder has none) and
its weights under this project's Keras paths; `load_rtdetr` builds the model and sets them.

Weights are read by their saved names (``out_proj``, ``fc1``, ``encoder.encoder.N.layers``,
what ``save_pretrained`` writes and the Hub holds) or by the names transformers 5 uses in
memory (``o_proj``, ``mlp.fc1``, ``encoder.aifi.N.layers``).
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from tfx_transformer.hf_files import read_json
from vision.rtdetr_config import preprocessing_settings, rtdetr_settings

__all__ = ["RTDetrWeights", "build_rtdetr", "load_rtdetr", "read_rtdetr"]

_BN = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
       "running_var": "moving_variance"}
# transformers 5's in-memory names -> the saved ones.
_RENAMES = ((r"\.o_proj\.", ".out_proj."), (r"\.mlp\.fc([12])\.", r".fc\1."),
            (r"model\.encoder\.aifi\.(\d+)\.layers\.", r"model.encoder.encoder.\1.layers."))


@dataclasses.dataclass(frozen=True)
class RTDetrWeights:
    """A folder read: the `build_rtdetr` arguments (``settings``), ``{Keras path: array}``,
    the class names (label ``i``), their COCO category ids (None unless COCO's), the folder
    and the `vision.data.augment.FixedSize` arguments of its image processor
    (``preprocessing``)."""

    settings: dict
    arrays: dict[str, np.ndarray]
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...] | None
    where: str
    preprocessing: dict


def _attention(state: dict, source: str, target: str, heads: int) -> dict:
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


def _keras_path(module: str) -> str:
    """``fpn_blocks.0.bottlenecks.2.conv1.conv`` -> ``fpn_blocks_0/bottlenecks_2/conv1/conv``
    (an index joins the name before it)."""
    parts: list[str] = []
    for token in module.split("."):
        if token.isdigit() and parts:
            parts[-1] += f"_{token}"
        else:
            parts.append(token)
    return "/".join(parts)


def _conv_norm(module: str, param: str, array: np.ndarray) -> tuple[str, np.ndarray]:
    """A convolution's weight (``(out, in, kh, kw)`` -> ``(kh, kw, in, out)``) or a
    BatchNorm's tensor under ``module``'s Keras path."""
    if array.ndim == 4:
        return f"{module}/kernel", array.transpose(2, 3, 1, 0)
    return f"{module}/{_BN[param]}", array


def _encoder_arrays(state: dict, encoder: dict, used: set, backbone_arrays=None) -> dict:
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
            module = _keras_path(module)  # ConvNorm layers: .conv, .norm
        else:
            continue
        if param == "num_batches_tracked":
            continue
        used.add(name)
        path, value = _conv_norm(module, param, array)
        arrays[path] = value
    for i in range(len(encoder["encode_proj_layers"]) if encoder["num_layers"] else 0):
        for j in range(encoder["num_layers"]):
            source = f"model.encoder.encoder.{i}.layers.{j}."
            target = f"encoder/aifi_{i}/layer_{j}/"
            used.update(n for n in state if n.startswith(source))
            arrays.update(_attention(state, source + "self_attn", target + "self_attention",
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


def _selection_arrays(state: dict, used: set) -> dict:
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


def _classes(config: dict, outputs: int, where: str):
    """``(names, COCO category ids | None)`` of the ``outputs`` classes."""
    from vision.reference import COCO_CATEGORIES

    labels = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    if sorted(labels) != list(range(outputs)):
        raise ValueError(f"{where}: config.json names {len(labels)} classes (id2label), the "
                         f"class heads have {outputs}")
    names = tuple(labels[i] for i in range(outputs))
    coco = tuple(name for _, name in COCO_CATEGORIES)
    return names, (tuple(i for i, _ in COCO_CATEGORIES) if names == coco else None)


def read_rtdetr(folder: str | os.PathLike, flag: str = "checkpoint") -> RTDetrWeights:
    """Reads an ``RTDetrForObjectDetection`` folder (``config.json`` + ``model.safetensors``).

    Raises:
        ValueError: a missing or unreadable file, a config field this conversion does not
            implement, or weights that are missing or not used; the message names ``flag``
            and the file.
    """
    folder = os.fspath(folder)
    where = f"{flag} {folder}"
    for name in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(folder, name)):
            raise ValueError(f"{where}: no {name} (an RTDetrForObjectDetection folder holds "
                             "config.json and model.safetensors)")
    config = read_json(os.path.join(folder, "config.json"))
    settings = rtdetr_settings(config, os.path.join(folder, "config.json"))
    dfine = settings.get("family") == "d_fine"
    processor = os.path.join(folder, "preprocessor_config.json")
    preprocessing = preprocessing_settings(
        read_json(processor) if os.path.isfile(processor) else None, processor)
    from vision.reference import read_state_dict

    state = read_state_dict(os.path.join(folder, "model.safetensors"), flag)
    from vision.dfine_convert import RENAMES, dfine_arrays

    for pattern, replacement in RENAMES if dfine else _RENAMES:
        state = {re.sub(pattern, replacement, name): array for name, array in state.items()}
    from vision.modeling.rtdetr_decoder import transformers_arrays

    used: set[str] = set()
    try:
        if dfine:
            arrays = dfine_arrays(state, settings, used, where)
        else:
            arrays = {**_encoder_arrays(state, settings["encoder"], used),
                      **_selection_arrays(state, used),
                      **transformers_arrays(state, settings["decoder"], used)}
    except KeyError as error:
        raise ValueError(f"{where}: model.safetensors has no {error.args[0]!r}") from None
    if settings["model"]["num_denoising"]:  # the denoising queries' labels (training only)
        arrays["denoising/label_embed"] = state.get("model.denoising_class_embed.weight")
        if arrays["denoising/label_embed"] is None:
            raise ValueError(f"{where}: model.safetensors has no "
                             "'model.denoising_class_embed.weight' (config.json's "
                             "num_denoising is not 0)")
    used.add("model.denoising_class_embed.weight")
    for name in [n for n in state if n.endswith(".encoder_attn.n_points_scale")]:
        # RT-DETR v2's constant: 1 / points of each sampling point (v1's scaling).
        points = settings["decoder"]["num_points"]
        if not np.allclose(state[name], 1.0 / points):
            raise ValueError(f"{where}: {name} is not 1/{points} for every point (the decoder "
                             "samples the same number of points on every level here)")
        used.add(name)
    unused = sorted(set(state) - used)
    if unused:
        raise ValueError(f"{where}: {len(unused)} weights of model.safetensors are not part "
                         f"of RT-DETR (the first: {unused[0]!r})")
    names, ids = _classes(config, arrays["enc_score_head/kernel"].shape[1], where)
    return RTDetrWeights(settings, arrays, names, ids, folder, preprocessing)


def build_rtdetr(settings: dict, num_classes: int):
    """The (built, untrained) `RTDetr` of `rtdetr_settings` for ``num_classes`` classes (a
    `vision.modeling.dfine.DFine` for a D-FINE's settings)."""
    if settings.get("family") == "d_fine":
        from vision.dfine_convert import build_dfine

        return build_dfine(settings, num_classes)
    from vision.modeling.hybrid_encoder import HybridEncoder
    from vision.modeling.rtdetr import RTDetr
    from vision.modeling.rtdetr_backbone import RTDetrResNetBackbone
    from vision.modeling.rtdetr_decoder import build_decoder

    backbone = RTDetrResNetBackbone(**settings["backbone"], name="backbone")
    encoder = HybridEncoder(**settings["encoder"], name="encoder")
    decoder = build_decoder(settings, num_classes)
    model = RTDetr(num_classes, backbone, encoder, decoder, **settings["model"], name="rtdetr")
    model.build((None, None, None, 3))
    return model


def load_rtdetr(folder: str | os.PathLike, flag: str = "checkpoint"):
    """The `RTDetr` of a transformers folder with its weights; ``model.class_names`` and
    ``model.category_ids`` name its classes, ``model.preprocessing`` holds its image
    processor's `vision.data.augment.FixedSize` arguments (`read_rtdetr`).

    Raises:
        ValueError: see `read_rtdetr`; also a weight of another shape.
    """
    weights = read_rtdetr(folder, flag)
    model = build_rtdetr(weights.settings, len(weights.class_names))
    for variable in model.weights:
        key = variable.path.split("/", 1)[1]
        if key not in weights.arrays:
            raise ValueError(f"{flag} {weights.where}: it has no weight for {key!r}")
        array = weights.arrays[key]
        if array.shape != tuple(variable.shape):
            raise ValueError(f"{flag} {weights.where}: {key!r} is {array.shape} there, "
                             f"{tuple(variable.shape)} here")
        variable.assign(array.astype(variable.dtype))
    model.class_names, model.category_ids = weights.class_names, weights.category_ids
    model.preprocessing = weights.preprocessing
    return model
