"""The detector for runtimes without TensorFlow: LiteRT (``.tflite``) and ONNX files.

`write_litert` and `write_onnx` are the ``litert`` and ``onnx`` writers of ``tfx-export``
(entry-point group ``tfx_transformer.commands.export``). Each writes a directory OUT::

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

A fixed-size detector (a converted RT-DETR: the export's ``preprocessing.json``) takes
``(B, H, W, 3)`` of its own size instead, every image resized to it whatever its aspect ratio
and never padded (``mask`` all 1); ``settings.json`` gives ``input_height``, ``input_width``
and ``input_size`` null.

Normalization, the model and post-processing (`vision.modeling.postprocess`, or the model's
own ``postprocess``) are in the graph; decoding and the antialiased resize are not (LiteRT has
no kernels for them). An image whose resized size is S x S needs no padding and gets the
export's detections; a padded one gets what the export gives it in a batch with a larger image
(DETR pads batches so).

LiteRT: builtin operators only (no Flex), batch fixed (1 unless asked), in ``float32``,
``float16`` (weights), ``int8`` (dynamic range: int8 weights) or ``int8-full`` (int8 weights
and activations of the convolutions and dense layers, calibrated on images of the run's own
training data; what stays float, by model: `vision.export.quantization`). ONNX: opset 17,
dynamic batch, converted by tf2onnx, in ``float32`` or ``int8`` (onnxruntime's dynamic
quantization; RT-DETR's query selection stays float).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from vision.export.inputs import (
    CALIBRATION_IMAGES,
    DetectorSource,
    find_source,
    prepare_image,
    representative_images,
)
from vision.export.quantization import RTDETR_FLOAT_OPS, litert_float_parts, onnx_float_nodes

__all__ = ["CALIBRATION_IMAGES", "FILES", "PRECISIONS", "RTDETR_FLOAT_OPS", "SETTINGS_FILE",
           "DetectorConverter", "DetectorSource", "find_source", "prepare_image",
           "representative_images", "run_once", "write_litert", "write_onnx"]

FILES = {"litert": "detector.tflite", "onnx": "detector.onnx"}
PRECISIONS = {"litert": ("float32", "float16", "int8", "int8-full"),
              "onnx": ("float32", "int8")}
SETTINGS_FILE = "settings.json"
ONNX_OPSET = 17
# What writing and checking each format imports (the module names).
RUNTIMES = {"litert": ("ai_edge_litert",), "onnx": ("tf2onnx", "onnxruntime")}
_CLASSES_FILE = "classes.json"


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
        self._float32: bytes | None = None  # written once (int8-full reads its tensor names)

    def function(self, batch_size: int | None):
        """The graph as a `tf.function` of ``images`` and ``mask`` (batch ``batch_size``)."""
        import tensorflow as tf

        from vision.data.augment import normalize_image
        from vision.export.load import OUTPUT_KEYS
        from vision.modeling.postprocess import postprocess

        (height, width), model = self.source.input_shape, self.model
        specs = [tf.TensorSpec([batch_size, height, width, 3], tf.float32, name="images"),
                 tf.TensorSpec([batch_size, height, width], tf.float32, name="mask")]
        fixed = self.source.fixed

        def scale(images, mask):
            if fixed is None:  # DETR: normalized; the padding is 0, as batched
                return normalize_image(images) * mask[..., None]
            pixels = images * fixed["rescale"]  # RT-DETR: `FixedSize`'s scaling, no padding
            if fixed["mean"] is not None:
                pixels = (pixels - tf.constant(fixed["mean"])) / tf.constant(fixed["std"])
            return pixels

        # A model with its own post-processing (RT-DETR's sigmoid scores) has `postprocess`.
        post_fn = getattr(model, "postprocess", postprocess)

        @tf.function(input_signature=specs)
        def detect(images, mask):
            outputs = model({"images": scale(images, mask), "mask": mask > 0.5},
                            training=False)
            post = post_fn(outputs, tf.ones([tf.shape(images)[0], 2]))  # fractions
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
            from tfx_transformer.saved_model import write_saved_model

            self._saved = tempfile.mkdtemp(prefix="tfx-litert-")
            write_saved_model(self._saved, self.model,
                              [("serving_default", self.function(self.batch_size), None)])
        return self._saved

    def litert(self, precision: str, calibration: list[dict] | None = None) -> bytes:
        """The ``.tflite`` of ``precision`` (`PRECISIONS`), builtin operators only;
        ``int8-full`` needs ``calibration`` (`representative_images`)."""
        import tensorflow as tf

        _check_precision("litert", precision)
        if precision == "float32" and self._float32 is not None:
            return self._float32
        converter = tf.lite.TFLiteConverter.from_saved_model(self._saved_model(),
                                                             signature_keys=["serving_default"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if precision != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if precision == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if precision != "int8-full":
            data = converter.convert()
            if precision == "float32":
                self._float32 = data
            return data
        if not calibration:
            raise ValueError("--precision int8-full needs calibration images")
        # Calibrated int8 activations in the convolutions and dense layers (the weights'
        # products), float in attention (its two activation-by-activation products, mask
        # and softmax) and in divisions. Quantizing attention too halves the trained tiny
        # detector's AP50 (experiments/README.md); and the sine position embedding divides by
        # a padded row's or column's pixel count plus 1e-6, which int8 holds as exactly zero
        # and LiteRT's int8 division refuses at run time.
        size = self.batch_size  # the calibration images in batches of the file's size
        batches = [{key: np.concatenate([item[key] for item in calibration[i:i + size]])
                    for key in calibration[0]} for i in range(0, len(calibration) - size + 1, size)]
        converter.representative_dataset = lambda: iter(batches)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                               tf.lite.OpsSet.TFLITE_BUILTINS]
        ops, nodes = litert_float_parts(self.model, lambda: self.litert("float32"))
        quantizer = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=lambda: iter(batches),
            debug_options=tf.lite.experimental.QuantizationDebugOptions(
                denylisted_ops=ops, denylisted_nodes=nodes))
        return quantizer.get_nondebug_quantized_model()

    def onnx(self, precision: str) -> bytes:
        """The ONNX model (opset `ONNX_OPSET`, dynamic batch) of ``precision``."""
        _check_precision("onnx", precision)
        import tf2onnx

        detect = self.function(None)
        proto, _ = tf2onnx.convert.from_function(detect, input_signature=detect.input_signature,
                                                 opset=ONNX_OPSET,
                                                 custom_op_handlers={"Erfc": (_erfc, [])})
        data = proto.SerializeToString()
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with tempfile.TemporaryDirectory(prefix="tfx-onnx-") as tmp:
                plain, quantized = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "q.onnx")
                with open(plain, "wb") as f:
                    f.write(data)
                quantize_dynamic(plain, quantized, weight_type=QuantType.QInt8,
                                 nodes_to_exclude=onnx_float_nodes(self.model, proto))
                with open(quantized, "rb") as f:
                    data = f.read()
        return data


def _erfc(ctx, node, name, args) -> None:
    """tf2onnx's handler of TensorFlow's ``Erfc`` (in exact GELU: RT-DETR's encoder), which
    ONNX lacks: ``1 - Erf(x)``."""
    node.type = "Erf"
    one = ctx.make_const(f"{node.name}/one", np.array(1, dtype=np.float32))
    ctx.insert_new_node_on_output("Sub", node.output[0], name=f"{node.name}/erfc",
                                  inputs=[one.output[0], node.output[0]])


def _check_precision(kind: str, precision: str) -> None:
    if precision not in PRECISIONS[kind]:
        raise ValueError(f"--precision {precision}: the {kind} detector takes "
                         f"{', '.join(PRECISIONS[kind])}")


def run_once(kind: str, data: bytes, input_shape: tuple[int, int], batch_size: int = 1
             ) -> dict:
    """Runs a written file once on blank images of ``input_shape`` (height, width) with its
    runtime: LiteRT's interpreter (which has no Flex delegate: a TensorFlow kernel in the file
    fails here) or ONNX Runtime. Returns the outputs."""
    images = np.zeros((batch_size, *input_shape, 3), np.float32)
    mask = np.ones((batch_size, *input_shape), np.float32)
    if kind == "litert":
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter(model_content=data).get_signature_runner()(images=images, mask=mask)
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, {"images": images, "mask": mask})))


def _write(kind: str, model, out, precision: str, input_size: int | None) -> dict:
    """Writes ``out`` (which must not exist) through a temporary directory beside it."""
    _check_precision(kind, precision)
    out = pathlib.Path(out)
    if out.exists():
        raise ValueError(f"--out {out}: already exists; choose a new path")
    for runtime in RUNTIMES[kind]:
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
    run_once(kind, data, source.input_shape)  # what is written runs (LiteRT: without Flex)
    settings = {"format": kind, "precision": precision, **source.settings(),
                "batch_size": 1 if kind == "litert" else None,
                "calibration_images": len(calibration) if calibration else None,
                "source": str(source.model_file.parent.resolve())}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # as a new directory (mkdtemp makes it private)
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

