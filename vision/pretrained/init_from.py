"""Starting a detector from trained weights: `init_from(model, source, class_names)`.

``source`` (``train_detr.py --init-from``) is one of

- a finished ``train_detr.py`` work directory (its ``export/``),
- an export directory (the ``Detector`` SavedModel with ``classes.json``),
- a ``model.keras`` file (Keras's own format, e.g. ``model.save("model.keras")``), or a
  directory holding one; its class names are read from a ``classes.json`` beside it, or from
  ``export/classes.json`` in that directory;
- a transformers ``RTDetrForObjectDetection``, ``RTDetrV2ForObjectDetection`` or
  ``DFineForObjectDetection`` folder (``config.json`` of ``model_type`` ``rt_detr``,
  ``rt_detr_v2`` or ``d_fine`` + ``model.safetensors``, `vision.pretrained.rtdetr.read_rtdetr`),
  for a model of the same architecture (`rtdetr_folder_config` gives it).

Weights are matched by their Keras path (``backbone/conv_0/kernel``, ...). Every weight of the
model must be found with its shape, with three exceptions:

- the class heads (``class_head``, ``proposal_class_head``: ``C + 1`` outputs, the last one
  "no object"; RT-DETR's ``class_head_i`` and ``enc_score_head``: ``C`` outputs) are loaded
  when the source has the same classes, in any order (the columns are reordered by name), and
  re-initialized when the class list differs ("class head: 92 -> 4 outputs, re-initialized");
- per-query weights (``query_embed``, ``reference_logits``, ``query_content``) may
  shrink: the first ``Q`` are kept;
- the denoising queries' label tables (``label_embed``: a row per class, RT-DETR's a padding
  row last) follow the class heads: rows reordered by name for the same classes, otherwise
  (or when the source has none) left at their initialization and listed as re-initialized.

Anything else that differs (another hidden size, backbone, number of layers) is refused with
the first weight that does not fit.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["SourceWeights", "check_init_source", "init_from", "load_reference_checkpoint",
           "read_weights", "rtdetr_folder_config"]

_MODEL_FILE = "model.keras"
_CLASSES_FILE = "classes.json"
_PER_QUERY = ("query_embed", "reference_logits", "query_content")
_REFERENCE_FORMATS = (".pth", ".pt", ".safetensors", ".bin")  # `vision.pretrained.detr`


@dataclasses.dataclass(frozen=True)
class SourceWeights:
    """The weights of a source: ``{relative Keras path: array}``, its class names (None when
    unknown) and the file or directory they were read from."""

    arrays: dict[str, np.ndarray]
    class_names: tuple[str, ...] | None
    where: str


def _relative(path: str) -> str:
    """``detr/backbone/conv_0/kernel`` (an export's, a built model's) and
    ``backbone/conv_0/kernel`` (a loaded ``model.keras``'s) alike: without the model's name."""
    path = path.removesuffix(":0")
    return path.split("/", 1)[1] if path.startswith(("detr/", "rtdetr/", "dfine/")) else path


def rtdetr_folder_config(source: str | os.PathLike) -> dict | None:
    """The ``config.json`` of ``source`` when it is a transformers RT-DETR or D-FINE folder, else
    None."""
    path = os.fspath(source)
    config = os.path.join(path, "config.json")
    if not (os.path.isdir(path) and os.path.isfile(config)):
        return None
    from tfx_transformer.hf_files import read_json

    fields = read_json(config)
    from vision.pretrained.rtdetr_config import RTDETR_TYPES

    return fields if fields.get("model_type") in RTDETR_TYPES else None


def _resolve(source: str | os.PathLike) -> tuple[str, str]:
    """``(kind, path)``: ``("export", DIR)`` or ``("keras", FILE)``; ValueError otherwise."""
    path = os.fspath(source)
    if rtdetr_folder_config(path) is not None:
        return "rtdetr", path
    if os.path.isdir(path):
        for kind, candidate in (("keras", os.path.join(path, _MODEL_FILE)),
                                ("export", path),
                                ("export", os.path.join(path, "export"))):
            marker = candidate if kind == "keras" else os.path.join(candidate, "saved_model.pb")
            if os.path.isfile(marker):
                return kind, candidate
        raise ValueError(
            f"--init-from {path}: the directory has no {_MODEL_FILE}, no saved_model.pb and no "
            "export/ (a finished train_detr.py run has DIR/export/)")
    if not os.path.exists(path):
        raise ValueError(f"--init-from {path}: no such file or directory")
    if path.endswith(_REFERENCE_FORMATS):
        return "reference", path
    if path.endswith(".keras"):
        return "keras", path
    raise ValueError(f"--init-from {path}: not a work directory, an export, a .keras file or a "
                     "DETR checkpoint (.pth, .safetensors)")


def check_init_source(source: str | os.PathLike) -> None:
    """Raises the ValueError `read_weights` would for a source of the wrong kind, without
    reading it (cheap: the command checks its flag before loading any data)."""
    _resolve(source)


def _class_names(path: str) -> tuple[str, ...] | None:
    if not os.path.isfile(path):
        return None
    from vision.export.load import _read_classes

    return _read_classes(path)[0]


def read_weights(source: str | os.PathLike) -> SourceWeights:
    """The weights and class names of ``source`` (see the module docstring).

    Raises:
        ValueError: ``source`` is missing or of another kind; the message names it.
    """
    kind, path = _resolve(source)
    if kind == "rtdetr":
        from vision.pretrained.rtdetr import read_rtdetr

        weights = read_rtdetr(path, "--init-from")
        return SourceWeights(weights.arrays, weights.class_names, path)
    if kind == "reference":
        from vision.pretrained.detr import read_reference

        reference = read_reference(path, "--init-from")
        return SourceWeights(reference.arrays, reference.class_names, path)
    if kind == "export":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)
        arrays = {_relative(v.name): v.numpy() for v in loaded.variables}
        return SourceWeights(arrays, _class_names(os.path.join(path, _CLASSES_FILE)), path)
    import keras

    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # a broken or foreign file: one line naming it
        raise ValueError(f"--init-from {path}: cannot be loaded as a Keras model "
                         f"({type(error).__name__}: {str(error)[:200]})") from None
    arrays = {_relative(v.path): keras.ops.convert_to_numpy(v) for v in model.weights}
    folder = os.path.dirname(path)
    names = _class_names(os.path.join(folder, _CLASSES_FILE))
    if names is None:
        names = _class_names(os.path.join(folder, "export", _CLASSES_FILE))
    return SourceWeights(arrays, names, path)


def _is_class_head(key: str) -> bool:
    parts = key.split("/")
    return len(parts) >= 2 and re.search(r"(class_head(_\d+)?|enc_score_head)$",
                                         parts[-2]) is not None


def init_from(model, source: str | os.PathLike | SourceWeights,
              class_names: Sequence[str], log: Callable[..., None] = print) -> dict:
    """Sets ``model``'s weights (a built `vision.modeling.detr.DETR`) from ``source``.

    Args:
        model: the detector to start; its class heads have ``len(class_names) + 1`` outputs.
        source: a path (see the module docstring) or the `SourceWeights` read from one.
        class_names: the classes ``model`` is trained on, in label order.
        log: where the lines about the class head and the count of weights loaded go.

    Returns:
        ``{"loaded": N, "reinitialized": [keys], "class_order": list | None}``.

    Raises:
        ValueError: a weight of ``model`` is missing from ``source`` or has another shape
            (other than the class heads and per-query weights); the message names it.
    """
    weights = source if isinstance(source, SourceWeights) else read_weights(source)
    where, arrays = weights.where, weights.arrays
    own = {_relative(v.path): v for v in model.weights}
    # The denoising queries' label tables: a row per class (RT-DETR's a padding row more).
    tables = [key for key in own if key.split("/")[-1] == "label_embed"]
    missing = [key for key in own if key not in arrays and key not in tables]
    if missing:
        raise ValueError(
            f"--init-from {where}: it has no {missing[0]!r}"
            + (f" (nor {len(missing) - 1} other weights of this model)" if len(missing) > 1
               else "")
            + "; it was trained with another preset, backbone or number of layers")
    values, heads = {}, [key for key in own if _is_class_head(key)]
    for key, variable in own.items():
        if key in heads or key in tables:
            continue
        array, shape = arrays[key], tuple(variable.shape)
        if key.split("/")[-1] in _PER_QUERY and array.shape[1:] == shape[1:]:
            if array.shape[0] < shape[0]:
                raise ValueError(f"--init-from {where}: it has {array.shape[0]} queries, "
                                 f"fewer than the {shape[0]} asked for (--num-queries)")
            array = array[:shape[0]]  # the first Q queries
        if array.shape != shape:
            raise ValueError(f"--init-from {where}: {key!r} is {tuple(array.shape)} there and "
                             f"{shape} here; another hidden size or backbone cannot be loaded")
        values[key] = array
    order = _class_columns(weights.class_names, list(class_names))
    outputs = {key: arrays[key].shape[-1] for key in heads}
    fits = all(arrays[key].shape[:-1] == tuple(own[key].shape)[:-1] for key in heads)
    if not fits:
        bad = next(key for key in heads if arrays[key].shape[:-1] != tuple(own[key].shape)[:-1])
        raise ValueError(f"--init-from {where}: {bad!r} is {tuple(arrays[bad].shape)} there and "
                         f"{tuple(own[bad].shape)} here; another hidden size cannot be loaded")
    reinitialized = []
    for key in tables:
        table, rows = arrays.get(key), own[key].shape[0]
        if table is not None and table.shape[1:] == tuple(own[key].shape)[1:]:
            if order is not None and len(table) == rows:
                values[key] = table[order[:rows]]  # RT-DETR's padding row is order's last
                continue
            if weights.class_names is None and len(table) == rows:
                values[key] = table
                continue
        reinitialized.append(key)
    if heads:
        same_count = all(outputs[key] == own[key].shape[-1] for key in heads)
        if order is not None:
            for key in heads:  # RT-DETR's heads have no "no object" column
                values[key] = arrays[key][..., order[:arrays[key].shape[-1]]]
            if order != list(range(len(order))):
                log(f"class head: the same {len(class_names)} classes in another order, "
                    "reordered by name")
        elif weights.class_names is None and same_count:
            for key in heads:
                values[key] = arrays[key]
            log(f"class head: {where} names no classes; its {outputs[heads[0]]} outputs are "
                "loaded as they are")
        else:
            reinitialized += heads
            log(f"class head: {outputs[heads[0]]} → {own[heads[0]].shape[-1]} outputs, "
                "re-initialized")
    for key, array in values.items():
        own[key].assign(array.astype(own[key].dtype))
    log(f"init from {where}: {len(values)} of {len(own)} weights loaded")
    return {"loaded": len(values), "reinitialized": reinitialized, "class_order": order}


def _class_columns(source_names: Sequence[str] | None, names: list[str]) -> list[int] | None:
    """The source's class-head column of each of ``names`` and "no object" (last), when the
    source has the same classes (in any order); None otherwise."""
    if source_names is None or sorted(source_names) != sorted(names) or \
            len(set(names)) != len(names):
        return None
    source_names = list(source_names)
    return [source_names.index(name) for name in names] + [len(names)]



def load_reference_checkpoint(path: str | os.PathLike, flag: str = "checkpoint", **overrides):
    """A facebookresearch/detr ``.pth`` or transformers ``model.safetensors`` as a `DETR`.

    The model is the ``r50-detr`` preset with the checkpoint's backbone (ResNet-50 or -101),
    sizes and number of queries; its class head keeps the checkpoint's real classes (COCO's
    80, without the unused ids), named by ``model.class_names`` and, for COCO, numbered by
    ``model.category_ids`` (see `vision.pretrained.detr`). ``overrides``: other `DetrConfig` fields
    (e.g. ``dropout=0.0``); the model's config is ``model.detr_config``.

    Raises:
        ValueError: the file cannot be read, is of neither layout, or torch is missing for a
            ``.pth``; the message names ``flag`` and the file.
    """
    from vision.config import preset
    from vision.modeling.detr import build_model
    from vision.pretrained.detr import read_reference

    reference = read_reference(path, flag)
    config = preset("r50-detr", **{**reference.config, **overrides})
    model = build_model(config, len(reference.class_names))
    own = {_relative(v.path): v for v in model.weights}
    missing = sorted(set(own) - set(reference.arrays))
    if missing:
        raise ValueError(f"{flag} {path}: it has no weight for {missing[0]!r}")
    for key, variable in own.items():
        array = reference.arrays[key]
        if array.shape != tuple(variable.shape):
            raise ValueError(f"{flag} {path}: {key!r} is {array.shape} there, "
                             f"{tuple(variable.shape)} here")
        variable.assign(array.astype(variable.dtype))
    model.class_names = reference.class_names
    model.category_ids = reference.category_ids
    model.detr_config = config
    return model
