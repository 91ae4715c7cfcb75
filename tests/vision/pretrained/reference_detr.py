"""transformers' DETR-R50 of random weights, saved in both published layouts, and its outputs
(two encoder and two decoder layers: `LAYERS`).

``python reference_detr.py FOLDER`` (FOLDER/id2label.json: the class of each of the 91
outputs, "N/A" for the ids COCO leaves unused) writes FOLDER/detr-resnet-50/ (``save_pretrained``:
``model.safetensors`` + ``config.json``, COCO's classes), FOLDER/detr-r50.pth (the same weights
under facebookresearch/detr's names, ``{"model": state_dict}``) and FOLDER/expected.npz: a
padded batch of two images of different sizes (``images`` NHWC, ``mask``) and every decoder
layer's ``logits`` ``(B, L, Q, 92)`` and ``boxes`` ``(B, L, Q, 4)``. The frozen BatchNorm
statistics and the LayerNorm weights are randomized, so that their conversion matters. Used by
test_reference_checkpoints.py in a process of its own (no TensorFlow).

The backbone is transformers' own ResNet-50 (``use_timm_backbone=False``), not timm's: timm
needs torchvision, and no CPU build of torchvision installs from PyPI beside a CPU torch. Both
are torchvision's ResNet-50 v1.5 (the stride in each bottleneck's 3x3 convolution); its weights
are saved under timm's names (`timm_name`), those of ``facebook/detr-resnet-50``'s
``model.safetensors``, so that the files hold the published layouts. A wrong renaming gives
other logits, or unloadable files: the parity test fails.
"""

import json
import re
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

BACKBONE = "model.backbone.conv_encoder.model."  # the backbone's prefix in saved checkpoints
# Two encoder and two decoder layers, not the published six: each layer's names are converted
# alike (its index aside), and two decoder layers still give an intermediate (aux) output;
# the other sizes (d 256, 8 heads, FFN 2048, 100 queries, ResNet-50) are the published ones.
LAYERS = 2


def timm_name(name: str) -> str:
    """A saved transformers-ResNet backbone name -> timm's (torchvision's), the published one:
    ``embedder.embedder.convolution`` -> ``conv1``, ``encoder.stages.S.layers.B.layer.I.
    normalization`` -> ``layer{S+1}.B.bn{I+1}``, ``...shortcut.convolution`` -> ``downsample.0``."""
    if not name.startswith(BACKBONE):
        return name
    inner = name[len(BACKBONE):]
    if stem := re.fullmatch(r"embedder\.embedder\.(convolution|normalization)\.(\w+)", inner):
        kind, tensor = stem.groups()
        return f"{BACKBONE}{'conv1' if kind == 'convolution' else 'bn1'}.{tensor}"
    block = re.fullmatch(r"encoder\.stages\.(\d)\.layers\.(\d+)\.(shortcut|layer\.(\d))\."
                         r"(convolution|normalization)\.(\w+)", inner)
    if block is None:
        raise ValueError(f"no timm name for {name!r}")
    stage, index, part, conv, kind, tensor = block.groups()
    if part == "shortcut":
        part = "downsample." + ("0" if kind == "convolution" else "1")
    else:
        part = ("conv" if kind == "convolution" else "bn") + str(int(conv) + 1)
    return f"{BACKBONE}layer{int(stage) + 1}.{index}.{part}.{tensor}"


def detr_name(name: str) -> str:
    """A transformers DETR parameter name -> facebookresearch/detr's (attention unpacked)."""
    for theirs, ours in (("model.backbone.conv_encoder.model.", "backbone.0.body."),
                         ("model.input_projection", "input_proj"),
                         ("model.query_position_embeddings", "query_embed"),
                         ("model.encoder.", "transformer.encoder."),
                         ("model.decoder.layernorm", "transformer.decoder.norm"),
                         ("model.decoder.", "transformer.decoder."),
                         ("class_labels_classifier", "class_embed"),
                         ("bbox_predictor", "bbox_embed"),
                         ("encoder_attn_layer_norm", "norm2"),
                         ("encoder_attn.", "multihead_attn."),
                         ("fc1", "linear1"), ("fc2", "linear2")):
        name = name.replace(theirs, ours)
    if name.startswith("transformer.encoder."):
        name = name.replace("self_attn_layer_norm", "norm1").replace("final_layer_norm", "norm2")
    return name.replace("self_attn_layer_norm", "norm1").replace("final_layer_norm", "norm3")


def facebookresearch_state(state: dict) -> dict:
    renamed = {detr_name(name): value for name, value in state.items()
               if not name.endswith("num_batches_tracked")}
    for name in [n for n in renamed if ".q_proj." in n]:
        base, p = name.split(".q_proj.")
        renamed[f"{base}.in_proj_{p}"] = torch.cat(
            [renamed.pop(f"{base}.{x}_proj.{p}") for x in "qkv"])
    return renamed


def main(folder: str) -> None:
    torch.manual_seed(0)
    with open(f"{folder}/id2label.json", encoding="utf-8") as f:  # facebook/detr-resnet-50's
        id2label = {int(k): v for k, v in json.load(f).items()}
    resnet50 = transformers.ResNetConfig(depths=[3, 4, 6, 3], layer_type="bottleneck",
                                         downsample_in_bottleneck=False, out_features=["stage4"])
    config = transformers.DetrConfig(use_timm_backbone=False, backbone_config=resnet50,
                                     use_pretrained_backbone=False, encoder_layers=LAYERS,
                                     decoder_layers=LAYERS, id2label=id2label,
                                     label2id={v: k for k, v in id2label.items()})
    model = transformers.DetrForObjectDetection(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "DetrFrozenBatchNorm2d":
                module.weight.uniform_(0.5, 1.0)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.75, 1.25)
            elif isinstance(module, torch.nn.LayerNorm):  # ones and zeros would hide a norm
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    model.save_pretrained(f"{folder}/detr-resnet-50")
    saved = load_file(f"{folder}/detr-resnet-50/model.safetensors")
    published = {timm_name(name): value for name, value in saved.items()}
    assert len(published) == len(saved), "two weights renamed alike"
    save_file(published, f"{folder}/detr-resnet-50/model.safetensors", metadata={"format": "pt"})
    with open(f"{folder}/detr-resnet-50/config.json", encoding="utf-8") as f:
        info = json.load(f)
    del info["backbone_config"]  # the published config.json's: timm's ResNet-50
    info.update(use_timm_backbone=True, backbone="resnet50", use_pretrained_backbone=False)
    with open(f"{folder}/detr-resnet-50/config.json", "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    torch.save({"model": facebookresearch_state(published)}, f"{folder}/detr-r50.pth")

    rng = np.random.default_rng(0)
    images = np.zeros((2, 96, 128, 3), "float32")  # padded to the larger image
    mask = np.zeros((2, 96, 128), bool)
    for i, (h, w) in enumerate(((96, 128), (80, 100))):
        images[i, :h, :w] = rng.standard_normal((h, w, 3))
        mask[i, :h, :w] = True
    with torch.no_grad():
        pixels = torch.from_numpy(images.transpose(0, 3, 1, 2))
        pixel_mask = torch.from_numpy(mask.astype("int64"))
        out = model(pixel_values=pixels, pixel_mask=pixel_mask, output_hidden_states=True)
        # Each decoder layer's output, normalized by the decoder's final LayerNorm: DETR's
        # intermediate outputs (transformers' own `auxiliary_loss=True` path instead feeds the
        # normalized state on to the next layer, which DETR does not). The last of the
        # `decoder_hidden_states` is the final state, normalized already.
        states = out.decoder_hidden_states[-model.config.decoder_layers:]
        earlier = model.model.decoder.layernorm(torch.stack(states[:-1], dim=1))
        hidden = torch.cat([earlier, states[-1][:, None]], dim=1)  # (B, L, Q, d)
        logits = model.class_labels_classifier(hidden).numpy()
        boxes = model.bbox_predictor(hidden).sigmoid().numpy()
    # The last layer's are the model's own outputs.
    np.testing.assert_allclose(logits[:, -1], out.logits.numpy(), atol=1e-6)
    np.testing.assert_allclose(boxes[:, -1], out.pred_boxes.numpy(), atol=1e-6)
    np.savez(f"{folder}/expected.npz", images=images, mask=mask, logits=logits, boxes=boxes)


if __name__ == "__main__":
    main(sys.argv[1])
