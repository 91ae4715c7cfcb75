"""The detector for runtimes without TensorFlow: LiteRT (``.tflite``) and ONNX files.

`write_litert` and `write_onnx` are the ``litert`` and ``onnx`` writers of ``tfx-export``
(entry-point group ``tfx_transformer.formats``). Each writes a directory OUT::

    OUT/detector.tflite or OUT/detector.onnx   the model
    OUT/classes.json                           label i is class_names[i] (the export's file)
    OUT/settings.json                          `SETTINGS_FILE`: format, precision, sizes

Both files hold one graph with a fixed image size S (``input_size``):

- inputs ``images`` float32 ``(B, S, S, 3)``: RGB pixel values 0..255 of an image resized
  as the export resizes (shorter side ``image_size``, longer side at most ``max_size``, both
  capped at S) and zero-padded at the bottom and right; ``mask`` float32 ``(B, S, S)``: 1 on
  the image's pixels, 0 on the padding. `prepare_image` makes both from a decoded image.
- outputs, for every query: ``boxes`` float32 ``(B, Q, 4)`` xyxy as fractions of the image's
  width and height (multiply by ``(W, H, W, H)`` of the original image), ``scores`` float32
  ``(B, Q)``, ``labels`` int32 ``(B, Q)``.

Normalization, the model and post-processing (`vision.modeling.postprocess`) are in the
graph; decoding and the antialiased resize are not (LiteRT has no kernels for them). An image
whose resized size is S x S needs no padding and gets the export's detections; a padded one
gets what the export gives it in a batch with a larger image (DETR pads batches so).

LiteRT: builtin operators only (no Flex), batch fixed (1 unless asked), in ``float32``,
``float16`` (weights), ``int8`` (dynamic range: int8 weights) or ``int8-full`` (weights and
activations, calibrated on images of the run's own training data). ONNX: opset 17, dynamic
batch, converted by tf2onnx, in ``float32`` or ``int8`` (onnxruntime's dynamic quantization).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

__all__ = ["FILES", "PRECISIONS", "SETTINGS_FILE", "DetectorConverter", "DetectorSource",
           "find_source", "prepare_image", "representative_images", "write_litert",
           "write_onnx"]

FILES = {"litert": "detector.tflite", "onnx": "detector.onnx"}
PRECISIONS = {"litert": ("float32", "float16", "int8", "int8-full"),
              "onnx": ("float32", "int8")}
SETTINGS_FILE = "settings.json"
ONNX_OPSET = 17
CALIBRATION_IMAGES = 100  # `int8-full`: training images the activation ranges are taken from
_CLASSES_FILE = "classes.json"
_MODEL_FILE = "model.keras"


@dataclasses.dataclass(frozen=True)
class DetectorSource:
    """What a writer reads of a detector: its Keras model, class names, sizes and data.

    Attributes:
        model_file: the ``model.keras``.
        classes_file: the export's ``classes.json``.
        image_size, max_size: the export's resize (shorter side, cap on the longer side).
        input_size: S, the side of the fixed input.
        data: the run's ``--data`` spec, or None when unknown.
    """

    model_file: pathlib.Path
    classes_file: pathlib.Path
    image_size: int
    max_size: int
    input_size: int
    data: str | None

    def settings(self) -> dict:
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
    ``input_size``) and zero-padded to ``input_size`` squared.

    Args:
        image: ``(H, W, 3)`` uint8 RGB (e.g. ``np.asarray(PIL.Image.open(f).convert("RGB"))``).
        settings: the ``settings.json`` written beside the model (``input_size``,
            ``image_size``, ``max_size``).

    Returns:
        ``(images (S, S, 3) float32 pixel values 0..255, mask (S, S) float32)``: stack them
        into the ``images`` and ``mask`` inputs of a batch.
    """
    import tensorflow as tf

    from vision.data.augment import resized_shape

    image = tf.convert_to_tensor(image)
    if image.dtype != tf.uint8 or image.shape.rank != 3 or image.shape[-1] != 3:
        raise ValueError("`image` must be uint8 of shape (H, W, 3). Received: "
                         f"dtype={image.dtype.name}, shape={tuple(image.shape)}")
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


class DetectorConverter:
    """The detector of a `DetectorSource` as LiteRT or ONNX bytes; the Keras model is loaded
    and traced once for any number of conversions. Use as a context manager (a temporary
    SavedModel is removed at the end)."""

    def __init__(self, source: DetectorSource, batch_size: int = 1):
        import keras

        import vision  # noqa: F401  (registers the model classes for load_model)

        self.source, self.batch_size = source, batch_size
        self.model = keras.saving.load_model(source.model_file, compile=False)
        self._saved: str | None = None

    def function(self, batch_size: int | None):
        """The graph as a `tf.function` of ``images`` and ``mask`` (batch ``batch_size``)."""
        import tensorflow as tf

        from vision.data.augment import normalize_image
        from vision.modeling.postprocess import postprocess
        from vision.serving import OUTPUT_KEYS

        side, model = self.source.input_size, self.model
        specs = [tf.TensorSpec([batch_size, side, side, 3], tf.float32, name="images"),
                 tf.TensorSpec([batch_size, side, side], tf.float32, name="mask")]

        @tf.function(input_signature=specs)
        def detect(images, mask):
            pixels = normalize_image(images) * mask[..., None]  # the padding is 0, as batched
            outputs = model({"images": pixels, "mask": mask > 0.5}, training=False)
            post = postprocess(outputs, tf.ones([tf.shape(images)[0], 2]))  # fractions
            return {key: post[key] for key in OUTPUT_KEYS}

        return detect

    def __enter__(self) -> DetectorConverter:
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            shutil.rmtree(self._saved, ignore_errors=True)
            self._saved = None

    def _saved_model(self) -> str:
        """A SavedModel of `function` at the fixed batch: the LiteRT converter freezes its
        variables (converting the traced function directly leaves some unread)."""
        if self._saved is None:
            import keras

            self._saved = tempfile.mkdtemp(prefix="tfx-litert-")
            archive = keras.export.ExportArchive()
            archive.track(self.model)
            archive.add_endpoint(name="serving_default", fn=self.function(self.batch_size))
            archive.write_out(self._saved, verbose=False)
        return self._saved

    def litert(self, precision: str, calibration: list[dict] | None = None) -> bytes:
        """The ``.tflite`` of ``precision`` (`PRECISIONS`), builtin operators only;
        ``int8-full`` needs ``calibration`` (`representative_images`)."""
        import tensorflow as tf

        _check_precision("litert", precision)
        converter = tf.lite.TFLiteConverter.from_saved_model(self._saved_model(),
                                                             signature_keys=["serving_default"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if precision != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if precision == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if precision != "int8-full":
            return converter.convert()
        if not calibration:
            raise ValueError("--precision int8-full needs calibration images")
        # Calibrated int8 activations wherever LiteRT has int8 kernels, but the divisions
        # stay float: the sine position embedding divides by a padded column's or row's
        # zero count (plus 1e-6), which int8 holds as exactly zero and LiteRT's int8 DIV
        # refuses at run time.
        converter.representative_dataset = lambda: iter(calibration)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                               tf.lite.OpsSet.TFLITE_BUILTINS]
        quantizer = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=lambda: iter(calibration),
            debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=["DIV"]))
        return quantizer.get_nondebug_quantized_model()

    def onnx(self, precision: str) -> bytes:
        """The ONNX model (opset `ONNX_OPSET`, dynamic batch) of ``precision``."""
        _check_precision("onnx", precision)
        import tf2onnx

        detect = self.function(None)
        proto, _ = tf2onnx.convert.from_function(detect, input_signature=detect.input_signature,
                                                 opset=ONNX_OPSET)
        data = proto.SerializeToString()
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with tempfile.TemporaryDirectory(prefix="tfx-onnx-") as tmp:
                plain, quantized = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "q.onnx")
                with open(plain, "wb") as f:
                    f.write(data)
                quantize_dynamic(plain, quantized, weight_type=QuantType.QInt8)
                with open(quantized, "rb") as f:
                    data = f.read()
        return data


def _check_precision(kind: str, precision: str) -> None:
    if precision not in PRECISIONS[kind]:
        raise ValueError(f"--precision {precision}: the {kind} detector takes "
                         f"{', '.join(PRECISIONS[kind])}")


def _write(kind: str, model, out, precision: str, input_size: int | None) -> dict:
    """Writes ``out`` (which must not exist) through a temporary directory beside it."""
    _check_precision(kind, precision)
    out = pathlib.Path(out)
    if out.exists():
        raise ValueError(f"--out {out}: already exists; choose a new path")
    runtime = {"litert": "ai_edge_litert", "onnx": "tf2onnx"}[kind]
    try:
        __import__(runtime)
    except ImportError:
        raise ValueError(f"--format {kind}: {runtime} is not installed (pip install "
                         f"'tfx-transformer[test]')") from None
    source = find_source(model, input_size)
    calibration = representative_images(source) if precision == "int8-full" else None
    with DetectorConverter(source) as converter:
        data = converter.litert(precision, calibration) if kind == "litert" \
            else converter.onnx(precision)
    settings = {"format": kind, "precision": precision, **source.settings(),
                "batch_size": 1 if kind == "litert" else None,
                "calibration_images": len(calibration) if calibration else None,
                "source": str(source.model_file.parent.resolve())}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=out.parent))
    try:
        (tmp / FILES[kind]).write_bytes(data)
        shutil.copyfile(source.classes_file, tmp / _CLASSES_FILE)
        (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**settings, "files": sorted(p.name for p in out.iterdir())}


def write_litert(model: pathlib.Path, out: pathlib.Path, precision: str,
                 input_size: int | None) -> dict:
    """Writes the LiteRT detector ``out/detector.tflite`` with ``classes.json`` and
    ``settings.json`` (module docstring); returns the settings and the files written.

    Raises:
        ValueError: ``model`` is no detector, a precision LiteRT is not given here, a size
            out of range, ``out`` exists, or the runtime is not installed.
    """
    return _write("litert", model, out, precision, input_size)


def write_onnx(model: pathlib.Path, out: pathlib.Path, precision: str,
               input_size: int | None) -> dict:
    """Writes the ONNX detector ``out/detector.onnx`` with ``classes.json`` and
    ``settings.json`` (module docstring); returns the settings and the files written.

    Raises:
        ValueError: as `write_litert`.
    """
    return _write("onnx", model, out, precision, input_size)

