"""Converting DETR files saved before the query strategies became layers.

Keras stores weights by attribute path. Before `vision.modeling.queries` existed, DETR held its
query
weights itself (``vars/0``: ``query_embed`` or ``reference_logits``), its box head as a list
(``box_head/dense``, ``box_head/dense_1``, ...), and its other heads in lists that Keras saved
under the model's ``layers`` (``layers/dense_4`` ...). Now the box head is a
`vision.modeling.heads.MLP` (``box_head/layers/dense``) and the query weights belong to the query
layer (``layers/learned_queries/vars/0``, ``layers/two_stage_queries/...``). The optimizer's
slots follow the order of the trainable variables, in which the query weights moved from
the first place to the end (behind the box head).

`convert_legacy_weights` rewrites a ``.keras`` archive or a ``.weights.h5`` checkpoint (what
`ModelCheckpoint` and `BackupAndRestore` write) into the current layout; nothing else
changes (the configuration is the same). ``scripts/convert_detr.py OLD NEW`` runs it.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile

import h5py

__all__ = ["convert_legacy_weights", "legacy_query_type"]

_BOX_HEAD = {f"box_head/{old}": f"box_head/layers/{old}" for old in ("dense", "dense_1", "dense_2")}
_TWO_STAGE = "layers/two_stage_queries"
# query_type -> {old group: new group}. Old `layers/dense_N` are numbered after the class
# head (dense) and the box head (dense_1..3) among the model's Dense layers.
_MOVES = {
    "learned": {"vars": "layers/learned_queries/vars"},
    "reference": {
        "vars": "layers/reference_queries/vars",
        "layers/dense_4": "layers/reference_queries/reference_mlp/layers/dense",
        "layers/dense_5": "layers/reference_queries/reference_mlp/layers/dense_1",
    },
    "encoder": {
        "layers/dense_4": f"{_TWO_STAGE}/reference_mlp/layers/dense",
        "layers/dense_5": f"{_TWO_STAGE}/reference_mlp/layers/dense_1",
        "layers/dense_6": f"{_TWO_STAGE}/proposal_class_head",
        "layers/dense_7": f"{_TWO_STAGE}/proposal_box_head/layers/dense",
        "layers/dense_8": f"{_TWO_STAGE}/proposal_box_head/layers/dense_1",
        "layers/dense_9": f"{_TWO_STAGE}/proposal_box_head/layers/dense_2",
    },
}
# Trainable variables the query layer holds itself, which came first in the old order and now
# come after the box head: (their number, the query layer's variables after them).
_OWN_VARIABLES = {"learned": (1, 0), "reference": (1, 4), "encoder": (0, 0)}
_OPTIMIZER_GROUPS = ("optimizer/vars", "optimizer/inner_optimizer/vars")  # LossScaleOptimizer


def legacy_query_type(h5: h5py.File) -> str | None:
    """The ``query_type`` of an old-layout DETR weights file, or None for the current layout.

    Raises:
        ValueError: if the file holds no DETR weights.
    """
    if "box_head/layers" in h5:
        return None
    if "box_head/dense" not in h5:
        raise ValueError("The file holds no DETR weights (no `box_head` group).")
    if "layers/dense_6" in h5:
        return "encoder"
    if "layers/dense_4" in h5:
        return "reference"
    if "vars/0" in h5:
        return "learned"
    raise ValueError("Cannot tell the query type of these old DETR weights.")


def _convert_h5(source: h5py.File, target: h5py.File, query_type: str | None = None) -> str:
    """Copies ``source`` into the empty ``target`` in the current layout; returns the type."""
    found = legacy_query_type(source)
    if found is None:
        raise ValueError("The file is already in the current DETR layout: nothing to convert.")
    if query_type is not None and query_type != found:
        raise ValueError(f"The weights are of query_type={found!r}, the config says "
                         f"query_type={query_type!r}.")
    for name in source:
        source.copy(source[name], target, name=name)
    for key, value in source.attrs.items():
        target.attrs[key] = value
    for old, new in {**_BOX_HEAD, **_MOVES[found]}.items():
        target.require_group(os.path.dirname(new))
        target.move(old, new)
        if old == "vars":  # the model keeps its (now empty) own group
            group = target.create_group("vars")
            for key, value in source["vars"].attrs.items():
                group.attrs[key] = value
    own, after = _OWN_VARIABLES[found]
    if own:
        for path in _OPTIMIZER_GROUPS:
            if path in target:
                _move_slots(target[path], own, after)
    return found


def _move_slots(group: h5py.Group, own: int, after: int) -> None:
    """Moves the Adam slots of the first ``own`` variables to just before the last ``after``.

    The group holds ``iterations`` (and ``learning_rate``) as scalars, then a momentum and a
    velocity per trainable variable, in the variables' order.
    """
    names = sorted(group, key=int)
    header = 0
    while header < len(names) and group[names[header]].shape == ():
        header += 1
    slots, remainder = divmod(len(names) - header, 2)
    if remainder:
        raise ValueError(f"Unexpected optimizer state in {group.name!r}: {len(names)} entries.")
    if slots == 0:  # not built yet: no slots to move
        return
    order = list(range(slots))  # old slot index of each new slot
    order = order[own:slots - after] + order[:own] + order[slots - after:]
    for name in names[header:]:
        group.move(name, f"old_{name}")
    for new, old in enumerate(order):
        for k in range(2):  # momentum, velocity
            group.move(f"old_{header + 2 * old + k}", str(header + 2 * new + k))


def _convert_keras(src: str, dst: str) -> str:
    with zipfile.ZipFile(src) as archive:
        config = json.loads(archive.read("config.json"))
        query_type = config.get("config", {}).get("query_type", "learned")
        with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as source:
            buffer = io.BytesIO()
            with h5py.File(buffer, "w") as target:
                found = _convert_h5(source, target, query_type)
        with zipfile.ZipFile(dst, "w") as out:
            for info in archive.infolist():
                data = buffer.getvalue() if info.filename == "model.weights.h5" else (
                    archive.read(info.filename))
                out.writestr(info, data)
    return found


def convert_legacy_weights(src: str | os.PathLike, dst: str | os.PathLike) -> str:
    """Rewrites an old-layout DETR ``.keras`` or ``.weights.h5`` file in the current layout.

    Model weights move to their new paths and the optimizer's slots (if saved) to the new
    order of the trainable variables; values are unchanged. ``dst`` is written atomically
    (it may be ``src``).

    Args:
        src: a ``.keras`` archive or a ``.weights.h5`` file saved before the change.
        dst: the converted file (same kind).

    Returns:
        The ``query_type`` of the model.

    Raises:
        ValueError: ``src`` is not an old-layout DETR file, or the kinds of ``src`` and
            ``dst`` differ.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    kinds = [".keras" if p.endswith(".keras") else ".weights.h5" if p.endswith(".weights.h5")
             else None for p in (src, dst)]
    if kinds[0] is None or kinds[0] != kinds[1]:
        raise ValueError(
            "`src` and `dst` must both end in .keras or both in .weights.h5. "
            f"Received: src={src!r}, dst={dst!r}"
        )
    if not os.path.isfile(src):
        raise ValueError(f"File not found: {src!r}")
    folder = os.path.dirname(os.path.abspath(dst))
    handle, tmp = tempfile.mkstemp(suffix=kinds[0], dir=folder)
    os.close(handle)
    try:
        if kinds[0] == ".keras":
            found = _convert_keras(src, tmp)
        else:
            with h5py.File(src, "r") as source, h5py.File(tmp, "w") as target:
                found = _convert_h5(source, target)
        os.replace(tmp, dst)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(f"Cannot read {src!r} as a Keras {kinds[0]} file: {error}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return found
