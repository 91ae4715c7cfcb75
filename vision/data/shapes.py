"""The `embedded` detection data: synthetic circles, squares and triangles, boxes known exactly.

Each image has a uniformly coloured background with integer noise and 0 to `max_objects` solid
shapes of random class, colour, size and position. Shapes never overlap (their cells keep a
2-pixel gap), so every shape is fully visible and its box is exact: the tight box of the drawn
pixels. A pixel `(row, col)` covers `[col, col + 1) x [row, row + 1)`, so a shape drawn on
columns 3..9 has `x0 = 3` and `x1 = 10` (the COCO convention). Each shape's colour differs from
the background colour by at least 100 in one channel, far beyond the noise (±`noise`).

Everything is deterministic: image `index` of split `split` under `seed` is drawn from its own
random stream, so it is the same whatever other images are generated and in whatever order, and
the "train" and "valid" splits come from different streams.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfx_transformer import checks

__all__ = ["CLASS_NAMES", "SPLITS", "ShapesGenerator"]

CLASS_NAMES = ("circle", "square", "triangle")
SPLITS = ("train", "valid")

_GAP = 2  # Free pixels kept between the cells of two shapes.
_MIN_SHAPE = 8  # Smallest shape cell, in pixels.
_PLACEMENT_TRIES = 30


@dataclasses.dataclass(frozen=True)
class ShapesGenerator:
    """Generates the synthetic shapes images of one split.

    Attributes:
        seed: Seed of the whole data set.
        split: "train" or "valid"; the two splits are drawn from different random streams.
        image_size: Image height and width in pixels (the largest when sizes vary).
        min_image_size: If set, each image's height and width are drawn independently from
            `[min_image_size, image_size]`; if None every image is `image_size` square.
        max_objects: Most shapes per image; each image has a uniform 0..`max_objects` shapes
            (fewer when no free place is found for one).
        noise: Background noise amplitude: integers uniform in `[-noise, noise]` per channel.

    Example:
        >>> example = ShapesGenerator(seed=1).example(0)
        >>> example["image"].shape, example["boxes"].shape == (len(example["labels"]), 4)
        ((128, 128, 3), True)
    """

    seed: int = 0
    split: str = "train"
    image_size: int = 128
    min_image_size: int | None = None
    max_objects: int = 6
    noise: int = 20

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}. Received: split={self.split!r}")
        checks.non_negative_int("seed", self.seed)
        checks.non_negative_int("max_objects", self.max_objects)
        checks.integer("noise", self.noise, minimum=0, maximum=100)
        checks.integer("image_size", self.image_size, minimum=2 * _MIN_SHAPE)
        checks.integer("min_image_size", self.min_image_size, minimum=2 * _MIN_SHAPE,
                       maximum=self.image_size, optional=True)  # at most image_size

    def _rng(self, index: int) -> np.random.Generator:
        index = checks.non_negative_int("index", index)
        return np.random.default_rng([int(self.seed), SPLITS.index(self.split), index])

    def _layout(self, rng: np.random.Generator) -> tuple[int, int, list[tuple[int, int, int, int]]]:
        """Image size and the shapes' `(class, x, y, cell size)`, drawing no pixel."""
        if self.min_image_size is None:
            height = width = self.image_size
        else:
            height, width = (int(v) for v in rng.integers(self.min_image_size,
                                                           self.image_size + 1, size=2))
        short = min(height, width)
        smallest = max(_MIN_SHAPE, int(0.12 * short))
        largest = max(smallest, int(0.4 * short))
        shapes: list[tuple[int, int, int, int]] = []
        for _ in range(int(rng.integers(0, self.max_objects + 1))):
            for _ in range(_PLACEMENT_TRIES):
                size = int(rng.integers(smallest, largest + 1))
                x = int(rng.integers(0, width - size + 1))
                y = int(rng.integers(0, height - size + 1))
                if all(
                    x >= ox + osize + _GAP or ox >= x + size + _GAP
                    or y >= oy + osize + _GAP or oy >= y + size + _GAP
                    for _, ox, oy, osize in shapes
                ):
                    shapes.append((int(rng.integers(0, len(CLASS_NAMES))), x, y, size))
                    break
        return height, width, shapes

    def num_objects(self, index: int) -> int:
        """The number of shapes in image `index`, without drawing it (fast)."""
        return len(self._layout(self._rng(index))[2])

    def example(self, index: int) -> dict[str, np.ndarray]:
        """Draws image `index`.

        Args:
            index: Image number, >= 0.

        Returns:
            A dict with "image" (H, W, 3) uint8, "boxes" (N, 4) float32 absolute pixel
            `(x0, y0, x1, y1)` and "labels" (N,) int32 indices into `CLASS_NAMES`.
        """
        rng = self._rng(index)
        height, width, shapes = self._layout(rng)
        background = rng.integers(0, 256, size=3)
        noise = rng.integers(-self.noise, self.noise + 1, size=(height, width, 3))
        image = np.clip(background + noise, 0, 255).astype(np.uint8)
        boxes = np.zeros((len(shapes), 4), np.float32)
        labels = np.zeros((len(shapes),), np.int32)
        for i, (label, x, y, size) in enumerate(shapes):
            mask = _shape_mask(label, size, rng)
            rows, cols = np.nonzero(mask)
            image[y : y + size, x : x + size][mask] = _shape_colour(background, rng)
            boxes[i] = (x + cols.min(), y + rows.min(), x + cols.max() + 1, y + rows.max() + 1)
            labels[i] = label
        return {"image": image, "boxes": boxes, "labels": labels}

    def generate(self, num_images: int) -> list[dict[str, np.ndarray]]:
        """Images `0 .. num_images - 1`, each as returned by `example`."""
        return [self.example(i) for i in range(num_images)]


def _shape_colour(background: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random colour at least 100 away from `background` in one random channel."""
    colour = rng.integers(0, 256, size=3)
    channel = int(rng.integers(0, 3))
    level = int(background[channel])
    colour[channel] = rng.integers(level + 100, 256) if level < 128 else rng.integers(0, level - 99)
    return colour.astype(np.uint8)


def _shape_mask(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A (size, size) bool mask of the shape, tested at pixel centres."""
    centres = np.arange(size, dtype=np.float32) + 0.5
    px, py = centres[None, :], centres[:, None]  # (1, size) and (size, 1): broadcast to a grid
    half = size / 2.0
    if CLASS_NAMES[label] == "circle":
        return (px - half) ** 2 + (py - half) ** 2 <= half**2
    if CLASS_NAMES[label] == "square":
        return np.ones((size, size), bool)
    # Equilateral triangle inscribed in the cell's circle, randomly rotated.
    angles = rng.uniform(0, 2 * np.pi) + np.array([0.0, 2.0, 4.0]) * np.pi / 3
    vx, vy = half + half * np.cos(angles), half + half * np.sin(angles)
    inside = np.ones((size, size), bool)
    for a, b in ((0, 1), (1, 2), (2, 0)):
        # Same side of edge a->b as the centre (the vertices are counter-clockwise in y-down).
        cross = (vx[b] - vx[a]) * (py - vy[a]) - (vy[b] - vy[a]) * (px - vx[a])
        inside &= cross >= 0
    return inside
