"""transformers' multi-scale deformable attention at random weights, and its outputs.

``python reference_deformable_attention.py OUT.npz`` writes, for each case of ``CASES``, the
module's parameters (``CASE/sampling_offsets.weight``, ... in PyTorch's ``(out, in)`` layout),
its inputs (``CASE/query``, ``CASE/value``, ``CASE/reference_points``, ``CASE/value_mask``
when the case masks) and its ``CASE/output``, with the spatial shapes in ``spatial_shapes``.
Cases: ``RTDetrMultiscaleDeformableAttention`` with point references per level (and a value
mask) and with box references; ``DFineMultiscaleDeformableAttention`` with a number of points
per level, a non-default offset scale, and both its sampling methods. Every weight and bias is
drawn at random, wide enough that sampling locations fall outside the maps. Run by
test_deformable_attention.py in a process of its own: transformers' PyTorch modeling code
crashes a process that has TensorFlow loaded.
"""

import sys

import numpy as np
import torch
from transformers import DFineConfig, RTDetrConfig
from transformers.models.d_fine.modeling_d_fine import DFineMultiscaleDeformableAttention
from transformers.models.rt_detr.modeling_rt_detr import RTDetrMultiscaleDeformableAttention

SPATIAL_SHAPES = [(3, 4), (2, 3)]
D_MODEL, HEADS, BATCH, QUERIES = 16, 2, 2, 5

# name -> (family, points, coordinates of a reference, per-level references, mask,
#          D-FINE's offset scale and method)
CASES = {
    "rtdetr_points": ("rtdetr", 3, 2, True, True, None, None),
    "rtdetr_boxes": ("rtdetr", 3, 4, False, False, None, None),
    "dfine_default": ("dfine", [3, 2], 4, False, False, 0.7, "default"),
    "dfine_discrete": ("dfine", [3, 2], 4, False, False, 0.7, "discrete"),
}


def build(family, points, offset_scale, method):
    levels = len(SPATIAL_SHAPES)
    if family == "rtdetr":
        config = RTDetrConfig(d_model=D_MODEL, num_feature_levels=levels,
                              decoder_attention_heads=HEADS, decoder_n_points=points)
        return RTDetrMultiscaleDeformableAttention(config, num_heads=HEADS, n_points=points)
    config = DFineConfig(d_model=D_MODEL, num_feature_levels=levels,
                         decoder_attention_heads=HEADS, decoder_n_points=points,
                         decoder_offset_scale=offset_scale, decoder_method=method)
    return DFineMultiscaleDeformableAttention(config)


def randomize(module, generator):
    """Every parameter drawn anew; the offsets wide (several pixels, past the borders)."""
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            std = {"sampling_offsets.weight": 0.5, "sampling_offsets.bias": 2.0}.get(name, 0.4)
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)


def run_case(name, generator) -> dict:
    family, points, coords, per_level, masked, offset_scale, method = CASES[name]
    module = build(family, points, offset_scale, method).eval()
    randomize(module, generator)
    levels, length = len(SPATIAL_SHAPES), sum(h * w for h, w in SPATIAL_SHAPES)
    query = torch.randn(BATCH, QUERIES, D_MODEL, generator=generator)
    value = torch.randn(BATCH, length, D_MODEL, generator=generator)
    ref_levels = levels if per_level else 1
    reference = torch.rand(BATCH, QUERIES, ref_levels, coords, generator=generator)
    reference[..., :2] = reference[..., :2] * 1.3 - 0.15  # some centres outside [0, 1]
    mask = torch.rand(BATCH, length, generator=generator) > 0.3 if masked else None
    shapes = torch.tensor(SPATIAL_SHAPES, dtype=torch.int64)
    starts = torch.tensor([0] + list(np.cumsum([h * w for h, w in SPATIAL_SHAPES])[:-1]))
    with torch.no_grad():
        if family == "rtdetr":
            output, _ = module(hidden_states=query, attention_mask=mask,
                               encoder_hidden_states=value, reference_points=reference,
                               spatial_shapes=shapes, spatial_shapes_list=SPATIAL_SHAPES,
                               level_start_index=starts)
        else:
            output, _ = module(hidden_states=query, reference_points=reference,
                               encoder_hidden_states=value, spatial_shapes=shapes,
                               spatial_shapes_list=SPATIAL_SHAPES)
    arrays = {f"{name}/{key}": value.numpy() for key, value in module.state_dict().items()
              if key != "num_points_scale"}
    arrays.update({f"{name}/query": query.numpy(), f"{name}/value": value.numpy(),
                   f"{name}/reference_points": reference.numpy(),
                   f"{name}/output": output.numpy()})
    if mask is not None:
        arrays[f"{name}/value_mask"] = mask.numpy()
    return arrays


def main(path: str) -> None:
    generator = torch.Generator().manual_seed(0)
    arrays = {"spatial_shapes": np.array(SPATIAL_SHAPES)}
    for name in CASES:
        arrays.update(run_case(name, generator))
    np.savez(path, **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
