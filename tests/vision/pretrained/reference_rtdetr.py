"""transformers' RT-DETR of random tiny weights, saved as transformers saves it, and its outputs.

``python reference_rtdetr.py FOLDER`` writes

- FOLDER/rtdetr/: ``save_pretrained`` of a tiny ``RTDetrForObjectDetection`` (``config.json``
  + ``model.safetensors``, the layout of ``PekingU/rtdetr_r50vd``): an RTDetrResNet-vd
  bottleneck backbone (16-channel stem, stages of 32-256 channels, 1-2 blocks), hidden size
  32, 4 heads, CSPRep blocks at ``hidden_expansion`` 0.5 (so that their third convolution
  exists), 4 feature levels (one made by the extra stride-2 convolution), 10 queries,
  2 decoder layers, 5 classes;
- FOLDER/basic/ and FOLDER/downsample/: two backbones alone (``RTDetrResNetBackbone``): the
  basic blocks of R18/R34-vd, and bottlenecks with ``downsample_in_bottleneck`` and
  ``downsample_in_first_stage`` set;
- FOLDER/expected.npz: the input ``images`` ``(B, H, W, 3)`` (NHWC, as the Keras model takes
  them), then, in eval mode: ``backbone_i`` and ``encoder_i`` (each level's backbone and hybrid
  encoder output, NHWC), ``enc_outputs_class``, ``enc_outputs_coord_logits``,
  ``enc_topk_logits``, ``enc_topk_bboxes``, ``init_reference_points``, ``logits``,
  ``pred_boxes``, ``intermediate_logits``, ``intermediate_reference_points``, the
  post-processed detections of ``RTDetrImageProcessorPil.post_process_object_detection``
  (``threshold``, ``target_sizes``; ``det_scores``/``det_labels``/``det_boxes`` padded with
  ``det_count`` per image) and ``basic_i`` / ``downsample_i`` for the two backbones; also
  ``topk_margin``: the smallest gap between the selected queries' scores and the best one
  left out (a reference too close to a tie would make the top-k selection flaky); and the
  image processor's part (`processor_outputs`): FOLDER/rtdetr/preprocessor_config.json and
  the detections of uint8 photos through processor, model and post-processing;
- FOLDER/rtdetr_v2/ and ``v2_*``: an RT-DETR v2 of the same configuration (`v2_outputs`);
- the loss (`loss_outputs`): ``loss_labels`` / ``loss_boxes`` / ``loss_valid`` (targets padded
  to 3 per image), transformers' ``loss`` and weighted ``loss_dict`` terms in eval mode
  (``eval_*``) and in training mode without denoising queries (``train_*``), and the gradient
  of that training loss for every weight, saved as a folder of its own (FOLDER/rtdetr_grads/:
  the model's config.json and a model.safetensors of gradients under the weights' names, zero
  for statistics and frozen weights), so that the conversion maps them as it maps the weights;
  and a training run with denoising queries (`denoising_outputs`: ``dn_*``).

Every BatchNorm's scale, shift and running statistics and every LayerNorm's weights are
randomized, and every convolution and linear layer is drawn again at the scale of its fan-in
(transformers draws them at 0.01, or constant: the deformable attention's offsets and weights,
the last layer of each box head), so that each of them must be converted and the features stay
near 1 in size. Runs without TensorFlow (a process of its own: transformers' PyTorch modeling
code and TensorFlow in one process crash).
"""

import os
import sys

import numpy as np
import torch
import transformers

CONFIG = dict(encoder_hidden_dim=32, encoder_in_channels=[64, 128, 256], d_model=32,
              encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=4,
              decoder_attention_heads=4, num_queries=10, decoder_layers=2, decoder_n_points=2,
              num_feature_levels=4, hidden_expansion=0.5, decoder_in_channels=[32, 32, 32],
              id2label={i: name for i, name in enumerate(
                  ("cat", "dog", "bird", "fish", "horse"))})
BACKBONE = dict(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 2, 1, 1],
                out_indices=[2, 3, 4])
VARIANTS = {"basic": dict(layer_type="basic", hidden_sizes=[16, 32, 64, 128]),
            "downsample": dict(downsample_in_bottleneck=True, downsample_in_first_stage=True)}
IMAGES = (2, 64, 96)  # batch, height, width: multiples of 32, as RT-DETR's FPN needs
SEED = 3  # the first seed whose top-k margins (see `margin`) exceed 5e-4 with torch 2.x
V2_SEED = 4  # the v2 model's: the first whose margins exceed 5e-4 (3, the v1's: 3e-5)
PHOTO_SEED = 6  # the photos': the first whose margins exceed 1e-3 (seeds 1-5 are under 6e-4)


def randomize(model: torch.nn.Module, backbone_only: bool = False) -> None:
    """Random norms (statistics included) and no constant weights."""
    with torch.no_grad():
        for path, module in model.named_modules():
            name = type(module).__name__
            # He (fan-in) in the backbone (ReLU), 1 / sqrt(fan-in) after it (the CSP blocks
            # add three branches): features near 1 in size.
            gain = 2.0 if backbone_only or ".backbone." in f".{path}" else 1.0
            if "BatchNorm" in name:
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
            elif isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
            elif isinstance(module, torch.nn.Conv2d):
                module.weight.normal_(0.0, (gain / module.weight[0].numel()) ** 0.5)
            elif isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, module.in_features ** -0.5)
                if module.bias is not None and torch.all(module.bias == 0):
                    module.bias.normal_(0.0, 0.1)


def nhwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 2, 3, 1).numpy()


def backbone_variant(folder: str, name: str, pixels: torch.Tensor, out: dict) -> None:
    config = transformers.RTDetrResNetConfig(**{**BACKBONE, **VARIANTS[name]})
    backbone = transformers.RTDetrResNetBackbone(config).eval()
    randomize(backbone, backbone_only=True)
    backbone.save_pretrained(f"{folder}/{name}")
    with torch.no_grad():
        for i, feature in enumerate(backbone(pixels).feature_maps):
            out[f"{name}_{i}"] = nhwc(feature)


def margin(scores: np.ndarray, k: int) -> float:
    """The smallest gap among the ``k + 1`` largest of each row of ``scores``: what keeps a
    top-``k`` selection and its order from depending on rounding."""
    ordered = -np.sort(-scores, axis=-1)[..., :k + 1]
    return float((ordered[..., :-1] - ordered[..., 1:]).min())


def run(seed: int, pixels: torch.Tensor):
    """The model of seed ``seed``, its outputs on ``pixels`` and the smallest top-k margin."""
    torch.manual_seed(seed)
    config = transformers.RTDetrConfig(
        backbone_config=transformers.RTDetrResNetConfig(**BACKBONE), **CONFIG)
    model = transformers.RTDetrForObjectDetection(config).eval()
    randomize(model)
    with torch.no_grad():
        result = model(pixel_values=pixels)
    return model, result, selection_margin(result)


def selection_margin(result) -> float:
    """`margin` of a model output's two top-k selections: the encoder's cells (their best
    class logit) and the post-processing's (query, class) scores."""
    queries = CONFIG["num_queries"]
    return min(margin(result.enc_outputs_class.max(-1).values.numpy(), queries),
               margin(torch.sigmoid(result.logits).flatten(1).numpy(), queries))


def v2_outputs(folder: str, pixels: torch.Tensor, out: dict) -> None:
    """FOLDER/rtdetr_v2/: an ``RTDetrV2ForObjectDetection`` of the same configuration (its
    decoder attending to the 4 levels, ``decoder_offset_scale`` 0.5, the ``default``
    sampling), randomized as the v1 model; its eval-mode ``v2_logits``, ``v2_pred_boxes``
    and ``v2_topk_margin``."""
    torch.manual_seed(V2_SEED)
    config = transformers.RTDetrV2Config(
        backbone_config=transformers.RTDetrResNetConfig(**BACKBONE),
        decoder_n_levels=CONFIG["num_feature_levels"], **CONFIG)
    model = transformers.RTDetrV2ForObjectDetection(config).eval()
    randomize(model)
    model.save_pretrained(f"{folder}/rtdetr_v2")
    with torch.no_grad():
        result = model(pixel_values=pixels)
    out["v2_topk_margin"] = np.float32(selection_margin(result))
    out["v2_logits"], out["v2_pred_boxes"] = result.logits.numpy(), result.pred_boxes.numpy()


def processor_outputs(model, folder: str, out: dict) -> None:
    """The image processor end to end: saved beside the model (``preprocessor_config.json``,
    input 64 x 96), run on two uint8 ``photos`` of that size (no resize), the model, and the
    post-processing to detections at the photos' size (``photo_scores``/``_labels``/``_boxes``:
    every query's best (query, class) pair, threshold 0); ``photo_margin`` as ``topk_margin``.
    Also ``large_photo`` (80 x 120, uint8) and the ``large_pixels`` the processor makes of it
    (PIL's bilinear shrink to 64 x 96, rounded to integers, / 255)."""
    from transformers import RTDetrImageProcessorPil

    height, width = IMAGES[1:]
    processor = RTDetrImageProcessorPil(size={"height": height, "width": width})
    processor.save_pretrained(folder)
    rng = np.random.default_rng(PHOTO_SEED)
    photos = rng.integers(0, 256, (2, height, width, 3), dtype=np.uint8)
    pixels = processor(images=list(photos), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        result = model(pixel_values=pixels)
    out["photo_margin"] = np.float32(selection_margin(result))
    detections = processor.post_process_object_detection(
        result, threshold=0.0, target_sizes=[(height, width)] * len(photos))
    out["photos"] = photos
    for key in ("scores", "labels", "boxes"):
        out[f"photo_{key}"] = np.stack([d[key].numpy() for d in detections])
    large = rng.integers(0, 256, (1, 80, 120, 3), dtype=np.uint8)
    out["large_photo"] = large
    out["large_pixels"] = nhwc(processor(images=list(large), return_tensors="pt")
                               ["pixel_values"])


def loss_outputs(model, folder: str, pixels: torch.Tensor, out: dict) -> None:
    """See the module docstring; changes the model (training mode updates BatchNorm
    statistics), so it runs last."""
    import shutil

    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(11)
    counts, num_labels = (3, 1), len(CONFIG["id2label"])
    labels = []
    for count in counts:
        centres = 0.25 + 0.5 * torch.rand(count, 2, generator=generator)
        sizes = 0.1 + 0.3 * torch.rand(count, 2, generator=generator)
        labels.append({"class_labels": torch.randint(0, num_labels, (count,),
                                                     generator=generator),
                       "boxes": torch.cat([centres, sizes], dim=1)})
    most = max(counts)
    out["loss_labels"] = np.zeros((len(counts), most), "int32")
    out["loss_boxes"] = np.zeros((len(counts), most, 4), "float32")
    out["loss_valid"] = np.zeros((len(counts), most), bool)
    for i, target in enumerate(labels):
        out["loss_labels"][i, :counts[i]] = target["class_labels"].numpy()
        out["loss_boxes"][i, :counts[i]] = target["boxes"].numpy()
        out["loss_valid"][i, :counts[i]] = True
    with torch.no_grad():
        result = model(pixel_values=pixels, labels=labels)
    out["eval_loss"] = result.loss.numpy()
    for name, value in result.loss_dict.items():
        out[f"eval_{name}"] = value.detach().numpy()

    model.config.num_denoising = 0  # the denoising queries are drawn at random
    model.train()
    model.zero_grad()
    result = model(pixel_values=pixels, labels=labels)
    result.loss.backward()
    out["train_loss"] = result.loss.detach().numpy()
    for name, value in result.loss_dict.items():
        out[f"train_{name}"] = value.detach().numpy()
    # Under the in-memory names (transformers 5 saves some under older ones; the conversion
    # reads both), the saved file's tied copies left out.
    parameters = dict(model.named_parameters())
    grads = {}
    for name, array in model.state_dict().items():
        grad = parameters[name].grad if name in parameters else None
        grads[name] = torch.zeros_like(array) if grad is None else grad.detach().clone()
    saved = len(load_file(f"{folder}/rtdetr/model.safetensors"))
    grads = {name: grad for name, grad in grads.items() if not (
        len(grads) > saved and name.startswith("model.decoder.") and
        name.replace("model.decoder.", "", 1) in grads)}
    os.makedirs(f"{folder}/rtdetr_grads", exist_ok=True)
    shutil.copy(f"{folder}/rtdetr/config.json", f"{folder}/rtdetr_grads/config.json")
    save_file(grads, f"{folder}/rtdetr_grads/model.safetensors")
    denoising_outputs(model, pixels, labels, out)


def denoising_outputs(model, pixels: torch.Tensor, labels: list, out: dict) -> None:
    """Training mode with 6 denoising queries (2 groups for the batch's 3 objects): the
    noise drawn (``dn_labels``, the labels reaching ``denoising_class_embed``;
    ``dn_reference``, the noised boxes in logit space), the loss and its ``loss_dict``
    (``dn_*``) and the gradient of ``denoising_class_embed`` (``dn_embed_grad``)."""
    from transformers.models.rt_detr import modeling_rt_detr

    recorded = {}
    make = modeling_rt_detr.get_contrastive_denoising_training_group

    def record(*args, **kwargs):
        made = make(*args, **kwargs)
        recorded["reference"] = made[1].detach().numpy()
        return made

    embed = model.model.denoising_class_embed
    hook = embed.register_forward_hook(
        lambda module, inputs, output: recorded.update(labels=inputs[0].numpy()))
    modeling_rt_detr.get_contrastive_denoising_training_group = record
    try:
        model.config.num_denoising = 6
        model.zero_grad()
        torch.manual_seed(5)
        result = model(pixel_values=pixels, labels=labels)
        result.loss.backward()
    finally:
        modeling_rt_detr.get_contrastive_denoising_training_group = make
        hook.remove()
    out["dn_labels"] = recorded["labels"].astype("int32")
    out["dn_reference"] = recorded["reference"]
    out["dn_loss"] = result.loss.detach().numpy()
    for name, value in result.loss_dict.items():
        out[f"dn_{name}"] = value.detach().numpy()
    out["dn_embed_grad"] = embed.weight.grad.detach().numpy()


def main(folder: str) -> None:
    torch.manual_seed(0)
    batch, height, width = IMAGES
    pixels = torch.randn(batch, 3, height, width)
    model, result, smallest = run(SEED, pixels)
    model.save_pretrained(f"{folder}/rtdetr")
    out = {"images": nhwc(pixels), "topk_margin": np.float32(smallest)}
    with torch.no_grad():
        for i, feature in enumerate(model.model.backbone.model(pixels).feature_maps):
            out[f"backbone_{i}"] = nhwc(feature)
    for i, level in enumerate(result.encoder_last_hidden_state):
        out[f"encoder_{i}"] = nhwc(level)
    for key in ("enc_outputs_class", "enc_outputs_coord_logits", "enc_topk_logits",
                "enc_topk_bboxes", "init_reference_points", "logits", "pred_boxes",
                "intermediate_logits", "intermediate_reference_points"):
        out[key] = getattr(result, key).numpy()

    from transformers import RTDetrImageProcessorPil

    sizes = [(480, 640), (300, 200)]
    top = -np.sort(-torch.sigmoid(result.logits).flatten(1).numpy(), axis=1)  # (B, Q * C)
    threshold = float(top[0, 4:6].mean())  # the first image keeps 5 of its 10 detections
    detections = RTDetrImageProcessorPil().post_process_object_detection(
        result, threshold=threshold, target_sizes=sizes)
    count = max(len(d["scores"]) for d in detections)
    out.update(threshold=np.float32(threshold), target_sizes=np.array(sizes, "int32"),
               det_count=np.array([len(d["scores"]) for d in detections], "int32"),
               det_scores=np.zeros((batch, count), "float32"),
               det_labels=np.zeros((batch, count), "int32"),
               det_boxes=np.zeros((batch, count, 4), "float32"))
    for i, d in enumerate(detections):
        n = len(d["scores"])
        out["det_scores"][i, :n] = d["scores"].numpy()
        out["det_labels"][i, :n] = d["labels"].numpy()
        out["det_boxes"][i, :n] = d["boxes"].numpy()

    processor_outputs(model, f"{folder}/rtdetr", out)
    v2_outputs(folder, pixels, out)
    for name in VARIANTS:
        backbone_variant(folder, name, pixels, out)
    loss_outputs(model, folder, pixels, out)
    np.savez(f"{folder}/expected.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1])
