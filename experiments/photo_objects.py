"""A photo-like detection set: real objects pasted onto real photographs, as ``coco:`` data.

Everything comes from the images that scikit-image ships in its wheel (``skimage.data``; no
download): the backgrounds are random crops of eleven photographs and textures (astronaut,
brick, camera, coffee, grass, gravel, Hubble deep field, moon, page, retina, rocket), and the
objects are three classes cut out of others:

- ``cat``: Chelsea the cat's head (``skimage.data.chelsea``) under an elliptical mask;
- ``coin``: one of the 24 coins of ``skimage.data.coins``, each cut out along its own outline
  (Otsu threshold, connected regions), tinted gold or silver;
- ``horse``: the silhouette of ``skimage.data.horse`` filled with a crop of the coffee photo.

Each image is 112–160 px a side with 1–4 objects of 18–60 px (flipped, brightness ±20 %,
overlapping earlier ones by at most IoU 0.2); the box of an object is the tight box of its
mask. Images are JPEG (quality 90). The set is written once into a cache folder
(``~/.cache/tfx_transformer/photo_objects``, or ``$TFX_TRANSFORMER_CACHE``) and reused.

    python experiments/photo_objects.py            # prints the train and held-out specs
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from PIL import Image

CLASS_NAMES = ("cat", "coin", "horse")
VERSION = 1  # bump when the images change, so that the cache is rebuilt
_BACKGROUNDS = ("astronaut", "brick", "camera", "coffee", "grass", "gravel",
                "hubble_deep_field", "moon", "page", "retina", "rocket")


def cache_folder() -> str:
    root = os.environ.get("TFX_TRANSFORMER_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "tfx_transformer"))
    return os.path.join(root, f"photo_objects_v{VERSION}")


def _rgb(array: np.ndarray) -> np.ndarray:
    return np.repeat(array[..., None], 3, axis=-1) if array.ndim == 2 else array[..., :3]


def _cutouts() -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """``{class: [(rgb uint8 (h, w, 3), mask bool (h, w)), ...]}``."""
    import skimage.data
    from skimage import filters, measure, morphology

    cat = skimage.data.chelsea()[25:285, 110:340]
    yy, xx = np.mgrid[:cat.shape[0], :cat.shape[1]]
    ellipse = (((yy - cat.shape[0] / 2) / (cat.shape[0] / 2)) ** 2
               + ((xx - cat.shape[1] / 2) / (cat.shape[1] / 2)) ** 2) <= 1.0
    coins = skimage.data.coins()
    bright = morphology.opening(coins > filters.threshold_otsu(coins), morphology.disk(3))
    coin_cutouts = []
    for region in measure.regionprops(measure.label(bright)):
        if 600 <= region.area <= 6000:  # whole coins, not specks or merged pairs
            r0, c0, r1, c1 = region.bbox
            gray = coins[r0:r1, c0:c1].astype(np.float32)
            tint = np.array([1.0, 0.85, 0.45]) if len(coin_cutouts) % 2 else np.ones(3)
            coin_cutouts.append((np.clip(gray[..., None] * tint, 0, 255).astype(np.uint8),
                                 region.image))
    horse = skimage.data.horse()
    horse = ~horse if horse.mean() > 0.5 else horse  # True on the horse
    rows, cols = np.nonzero(horse)
    horse = horse[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    texture = np.asarray(Image.fromarray(skimage.data.coffee()[120:360, 150:450]).resize(
        (horse.shape[1], horse.shape[0])))
    return {"cat": [(cat, ellipse)], "coin": coin_cutouts, "horse": [(texture, horse)]}


def _iou(a, b) -> float:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0, x1 - x0) * max(0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def _image(rng, backgrounds, cutouts):
    width, height = (int(v) for v in rng.integers(112, 161, size=2))
    photo = backgrounds[rng.integers(len(backgrounds))]
    side = int(rng.integers(min(photo.shape[:2]) // 3, min(photo.shape[:2]) + 1))
    top = int(rng.integers(0, photo.shape[0] - side + 1))
    left = int(rng.integers(0, photo.shape[1] - side + 1))
    canvas = np.asarray(Image.fromarray(photo[top:top + side, left:left + side]).resize(
        (width, height), Image.BILINEAR)).astype(np.float32)
    boxes, labels = [], []
    for _ in range(int(rng.integers(1, 5))):
        label = int(rng.integers(len(CLASS_NAMES)))
        pixels, mask = cutouts[CLASS_NAMES[label]][rng.integers(len(cutouts[CLASS_NAMES[label]]))]
        scale = rng.uniform(18, 60) / max(mask.shape)
        size = (max(4, round(mask.shape[1] * scale)), max(4, round(mask.shape[0] * scale)))
        obj = np.asarray(Image.fromarray(pixels).resize(size, Image.BILINEAR), np.float32)
        obj_mask = np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize(
            size, Image.BILINEAR)) > 127
        if rng.random() < 0.5:
            obj, obj_mask = obj[:, ::-1], obj_mask[:, ::-1]
        obj = obj * rng.uniform(0.8, 1.2)
        if size[0] >= width or size[1] >= height or not obj_mask.any():
            continue
        x = int(rng.integers(0, width - size[0] + 1))
        y = int(rng.integers(0, height - size[1] + 1))
        rows, cols = np.nonzero(obj_mask)
        box = (x + cols.min(), y + rows.min(), x + cols.max() + 1, y + rows.max() + 1)
        if any(_iou(box, other) > 0.2 for other in boxes):
            continue
        region = canvas[y:y + size[1], x:x + size[0]]
        region[obj_mask] = obj[obj_mask]
        boxes.append(box)
        labels.append(label)
    return np.clip(canvas, 0, 255).astype(np.uint8), boxes, labels


def write_split(folder: str, count: int, seed: int) -> str:
    """Writes ``count`` images and ``annotations.json`` into ``folder``; returns the spec."""
    import skimage.data

    path = os.path.join(folder, "annotations.json")
    if os.path.exists(path):
        return f"coco:{folder}:{path}"
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    backgrounds = [_rgb(getattr(skimage.data, name)()) for name in _BACKGROUNDS]
    cutouts = _cutouts()
    images, annotations = [], []
    for index in range(count):
        image, boxes, labels = _image(rng, backgrounds, cutouts)
        name = f"{index:05d}.jpg"
        Image.fromarray(image).save(os.path.join(folder, name), quality=90)
        images.append({"id": index + 1, "file_name": name, "height": image.shape[0],
                       "width": image.shape[1]})
        for (x0, y0, x1, y1), label in zip(boxes, labels):
            annotations.append({"id": len(annotations) + 1, "image_id": index + 1,
                                "category_id": label + 1,
                                "bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                                "area": float((x1 - x0) * (y1 - y0)), "iscrowd": 0})
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(CLASS_NAMES)]
    with open(path + ".tmp", "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    os.replace(path + ".tmp", path)  # last, so that a cut-short build is rebuilt
    return f"coco:{folder}:{path}"


def photo_objects(train: int = 2000, held_out: int = 200) -> tuple[str, str]:
    """The ``coco:`` specs of the training and the held-out split (built on first use)."""
    root = cache_folder()
    return (write_split(os.path.join(root, f"train_{train}"), train, seed=1),
            write_split(os.path.join(root, f"held_out_{held_out}"), held_out, seed=2))


if __name__ == "__main__":
    print("\n".join(photo_objects()))
    sys.exit(0)
