"""The arguments of `vision.modeling.hgnetv2.HGNetV2Backbone` from transformers'
``HGNetV2Config``: the ``backbone_config`` of a D-FINE ``config.json``.

The published D-FINE folders (ustc-community/dfine-{nano,small,medium,large,xlarge}-coco,
their -obj365 and -obj2coco variants, written by transformers'
convert_d_fine_original_pytorch_checkpoint_to_hf.py) carry these backbone fields, each of
which is:

- read: ``stem_channels``, ``stem_strides``, ``stage_in_channels``, ``stage_mid_channels``,
  ``stage_out_channels``, ``stage_num_blocks``, ``stage_downsample``,
  ``stage_downsample_strides``, ``stage_light_block``, ``stage_kernel_size``,
  ``stage_numb_of_layers``, ``use_learnable_affine_block``, ``hidden_act`` (the stem's
  activation), ``out_indices`` / ``out_features`` (the returned stages; both given, they must
  agree);
- checked, read by transformers without changing the computation: ``model_type``
  (``hgnet_v2``), ``num_channels`` (``stem_channels[0]``), ``depths`` (only its length counts:
  it names the stages), ``stage_names`` (``stem``, ``stage1``...), ``hidden_sizes`` and
  ``embedding_size`` (the channels transformers reports for the stages and the stem, which
  size D-FINE's input projections: those of the returned maps must be the true ones);
- ignored: ``initializer_range`` (training), and ``layer_type``, ``downsample_in_bottleneck``,
  ``downsample_in_first_stage``, which the conversion script left from RT-DETR's ResNet and
  which HGNetV2 never reads.

The field set is that of the published ``backbone_config`` (dfine-small-coco's, and the
medium/large/xlarge ones as copied in public code), and of ``HGNetV2Config.to_dict()``
(``transformers_version``...). Every other field is bookkeeping (names, label maps, dtype,
the original code's training options) and accepted, by `vision.pretrained.rtdetr_config`'s rule; a
value the backbone does not implement is refused by one ``ValueError`` naming the file and
the field.
"""

from __future__ import annotations

from vision.pretrained.config_rule import ACTIVATIONS, refuse

__all__ = ["DEFAULTS", "hgnetv2_settings"]

# HGNetV2Config's defaults (transformers 5): the architecture of D-FINE L.
DEFAULTS = {
    "num_channels": 3, "embedding_size": 64, "depths": [3, 4, 6, 3],
    "hidden_sizes": [256, 512, 1024, 2048], "hidden_act": "relu",
    "stem_channels": [3, 32, 48], "stem_strides": [2, 1, 1, 2, 1],
    "stage_in_channels": [48, 128, 512, 1024], "stage_mid_channels": [48, 96, 192, 384],
    "stage_out_channels": [128, 512, 1024, 2048], "stage_num_blocks": [1, 1, 3, 1],
    "stage_downsample": [False, True, True, True], "stage_downsample_strides": [2, 2, 2, 2],
    "stage_light_block": [False, False, True, True], "stage_kernel_size": [3, 3, 5, 5],
    "stage_numb_of_layers": [6, 6, 6, 6], "use_learnable_affine_block": False,
}
_STAGES = ("stage_in_channels", "stage_mid_channels", "stage_out_channels", "stage_num_blocks",
           "stage_downsample", "stage_downsample_strides", "stage_light_block",
           "stage_kernel_size", "stage_numb_of_layers")
def _ints(file: str, fields: dict, name: str, odd: bool = False) -> list[int]:
    values = list(fields[name])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 and (v % 2 or not odd)
               for v in values):
        refuse(file, name, fields[name], "is not supported (only positive "
                f"{'odd ' if odd else ''}integers: one value for both axes)")
    return values


def hgnetv2_settings(backbone: dict, file: str = "config.json") -> dict:
    """`vision.modeling.hgnetv2.HGNetV2Backbone` arguments of an ``HGNetV2Config`` dict (a
    D-FINE ``config.json``'s ``backbone_config``; see the module docstring).

    Raises:
        ValueError: another backbone type, an unknown field or an unsupported value; the
            message names ``file``, the field and its value.
    """
    if backbone.get("model_type", "hgnet_v2") != "hgnet_v2":
        refuse(file, "model_type", backbone["model_type"], "is not supported (only 'hgnet_v2')")
    fields = {**DEFAULTS, **{k: v for k, v in backbone.items() if v is not None}}
    count = len(fields["stage_in_channels"])
    for name in _STAGES:
        if len(fields[name]) != count:
            refuse(file, name, fields[name], f"must have one entry per stage ({count}, as "
                                              "stage_in_channels)")
    stem = _ints(file, fields, "stem_channels")
    strides = _ints(file, fields, "stem_strides")
    if len(stem) != 3:
        refuse(file, "stem_channels", stem, "is not supported (3 entries)")
    if len(strides) != 5 or strides[1:3] != [1, 1]:
        refuse(file, "stem_strides", strides, "is not supported (5 entries, the second and "
                                               "third 1: stem2a/2b keep stem1's size)")
    out = _ints(file, fields, "stage_out_channels")
    if list(fields["stage_in_channels"]) != [stem[2], *out[:-1]]:
        refuse(file, "stage_in_channels", fields["stage_in_channels"],
                f"differs from the stem's and the stages' outputs {[stem[2], *out[:-1]]}")
    if fields["num_channels"] != stem[0]:
        refuse(file, "num_channels", fields["num_channels"],
                f"differs from stem_channels[0] ({stem[0]})")
    names = ["stem"] + [f"stage{i}" for i in range(1, count + 1)]
    if len(fields["depths"]) != count:
        refuse(file, "depths", fields["depths"], f"must have one entry per stage ({count})")
    if fields.get("stage_names", names) != names:
        refuse(file, "stage_names", fields["stage_names"], f"is not supported (only {names})")
    indices, features = fields.get("out_indices"), fields.get("out_features")
    if features is not None and any(f not in names for f in features):
        refuse(file, "out_features", features, f"names other stages than {names}")
    if indices is None:
        indices = [names.index(f) for f in features] if features else [count]
    if not indices or any(not isinstance(i, int) or not 0 <= i <= count for i in indices) \
            or sorted(set(indices)) != list(indices):
        refuse(file, "out_indices", indices, f"is not supported (increasing indices in "
                                              f"[0, {count}])")
    if features is not None and [names[i] for i in indices] != list(features):
        refuse(file, "out_features", features, f"differs from out_indices {indices}")
    reported = [fields["embedding_size"], *fields["hidden_sizes"]]
    true = [stem[2], *out]
    for i in indices:
        if i >= len(reported) or reported[i] != true[i]:
            field = "embedding_size" if i == 0 else "hidden_sizes"
            refuse(file, field, fields[field], f"gives {names[i]} other channels than its "
                                                f"{true[i]} (the output it is returned as)")
    act = fields["hidden_act"]
    if act not in ACTIVATIONS:
        refuse(file, "hidden_act", act, f"is not supported (one of {sorted(ACTIVATIONS)})")
    flags = {name: [bool(v) for v in fields[name]]
             for name in ("stage_downsample", "stage_light_block")}
    return dict(
        stem_channels=stem, stem_strides=strides,
        stage_in_channels=_ints(file, fields, "stage_in_channels"),
        stage_mid_channels=_ints(file, fields, "stage_mid_channels"), stage_out_channels=out,
        stage_num_blocks=_ints(file, fields, "stage_num_blocks"),
        stage_downsample_strides=_ints(file, fields, "stage_downsample_strides"),
        stage_kernel_size=_ints(file, fields, "stage_kernel_size", odd=True),
        stage_numb_of_layers=_ints(file, fields, "stage_numb_of_layers"), **flags,
        use_learnable_affine_block=bool(fields["use_learnable_affine_block"]),
        hidden_act=ACTIVATIONS[act], out_indices=list(indices))
