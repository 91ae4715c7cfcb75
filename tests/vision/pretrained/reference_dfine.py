"""transformers' D-FINE of random tiny weights, saved as transformers saves it, and its outputs.

``python reference_dfine.py FOLDER`` writes, for each of `VARIANTS`:

- FOLDER/NAME/: ``save_pretrained`` of a tiny ``DFineForObjectDetection`` (``config.json`` +
  ``model.safetensors``, the layout of ``ustc-community/dfine-*-coco``) and its image
  processor's ``preprocessor_config.json`` (input 64 x 96);
  - ``small``: an HGNetV2 backbone with learnable affine blocks and light stages, 3 levels,
    ``d_model`` = the encoder's width (no decoder input projections, as D-FINE S/M/L),
    ``decoder_n_points`` [3, 6, 3], 3 decoder layers, 16 bins;
  - ``projected``: 2 levels (AIFI on the second, as D-FINE N), a decoder narrower than the
    encoder (projected, as D-FINE X), ``decoder_method`` ``discrete``, no affine blocks;
- FOLDER/expected.npz, under ``NAME_``: the input ``images`` (NHWC), then in eval mode
  ``backbone_i`` and ``encoder_i`` (each level's backbone and hybrid encoder output, NHWC),
  ``enc_outputs_class``, ``logits``, ``pred_boxes``, the post-processed detections of two
  uint8 ``photos`` through the processor, the model and ``post_process_object_detection``
  (threshold 0, at the
  photos' size: ``photo_scores``/``_labels``/``_boxes``), and ``margin``: the smallest gap
  between selected and left-out scores of both top-k selections (the seed is the first whose
  margin exceeds 5e-4, so the selections do not hang on rounding).
- FOLDER/expected.npz, under ``small_train_``: ``small`` in training mode without denoising
  queries (`training_outputs`) on 4 targets (``labels``/``boxes``/``valid``, padded to 3 per
  image), its ``margin`` (as ``margin``, of the training mode's cell selection), ``loss`` and
  weighted ``loss_dict`` terms, and ``tied_heads``: whether transformers ties every decoder
  layer's class and box heads to layer 0's (one parameter, its gradient the sum over layers);
  FOLDER/small_grads/: that loss's gradient of every weight as a folder to convert (the
  model's config.json and a model.safetensors under the weights' names, each tied copy holding
  the tied parameter's gradient; buffers and frozen weights hold their values, which the
  conversion checks).
- FOLDER/expected.npz, under ``small_deim_``: the same training-mode outputs scored by
  transformers' DEIMv2 criterion (``Deimv2ForObjectDetectionLoss``: the matchability-aware
  loss with DEIM's gamma 1.5, dense one-to-one box losses), its ``loss`` and weighted terms;
  under ``union_``: the union of four matchings of 9 queries (``matches``, each query's target
  or -1, first the last layer's) by ``Deimv2Loss._get_dense_o2o_indices`` (``indices``).

Every BatchNorm's scale, shift and statistics, every LayerNorm and every affine block is
randomized, and every convolution and linear layer is drawn again at the scale of its fan-in
(reference_rtdetr.py's `randomize`; transformers' zero box and quality heads, gates and
offsets would hide their conversion). Runs without TensorFlow (a process of its own).
"""

import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from reference_rtdetr import margin, nhwc, randomize  # noqa: E402

LABELS = {i: name for i, name in enumerate(("cat", "dog", "bird", "fish", "horse"))}
BACKBONE = dict(stem_channels=[3, 8, 8], stage_in_channels=[8, 16, 32, 32],
                stage_mid_channels=[8, 8, 16, 16], stage_out_channels=[16, 32, 32, 48],
                stage_num_blocks=[1, 1, 2, 1], stage_numb_of_layers=[2, 2, 2, 2],
                stage_kernel_size=[3, 3, 5, 5], stage_light_block=[False, False, True, True],
                stage_downsample=[False, True, True, True], hidden_sizes=[16, 32, 32, 48],
                embedding_size=8)
COMMON = dict(encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
              decoder_attention_heads=4, num_queries=10, max_num_bins=16, lqe_hidden_dim=16,
              depth_mult=0.34, hidden_expansion=0.5, num_denoising=6, id2label=LABELS)
VARIANTS = {
    "small": dict(backbone=dict(use_learnable_affine_block=True, out_indices=[2, 3, 4]),
                  model=dict(encoder_hidden_dim=32, d_model=32, encoder_in_channels=[32, 32, 48],
                             decoder_in_channels=[32, 32, 32], decoder_layers=3,
                             decoder_n_points=[3, 6, 3])),
    "projected": dict(backbone=dict(out_indices=[3, 4]),
                      model=dict(encoder_hidden_dim=48, d_model=32, encoder_in_channels=[32, 48],
                                 decoder_in_channels=[48, 48], feat_strides=[16, 32],
                                 encode_proj_layers=[1], num_feature_levels=2,
                                 decoder_layers=2, decoder_n_points=[4, 2],
                                 decoder_method="discrete")),
}
IMAGES = (2, 64, 96)  # batch, height, width: multiples of 32


def build(name: str, seed: int):
    torch.manual_seed(seed)
    variant = VARIANTS[name]
    backbone = transformers.HGNetV2Config(**BACKBONE, **variant["backbone"])
    config = transformers.DFineConfig(backbone_config=backbone, **COMMON, **variant["model"])
    model = transformers.DFineForObjectDetection(config).eval()
    randomize(model)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("LearnableAffineBlock"):
                module.scale.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    return model


def selection_margin(result, queries: int) -> float:
    return min(margin(result.enc_outputs_class.max(-1).values.numpy(), queries),
               margin(torch.sigmoid(result.logits).flatten(1).numpy(), queries))


def variant_outputs(folder: str, name: str, pixels: torch.Tensor, out: dict) -> None:
    from transformers import RTDetrImageProcessorPil

    height, width = IMAGES[1:]
    processor = RTDetrImageProcessorPil(size={"height": height, "width": width})
    photos = np.random.default_rng(6).integers(0, 256, (2, height, width, 3), dtype=np.uint8)
    photo_pixels = processor(images=list(photos), return_tensors="pt")["pixel_values"]
    for seed in range(20):
        model = build(name, seed)
        with torch.no_grad():
            result = model(pixel_values=pixels)
            photo_result = model(pixel_values=photo_pixels)
        queries = model.config.num_queries
        smallest = min(selection_margin(result, queries), selection_margin(photo_result, queries))
        if smallest > 5e-4:
            break
    model.save_pretrained(f"{folder}/{name}")
    processor.save_pretrained(f"{folder}/{name}")
    out[f"{name}_margin"] = np.float32(smallest)
    with torch.no_grad():
        for i, feature in enumerate(model.model.backbone.model(pixels).feature_maps):
            out[f"{name}_backbone_{i}"] = nhwc(feature)
    for i, level in enumerate(result.encoder_last_hidden_state):
        out[f"{name}_encoder_{i}"] = nhwc(level)
    for key in ("enc_outputs_class", "logits", "pred_boxes"):
        out[f"{name}_{key}"] = getattr(result, key).numpy()
    detections = processor.post_process_object_detection(
        photo_result, threshold=0.0, target_sizes=[(height, width)] * len(photos))
    out[f"{name}_photos"] = photos
    for key in ("scores", "labels", "boxes"):
        out[f"{name}_photo_{key}"] = np.stack([d[key].numpy() for d in detections])
    return model


def training_outputs(model, folder: str, pixels: torch.Tensor, out: dict) -> None:
    """See the module docstring; changes the model (training mode updates the encoder's
    BatchNorm statistics), so it runs after its other outputs."""
    import shutil

    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(11)
    counts, labels = (3, 1), []
    for count in counts:
        centres = 0.25 + 0.5 * torch.rand(count, 2, generator=generator)
        sizes = 0.1 + 0.3 * torch.rand(count, 2, generator=generator)
        labels.append({"class_labels": torch.randint(0, len(LABELS), (count,),
                                                     generator=generator),
                       "boxes": torch.cat([centres, sizes], dim=1)})
    pad = (len(counts), max(counts))
    targets = {"labels": np.zeros(pad, "int32"), "boxes": np.zeros((*pad, 4), "float32"),
               "valid": np.zeros(pad, bool)}
    for i, target in enumerate(labels):
        targets["labels"][i, :counts[i]] = target["class_labels"].numpy()
        targets["boxes"][i, :counts[i]] = target["boxes"].numpy()
        targets["valid"][i, :counts[i]] = True
    out.update({f"small_train_{key}": value for key, value in targets.items()})
    decoder = model.model.decoder
    out["small_train_tied_heads"] = np.bool_(
        decoder.class_embed[1].weight is decoder.class_embed[0].weight and
        decoder.bbox_embed[1].layers[0].weight is decoder.bbox_embed[0].layers[0].weight)

    model.config.num_denoising = 0  # the denoising queries are drawn at random
    model.train()
    model.zero_grad()
    model.loss_function = deim_alongside(model.loss_function, model.config, out)
    result = model(pixel_values=pixels, labels=labels)
    result.loss.backward()
    out["small_train_margin"] = np.float32(margin(  # the cells' selection
        result.enc_outputs_class.detach().max(-1).values.numpy(), model.config.num_queries))
    out["small_train_loss"] = result.loss.detach().numpy()
    for name, value in result.loss_dict.items():
        out[f"small_train_{name}"] = value.detach().numpy()
    # Every parameter under its in-memory names (the conversion reads those too); the
    # top-level heads (class_embed.i, bbox_embed.i) are tied to model.decoder's of the same
    # layer, the ones the conversion reads, and are left out.
    grads = {name: (p.detach() if not p.requires_grad else torch.zeros_like(p)
                    if p.grad is None else p.grad).clone()
             for name, p in model.named_parameters(remove_duplicate=False)}
    for name, array in model.state_dict().items():
        grads.setdefault(name, array.detach().clone())
    grads = {name: grad.contiguous() for name, grad in grads.items() if name.startswith("model.")}
    os.makedirs(f"{folder}/small_grads", exist_ok=True)
    shutil.copy(f"{folder}/small/config.json", f"{folder}/small_grads/config.json")
    save_file(grads, f"{folder}/small_grads/model.safetensors")


def deim_config(config):
    """A DEIMv2Config with the loss fields of ``config`` (a DFineConfig: its classes, matcher,
    weights and bins) and DEIM's: the matchability-aware loss (gamma 1.5, no alpha, weight 1)
    and dense one-to-one matching."""
    fields = {key: value for key, value in config.to_dict().items()
              if key.startswith(("matcher_", "weight_loss_", "focal_loss_"))
              or key in ("id2label", "max_num_bins", "reg_scale", "up", "auxiliary_loss")}
    return transformers.Deimv2Config(**{**fields, "focal_loss_gamma": 1.5, "mal_alpha": None,
                                        "weight_loss_mal": 1.0, "use_dense_one_to_one": True})


def deim_alongside(loss_function, config, out: dict):
    """``loss_function`` that also writes ``small_deim_*``: the DEIMv2 criterion's loss and
    terms on the same outputs (no gradient)."""
    from transformers.loss.loss_deimv2 import Deimv2ForObjectDetectionLoss

    def both(*args, **kwargs):
        with torch.no_grad():
            fixed = [x.detach() if isinstance(x, torch.Tensor) else x for x in args]
            named = {k: x.detach() if isinstance(x, torch.Tensor) else x
                     for k, x in kwargs.items()}
            loss, terms, _ = Deimv2ForObjectDetectionLoss(
                *fixed[:4], deim_config(config), *fixed[5:], **named)
            out["small_deim_loss"] = loss.numpy()
            for name, value in terms.items():
                out[f"small_deim_{name}"] = np.float32(value)
        return loss_function(*args, **kwargs)

    return both


def union_outputs(out: dict) -> None:
    """``union_matches``: four one-to-one matchings of 3 and 2 targets to 9 queries (the
    last layer's first), each query's target or -1, mostly agreeing as a decoder's layers
    do; ``union_indices``: their union by ``Deimv2Loss._get_dense_o2o_indices``."""
    from transformers.loss.loss_deimv2 import Deimv2Loss

    criterion = Deimv2Loss(transformers.Deimv2Config(num_labels=5))
    generator = torch.Generator().manual_seed(5)
    layers, queries, counts = 4, 9, (3, 2)
    matches = np.full((layers, len(counts), queries), -1, "int32")
    base = [torch.randperm(queries, generator=generator)[:n] for n in counts]
    for layer in range(layers):
        for image, n in enumerate(counts):
            chosen = base[image].clone()
            if layer and torch.rand(1, generator=generator) < 0.7:  # one target elsewhere
                free = [q for q in range(queries) if q not in chosen.tolist()]
                chosen[int(torch.randint(n, (1,), generator=generator))] = free[
                    int(torch.randint(len(free), (1,), generator=generator))]
            matches[layer, image, chosen.numpy()] = np.arange(n)
    as_pairs = [[(torch.from_numpy(np.flatnonzero(m >= 0)),
                  torch.from_numpy(m[m >= 0].astype("int64"))) for m in layer]
                for layer in matches]
    union = criterion._get_dense_o2o_indices(as_pairs[0], as_pairs[1:])
    out["union_matches"] = matches
    out["union_indices"] = np.full((len(counts), queries), -1, "int32")
    for image, (rows, cols) in enumerate(union):
        out["union_indices"][image, rows.numpy()] = cols.numpy()


def loss_outputs(out: dict) -> None:
    """transformers' ``DFineLoss.loss_local`` (FGL and DDF) of random edge logits, boxes and
    a given matching: ``loss_*`` (inputs, NHWC-free) and ``loss_fgl`` / ``loss_ddf``. Boxes
    of both sides are drawn so that some edges fall beyond the outermost offsets."""
    from transformers.loss.loss_d_fine import DFineLoss

    config = transformers.DFineConfig(num_labels=5, max_num_bins=16)
    criterion = DFineLoss(config)
    generator = torch.Generator().manual_seed(11)
    batch, queries, bins = 2, 7, config.max_num_bins + 1

    def boxes(*shape):
        centre = torch.rand(*shape, 2, generator=generator) * 0.6 + 0.2
        side = torch.rand(*shape, 2, generator=generator) * 0.4 + 0.05
        return torch.cat([centre, side], -1)

    corners = torch.randn(batch, queries, 4 * bins, generator=generator) * 2
    outputs = {"pred_corners": corners, "ref_points": boxes(batch, queries),
               "pred_boxes": boxes(batch, queries),
               "teacher_corners": torch.randn(batch, queries, 4 * bins, generator=generator),
               "teacher_logits": torch.randn(batch, queries, 5, generator=generator)}
    counts = (3, 2)
    targets = [{"boxes": boxes(n), "class_labels": torch.zeros(n, dtype=torch.long)}
               for n in counts]
    indices = [(torch.tensor([4, 0, 6]), torch.tensor([1, 2, 0])),
               (torch.tensor([2, 5]), torch.tensor([1, 0]))]
    losses = criterion.loss_local(outputs, targets, indices, float(sum(counts)))
    for key, value in outputs.items():
        out[f"loss_{key}"] = value.numpy()
    out["loss_targets"] = np.zeros((batch, max(counts), 4), "float32")
    out["loss_matches"] = np.full((batch, queries), -1, "int32")  # each query's target
    for i, (target, (source, index)) in enumerate(zip(targets, indices)):
        out["loss_targets"][i, :len(target["boxes"])] = target["boxes"].numpy()
        out["loss_matches"][i, source.numpy()] = index.numpy()
    for key in ("loss_fgl", "loss_ddf"):
        out[key] = np.float32(losses[key])


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    batch, height, width = IMAGES
    pixels = torch.randn(batch, 3, height, width)
    out = {"images": nhwc(pixels)}
    models = {name: variant_outputs(folder, name, pixels, out) for name in VARIANTS}
    loss_outputs(out)
    union_outputs(out)
    training_outputs(models["small"], folder, pixels, out)
    np.savez(f"{folder}/expected.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1])
