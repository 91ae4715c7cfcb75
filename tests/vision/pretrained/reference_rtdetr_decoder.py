"""transformers' RT-DETR decoder at random tiny weights, and its outputs.

``python reference_rtdetr_decoder.py OUT.npz`` builds ``RTDetrDecoder`` with the per-layer
class and box heads ``RTDetrForObjectDetection`` gives it (3 layers, width 32, 4 heads, 2
points on each of 3 levels, 5 classes), randomizes it as reference_rtdetr.py does (its
`randomize`: every linear layer and LayerNorm drawn anew), and runs it in eval mode on random
queries, memory and reference box logits, with a denoising-style self-attention mask (two
groups of two denoising queries, then four matching queries). OUT.npz holds the state under
the checkpoint's names (``model.decoder.*``), the inputs (``target``, ``memory``,
``reference_logits``, ``spatial_shapes``, ``attention_mask``: True = may attend) and
``intermediate_logits``, ``intermediate_reference_points``. Runs in a process of its own:
transformers' PyTorch modeling code and TensorFlow in one process crash.
"""

import os
import sys

import numpy as np
import torch
import transformers
from transformers.models.rt_detr.modeling_rt_detr import RTDetrDecoder, RTDetrMLPPredictionHead

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_rtdetr import randomize  # noqa: E402

CONFIG = dict(d_model=32, decoder_attention_heads=4, decoder_n_points=2, num_feature_levels=3,
              decoder_layers=3, decoder_ffn_dim=64)
CLASSES, BATCH, DENOISING, GROUP, MATCHING = 5, 2, 4, 2, 4
SPATIAL_SHAPES = [(4, 6), (2, 3), (1, 2)]


def attention_mask(queries: int) -> np.ndarray:
    """RT-DETR's denoising mask, True = may attend: the matching queries do not see the
    denoising ones, and each denoising group sees itself and the matching queries only."""
    allowed = np.ones((queries, queries), bool)
    allowed[DENOISING:, :DENOISING] = False
    for start in range(0, DENOISING, GROUP):
        allowed[start:start + GROUP, :start] = False
        allowed[start:start + GROUP, start + GROUP:DENOISING] = False
    return allowed


def main(path: str) -> None:
    torch.manual_seed(0)
    config = transformers.RTDetrConfig(**CONFIG, attn_implementation="eager")
    decoder = RTDetrDecoder(config)
    d, layers = CONFIG["d_model"], CONFIG["decoder_layers"]
    decoder.class_embed = torch.nn.ModuleList(torch.nn.Linear(d, CLASSES) for _ in range(layers))
    decoder.bbox_embed = torch.nn.ModuleList(RTDetrMLPPredictionHead(d, d, 4, num_layers=3)
                                             for _ in range(layers))
    decoder.eval()
    randomize(decoder)
    queries, length = DENOISING + MATCHING, sum(h * w for h, w in SPATIAL_SHAPES)
    target = torch.randn(BATCH, queries, d)
    memory = torch.randn(BATCH, length, d)
    reference_logits = torch.randn(BATCH, queries, 4) * 1.5
    allowed = attention_mask(queries)
    additive = torch.zeros(queries, queries).masked_fill(torch.from_numpy(~allowed), -torch.inf)
    shapes = torch.tensor(SPATIAL_SHAPES)
    areas = shapes.prod(1)
    with torch.no_grad():
        result = decoder(inputs_embeds=target, encoder_hidden_states=memory,
                         encoder_attention_mask=additive, reference_points=reference_logits,
                         spatial_shapes=shapes, spatial_shapes_list=SPATIAL_SHAPES,
                         level_start_index=torch.cumsum(areas, 0) - areas)
    arrays = {f"model.decoder.{name}": value.numpy()
              for name, value in decoder.state_dict().items()}
    arrays.update(target=target.numpy(), memory=memory.numpy(),
                  reference_logits=reference_logits.numpy(),
                  spatial_shapes=np.array(SPATIAL_SHAPES), attention_mask=allowed,
                  intermediate_logits=result.intermediate_logits.numpy(),
                  intermediate_reference_points=result.intermediate_reference_points.numpy())
    np.savez(path, **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
