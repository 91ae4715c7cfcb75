"""transformers' ``RTDetrForObjectDetection`` folders (``PekingU/rtdetr_r50vd`` and kin:
``config.json`` + ``model.safetensors``) as `vision.modeling.rtdetr.RTDetr` models, and
``DFineForObjectDetection`` ones as `vision.modeling.dfine.DFine` (`vision.pretrained.dfine`).

`read_rtdetr` reads the folder: the model's arguments from ``config.json``
(`vision.pretrained.rtdetr_config`: which fields are read, fixed or refused), its image
preprocessing from ``preprocessor_config.json`` (the image processor's defaults where the folder has
none) and its weights under this project's Keras paths; `load_rtdetr` builds the model and sets
them.

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
from vision.pretrained.arrays import encoder_arrays, selection_arrays
from vision.pretrained.rtdetr_config import preprocessing_settings, rtdetr_settings

__all__ = ["RTDetrWeights", "build_rtdetr", "load_rtdetr", "read_rtdetr"]

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


def _classes(config: dict, outputs: int, where: str):
    """``(names, COCO category ids | None)`` of the ``outputs`` classes."""
    from vision.pretrained.detr import COCO_CATEGORIES

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
    from vision.pretrained.detr import read_state_dict

    state = read_state_dict(os.path.join(folder, "model.safetensors"), flag)
    from vision.pretrained.dfine import RENAMES, dfine_arrays

    for pattern, replacement in RENAMES if dfine else _RENAMES:
        state = {re.sub(pattern, replacement, name): array for name, array in state.items()}
    from vision.modeling.rtdetr_decoder import transformers_arrays

    used: set[str] = set()
    try:
        if dfine:
            arrays = dfine_arrays(state, settings, used, where)
        else:
            arrays = {**encoder_arrays(state, settings["encoder"], used),
                      **selection_arrays(state, used),
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
        from vision.pretrained.dfine import build_dfine

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
