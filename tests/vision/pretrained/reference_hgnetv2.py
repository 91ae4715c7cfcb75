"""transformers' HGNetV2 backbone at random tiny weights, and its feature maps.

``python reference_hgnetv2.py OUT.npz`` builds one ``HGNetV2Backbone`` per entry of
`VARIANTS` (8-24 channels), between them: the learnable affine blocks on and off, light and
ordinary stages, stages with and without the depthwise downsampling (one of stride 1), chains
of 2 and 3 convolutions, kernels 3 and 5, two blocks in a stage (the residual sum), the stem's
activation ReLU and SiLU; the stem and the four stages returned, or two stages. Every
parameter and buffer is drawn anew: each convolution at the scale of its fan-in, each
BatchNorm's scale, shift and running statistics, each affine block's scale and bias (a
negative bias makes the zeros that the stem pads before its max-pool count). Each runs in eval
mode on the same images of odd size (2 x 3 x 45 x 61). OUT.npz holds ``images`` (NHWC) and
per variant ``NAME/config`` (the backbone's ``config.json`` as a JSON string),
``NAME/state/KEY`` (its state dict under the names a ``DFineForObjectDetection`` gives it,
``model.backbone.model.KEY``) and ``NAME/feature_I`` (NHWC). Runs in a process of its own:
transformers' PyTorch modeling code and TensorFlow in one process crash.
"""

import sys

import numpy as np
import torch
import transformers

PREFIX = "model.backbone.model."
IMAGES = (2, 3, 45, 61)  # odd sizes: every padding and rounding of the strides shows
BASE = dict(stem_channels=[3, 8, 12], stage_in_channels=[12, 16, 16, 16],
            stage_mid_channels=[8, 8, 8, 12], stage_out_channels=[16, 16, 16, 24],
            stage_kernel_size=[3, 3, 5, 3], depths=[1, 1, 1, 1],
            hidden_sizes=[16, 16, 16, 24], embedding_size=12)
VARIANTS = {
    # D-FINE's pattern (N/S/M): learnable affine blocks, light last stages, 2 blocks.
    "lab": dict(stage_num_blocks=[1, 2, 2, 1], stage_numb_of_layers=[2, 3, 2, 2],
                stage_downsample=[False, True, True, True],
                stage_light_block=[False, False, True, True],
                use_learnable_affine_block=True, out_features=["stem", "stage1", "stage2",
                                                               "stage3", "stage4"]),
    # L/X's (no affine blocks), with a light first stage, an ordinary last one, a stage
    # downsampled at stride 1 and one not at all, and SiLU in the stem.
    "plain": dict(stage_num_blocks=[2, 1, 2, 1], stage_numb_of_layers=[3, 2, 2, 3],
                  stage_downsample=[True, False, True, True],
                  stage_downsample_strides=[1, 2, 2, 2],
                  stage_light_block=[True, False, True, False],
                  use_learnable_affine_block=False, hidden_act="silu",
                  out_indices=[3, 4]),
}


def randomize(model: torch.nn.Module) -> None:
    """Every parameter and buffer drawn anew: features near 1 in size, no constant weight."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.2)
                module.running_mean.normal_(0.0, 0.2)
                module.running_var.uniform_(0.5, 1.5)
            elif isinstance(module, torch.nn.Conv2d):
                module.weight.normal_(0.0, (1.0 / module.weight[0].numel()) ** 0.5)
            elif type(module).__name__ == "HGNetV2LearnableAffineBlock":
                module.scale.uniform_(0.5, 1.5)
                module.bias.normal_(-0.3, 0.3)


def main(out: str) -> None:
    torch.manual_seed(0)
    images = torch.randn(*IMAGES)
    arrays = {"images": images.permute(0, 2, 3, 1).numpy()}
    for name, variant in VARIANTS.items():
        config = transformers.HGNetV2Config(**BASE, **variant)
        model = transformers.HGNetV2Backbone(config).eval()
        randomize(model)
        arrays[f"{name}/config"] = np.array(config.to_json_string())
        for key, value in model.state_dict().items():
            arrays[f"{name}/state/{PREFIX}{key}"] = value.numpy()
        with torch.no_grad():
            for i, feature in enumerate(model(images).feature_maps):
                arrays[f"{name}/feature_{i}"] = feature.permute(0, 2, 3, 1).numpy()
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
