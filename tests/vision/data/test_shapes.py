"""Tests of the synthetic shapes data (`vision.data.shapes`)."""

import collections

import numpy as np
import pytest

from vision.data.shapes import CLASS_NAMES, ShapesGenerator


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in ("image", "boxes", "labels"))


def test_deterministic_by_seed_split_and_index():
    gen = ShapesGenerator(seed=7)
    first = gen.generate(6)
    again = ShapesGenerator(seed=7).generate(6)
    assert all(_same(a, b) for a, b in zip(first, again))
    assert _same(gen.example(4), first[4])  # Independent of the images drawn before it.
    other_seed = ShapesGenerator(seed=8).generate(6)
    valid = ShapesGenerator(seed=7, split="valid").generate(6)
    assert not any(_same(a, b) for a, b in zip(first, other_seed))
    assert not any(_same(a, b) for a, b in zip(first, valid))


def test_boxes_are_tight_around_the_drawn_shape():
    gen = ShapesGenerator(seed=3)
    fills = collections.defaultdict(list)
    for index in range(40):
        example = gen.example(index)
        image = example["image"].astype(np.int32)
        height, width = image.shape[:2]
        for box, label in zip(example["boxes"], example["labels"]):
            x0, y0, x1, y1 = (int(v) for v in box)
            np.testing.assert_array_equal(box, [x0, y0, x1, y1])  # whole pixels
            assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
            inside = image[y0:y1, x0:x1].reshape(-1, 3)
            colours, counts = np.unique(inside, axis=0, return_counts=True)
            colour = colours[counts.argmax()]  # the solid shape colour
            # Look one pixel beyond the box: the shape's pixels span exactly the box.
            wy0, wx0 = max(y0 - 1, 0), max(x0 - 1, 0)
            window = np.all(image[wy0 : y1 + 1, wx0 : x1 + 1] == colour, axis=-1)
            rows, cols = np.nonzero(window)
            assert (cols.min() + wx0, rows.min() + wy0) == (x0, y0)
            assert (cols.max() + wx0 + 1, rows.max() + wy0 + 1) == (x1, y1)
            # Background pixels differ from the shape by far more than the noise.
            others = inside[np.any(inside != colour, axis=-1)]
            if len(others):
                assert np.abs(others - colour).max(axis=-1).min() > 40
            fills[CLASS_NAMES[label]].append(counts.max() / inside.shape[0])
    assert min(fills["square"]) == 1.0
    assert 0.65 < np.mean(fills["circle"]) < 0.85  # pi / 4 = 0.785
    assert 0.3 < np.mean(fills["triangle"]) < 0.65  # equilateral, rotated: ~0.4 - 0.5


def test_counts_classes_and_variable_sizes():
    gen = ShapesGenerator(seed=1, image_size=96, min_image_size=48)
    examples = gen.generate(60)
    counts = [len(e["labels"]) for e in examples]
    assert min(counts) == 0 and max(counts) == 6
    assert counts == [gen.num_objects(i) for i in range(60)]
    assert set(np.concatenate([e["labels"] for e in examples]).tolist()) == {0, 1, 2}
    sizes = {e["image"].shape for e in examples}
    assert len(sizes) > 10
    assert all(48 <= h <= 96 and 48 <= w <= 96 and c == 3 for h, w, c in sizes)
    assert all(e["image"].dtype == np.uint8 and e["boxes"].dtype == np.float32 for e in examples)
    assert all(e["labels"].dtype == np.int32 for e in examples)
    fixed = ShapesGenerator(seed=1).example(0)["image"]
    assert fixed.shape == (128, 128, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"split": "test"}, "split="),
        ({"image_size": 8}, "image_size"),
        ({"min_image_size": 200}, "min_image_size=200"),
        ({"max_objects": -1}, "max_objects=-1"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShapesGenerator(**kwargs)
