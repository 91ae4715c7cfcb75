"""What the LiteRT and ONNX detectors read: the detector of ``--model`` and their inputs.

`find_source` finds a detector's ``model.keras``, class names, resize and training data;
`prepare_image` makes the fixed-size inputs of one decoded image (the step that cannot be in
the files: LiteRT has no kernels for decoding or TensorFlow's antialiased resize), and
`representative_images` the ``int8-full`` calibration set. `vision.export.litert_onnx` writes the
files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np

__all__ = ["CALIBRATION_IMAGES", "DetectorSource", "find_source", "prepare_image",
           "representative_images"]

CALIBRATION_IMAGES = 100  # `int8-full`: training images the activation ranges are taken from
_CLASSES_FILE = "classes.json"
_MODEL_FILE = "model.keras"
_PREPROCESSING_FILE = "preprocessing.json"  # `vision.export.load.PREPROCESSING_FILE`


@dataclasses.dataclass(frozen=True)
class DetectorSource:
    """What a writer reads of a detector: its Keras model, class names, sizes and data.

    Attributes:
        model_file: the ``model.keras``.
        classes_file: the export's ``classes.json``.
        image_size, max_size: the export's resize (shorter side, cap on the longer side).
        input_size: S, the side of the fixed input.
        data: the run's ``--data`` spec, or None when unknown.
        fixed: a fixed-size detector's preprocessing (RT-DETR: the export's
            ``preprocessing.json``, `vision.data.augment.FixedSize`'s fields), or None. Its
            input is ``height`` x ``width``, every image resized to it; ``image_size``,
            ``max_size`` and ``input_size`` are then the longer side.
    """

    model_file: pathlib.Path
    classes_file: pathlib.Path
    image_size: int
    max_size: int
    input_size: int
    data: str | None
    fixed: dict | None = None

    @property
    def input_shape(self) -> tuple[int, int]:
        """``(height, width)`` of the files' input."""
        if self.fixed is not None:
            return self.fixed["height"], self.fixed["width"]
        return self.input_size, self.input_size

    def settings(self) -> dict:
        if self.fixed is not None:
            return {"input_size": None, "input_height": self.fixed["height"],
                    "input_width": self.fixed["width"], "rescale": self.fixed["rescale"],
                    "mean": self.fixed["mean"], "std": self.fixed["std"]}
        return {"input_size": self.input_size, "image_size": self.image_size,
                "max_size": self.max_size}


def find_source(model: str | os.PathLike, input_size: int | None = None) -> DetectorSource:
    """The detector of ``--model``: a finished ``train_detr.py`` work directory, its
    ``export/``, or a ``tfx-convert-detr`` directory (``model.keras`` beside ``export/``).

    The resize comes from the run's ``metrics.json`` (its ``config``); without one (a
    converted checkpoint) ``input_size`` is needed and is also the resize. ``input_size``
    defaults to the longer side's cap, so that every image fits without shrinking further.

    Raises:
        ValueError: ``model`` is no detector, or a size is missing or out of range.
    """
    path = pathlib.Path(model)
    if not path.exists():
        raise ValueError(f"--model {model}: no such file or directory")
    found = [d for d in (path, path.parent) if (d / _MODEL_FILE).is_file()
             and (d / "export" / _CLASSES_FILE).is_file()]
    if not found:
        if (path / "translator.json").is_file() or (path / "export" / "translator.json").is_file():
            raise ValueError(f"--model {model}: a translator; LiteRT and ONNX take the detector "
                             "(translators: --format ctranslate2)")
        raise ValueError(f"--model {model}: no detector here (expected a train_detr.py work "
                         f"directory, its export/, or a tfx-convert-detr directory: "
                         f"{_MODEL_FILE} beside export/{_CLASSES_FILE})")
    root = found[0]
    metrics_file = root / "metrics.json"
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) \
        if metrics_file.is_file() else {}
    config, data = metrics.get("config") or {}, (metrics.get("data") or {}).get("spec")
    fixed_file = root / "export" / _PREPROCESSING_FILE
    if fixed_file.is_file():  # a fixed-size detector (RT-DETR: converted, or a run's)
        fixed = json.loads(fixed_file.read_text(encoding="utf-8"))
        if input_size is not None:
            raise ValueError(f"--input-size {input_size}: {model} resizes every image to "
                             f"{fixed['height']}x{fixed['width']} ({fixed_file}); leave "
                             "--input-size out")
        side = max(fixed["height"], fixed["width"])
        return DetectorSource(root / _MODEL_FILE, root / "export" / _CLASSES_FILE, side, side,
                              side, data, fixed)
    if input_size is not None and (isinstance(input_size, bool) or int(input_size) < 8):
        raise ValueError(f"--input-size {input_size}: must be an integer of at least 8")
    if "image_size" in config:
        image_size, max_size = int(config["image_size"]), int(config["max_image_size"])
    elif input_size is not None:
        image_size = max_size = int(input_size)
    else:
        raise ValueError(f"--model {model}: {metrics_file} does not record the image size the "
                         "detector was trained at; give --input-size")
    size = max_size if input_size is None else int(input_size)
    return DetectorSource(root / _MODEL_FILE, root / "export" / _CLASSES_FILE, image_size,
                          max_size, size, data)


def prepare_image(image, settings: dict) -> tuple[np.ndarray, np.ndarray]:
    """The inputs of the LiteRT and ONNX detectors for one decoded image.

    The image is resized as the ``Detector`` export resizes it (`tf.image.resize`, bilinear,
    antialiased; shorter side ``image_size``, longer side at most ``max_size``, both capped at
    ``input_size``) and zero-padded to ``input_size`` squared; for a fixed-size detector
    (``input_height`` and ``input_width`` in the settings) resized to that size, unpadded.

    Args:
        image: ``(H, W, 3)`` uint8 RGB (e.g. ``np.asarray(PIL.Image.open(f).convert("RGB"))``).
        settings: the ``settings.json`` written beside the model (``input_size``,
            ``image_size``, ``max_size``).

    Returns:
        ``(images (S, S, 3) float32 pixel values 0..255, mask (S, S) float32)`` (a fixed
        size: ``(H, W, 3)`` and ``(H, W)``): stack them into the ``images`` and ``mask``
        inputs of a batch.
    """
    import tensorflow as tf

    from vision.data.augment import resized_shape

    image = tf.convert_to_tensor(image)
    if image.dtype != tf.uint8 or image.shape.rank != 3 or image.shape[-1] != 3:
        raise ValueError("`image` must be uint8 of shape (H, W, 3). Received: "
                         f"dtype={image.dtype.name}, shape={tuple(image.shape)}")
    if settings.get("input_height") is not None:  # a fixed size: resized, never padded
        shape = [int(settings["input_height"]), int(settings["input_width"])]
        resized = tf.image.resize(image, shape, antialias=True).numpy()
        return resized.astype(np.float32), np.ones(shape, np.float32)
    side = int(settings["input_size"])
    cap = min(int(settings["max_size"]), side)
    height, width = resized_shape(tf.shape(image)[0], tf.shape(image)[1],
                                  min(int(settings["image_size"]), cap), cap)
    resized = tf.image.resize(image, tf.stack([height, width]), antialias=True).numpy()
    pixels = np.zeros((side, side, 3), np.float32)
    mask = np.zeros((side, side), np.float32)
    pixels[:resized.shape[0], :resized.shape[1]] = resized
    mask[:resized.shape[0], :resized.shape[1]] = 1.0
    return pixels, mask


def representative_images(source: DetectorSource, count: int = CALIBRATION_IMAGES
                          ) -> list[dict[str, np.ndarray]]:
    """``count`` inputs (batch 1) from the start of the run's training split, for
    ``int8-full`` calibration.

    Raises:
        ValueError: the run's data is unknown (no ``metrics.json`` names it).
    """
    if source.data is None:
        raise ValueError("--precision int8-full calibrates on the run's training data, and "
                         f"{source.model_file.parent} has no metrics.json naming it; use a "
                         "train_detr.py work directory")
    from vision.data.sources import load_source

    records = load_source(source.data, log=lambda *_: None).records("train").take(count)
    inputs = []
    for record in records.as_numpy_iterator():
        pixels, mask = prepare_image(record["image"], source.settings())
        inputs.append({"images": pixels[None], "mask": mask[None]})
    return inputs
