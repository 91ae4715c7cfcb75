"""TensorFlow Serving's REST predict API: requests into arrays, arrays into answers.

The request and response formats of ``POST /v1/models/NAME:predict`` as TensorFlow Serving
defines them (and KServe's V1 protocol, the same API):

- row format: ``{"signature_name": S, "instances": [i1, i2, ...]}`` → ``{"predictions":
  [p1, p2, ...]}``. With one signature input an instance is that input's value (or an object
  naming it); with several, an object ``{input: value}``. With one output a prediction is its
  value, with several an object ``{output: value}``.
- columnar format: ``{"signature_name": S, "inputs": value | {input: value}}`` →
  ``{"outputs": value | {output: value}}``; each input has its own batch.
- strings: JSON strings (UTF-8), or ``{"b64": "..."}`` for binary data; string outputs whose
  name ends in ``_bytes`` are answered as ``{"b64": "..."}``.

Nothing here needs TensorFlow: a signature is a `SignatureSpec` (`signatures.py` reads them
from a SavedModel), arrays are NumPy's. Every problem of a request is a `RestError` with the
HTTP status and the message TensorFlow Serving would answer with (``{"error": message}``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

import numpy as np

from tfx_transformer.serving.images import pixel_problem
from tfx_transformer.serving.limits import Limits, RestError, check_json

__all__ = ["Limits", "PredictRequest", "RestError", "SignatureSpec", "TensorSpec",
           "check_json", "format_response", "parse_predict"]

SERVING = "serving_default"

# SignatureDef dtype names → NumPy dtypes (the ones a JSON request can carry).
_DTYPES = {
    "DT_STRING": object, "DT_BOOL": np.bool_, "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64,
    "DT_HALF": np.float16, "DT_INT8": np.int8, "DT_INT16": np.int16, "DT_INT32": np.int32,
    "DT_INT64": np.int64, "DT_UINT8": np.uint8, "DT_UINT16": np.uint16,
}


@dataclass(frozen=True)
class TensorSpec:
    """One signature input or output: its SignatureDef dtype name and shape.

    Attributes:
        dtype: e.g. ``"DT_STRING"``, ``"DT_UINT8"``.
        shape: dimensions, ``-1`` for unknown ones, or None for an unknown rank.
    """

    dtype: str
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class SignatureSpec:
    """The inputs and outputs of one signature, by key."""

    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]


@dataclass(frozen=True)
class PredictRequest:
    """A parsed predict request.

    Attributes:
        signature_name: the signature to run.
        inputs: one array per input key, each with its batch first.
        row_format: ``instances`` (answered as ``predictions``), else ``inputs`` (``outputs``).
        size: the number of instances (row format), or of the first input's rows.
    """

    signature_name: str
    inputs: dict[str, np.ndarray]
    row_format: bool

    @property
    def size(self) -> int:
        return len(next(iter(self.inputs.values())))

    def rows(self, start: int, stop: int) -> PredictRequest:
        """The request of rows ``start:stop`` of every input."""
        return PredictRequest(self.signature_name,
                              {k: v[start:stop] for k, v in self.inputs.items()},
                              self.row_format)


def parse_predict(body: bytes, signatures: dict[str, SignatureSpec],
                  max_string_bytes: int | None = None, limits: Limits | None = None
                  ) -> PredictRequest:
    """The `PredictRequest` of a request body, checked against the model's signatures.

    Args:
        body: the HTTP request body (JSON).
        signatures: the model's signatures by name.
        max_string_bytes: the longest text (a JSON string, not ``{"b64": ...}``) an
            instance may hold (overrides ``limits.max_string_bytes``).
        limits: what the request may hold (`Limits`); None: no limits.

    Raises:
        RestError: the body is over a limit, is not JSON, names no or an unknown signature,
            mixes or lacks ``instances``/``inputs``, or holds a value that does not fit the
            signature (a number for a string input, a ragged array, a byte out of range, an
            image over the pixel limit...).
    """
    limits = limits or Limits()
    if max_string_bytes is not None:
        limits = Limits(max_string_bytes, limits.max_json_depth, limits.max_json_values,
                        limits.max_image_pixels)
    check_json(body, limits.max_json_depth, limits.max_json_values)
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise RestError(f"JSON Parse error: {' '.join(str(error).split())}") from None
    except RecursionError:  # without a depth limit
        raise RestError("JSON Parse error: nested too deeply") from None
    if not isinstance(request, dict):
        raise RestError("JSON Value: the request body must be a JSON object with "
                        "'instances' or 'inputs'")
    name = request.get("signature_name", SERVING)
    if not isinstance(name, str):
        raise RestError("'signature_name' must be a string")
    if name not in signatures:
        raise RestError(f'Serving signature name: "{name}" not found in signature def')
    spec = signatures[name]
    has_rows, has_columns = "instances" in request, "inputs" in request
    if has_rows == has_columns:
        raise RestError("Missing 'inputs' or 'instances' key" if not has_rows else
                        "Not formatted correctly expecting only one of 'inputs' or "
                        "'instances' keys exclusively")
    if has_rows:
        columns = _rows_to_columns(request["instances"], spec)
    else:
        columns = _columns(request["inputs"], spec)
    inputs = {key: _to_array(key, value, spec.inputs[key], limits)
              for key, value in columns.items()}
    sizes = {len(array) for array in inputs.values()}
    if has_columns and len(sizes) > 1:
        raise RestError("Inputs have different batch sizes: "
                        + ", ".join(f"{k}: {len(v)}" for k, v in inputs.items()))
    return PredictRequest(name, inputs, has_rows)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _rows_to_columns(instances, spec: SignatureSpec) -> dict[str, list]:
    """``[instance, ...]`` → ``{input: [value, ...]}``."""
    if not isinstance(instances, list):
        raise RestError("Expecting 'instances' to be an list/array")
    if not instances:
        raise RestError("No values in 'instances' (an empty list)")
    keys = list(spec.inputs)
    columns: dict[str, list] = {key: [] for key in keys}
    for index, instance in enumerate(instances):
        named = isinstance(instance, dict) and not _is_b64(instance)
        if len(keys) == 1 and not named:
            columns[keys[0]].append(instance)
            continue
        if not named:
            raise RestError(f"instance {index}: expecting an object with the inputs "
                            f"{sorted(keys)} (the signature has {len(keys)} inputs)")
        missing, extra = set(keys) - set(instance), set(instance) - set(keys)
        if missing or extra:
            raise RestError(f"instance {index}: expecting the inputs {sorted(keys)}; "
                            f"missing {sorted(missing)}, unknown {sorted(extra)}")
        for key in keys:
            columns[key].append(instance[key])
    return columns


def _columns(inputs, spec: SignatureSpec) -> dict[str, list]:
    keys = list(spec.inputs)
    if isinstance(inputs, dict) and not _is_b64(inputs):
        missing, extra = set(keys) - set(inputs), set(inputs) - set(keys)
        if missing or extra:
            raise RestError(f"'inputs': expecting the inputs {sorted(keys)}; missing "
                            f"{sorted(missing)}, unknown {sorted(extra)}")
        return {key: inputs[key] for key in keys}
    if len(keys) != 1:
        raise RestError(f"'inputs' must be an object naming the inputs {sorted(keys)}")
    return {keys[0]: inputs}


def _decode_string(key: str, value, limits: Limits) -> bytes:
    if _is_b64(value):
        data = value["b64"]
        if not isinstance(data, str):
            raise RestError(f"input '{key}': 'b64' must hold a base64 string")
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise RestError(f"input '{key}': Unable to base64 decode") from None
        problem = pixel_problem(data, limits.max_image_pixels)  # read from the header
        if problem:
            raise RestError(f"input '{key}': {problem}", 400)
        return data  # binary data: only the request's size limits it
    if not isinstance(value, str):
        raise RestError(f"input '{key}' is a string tensor: expecting a JSON string or "
                        f'{{"b64": ...}}, got {type(value).__name__} {json.dumps(value)[:40]}')
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RestError(f"input '{key}': the text is not valid Unicode ({error.reason}: "
                        f"{value[error.start:error.end]!a} at character {error.start})") from None
    limit = limits.max_string_bytes
    if limit is not None and len(data) > limit:
        raise RestError(f"input '{key}': a text of {len(data)} bytes is longer than the "
                        f"server's limit of {limit} bytes (--max-string-bytes)")
    return data


def _strings(key: str, value, limits: Limits):
    if isinstance(value, list):
        return [_strings(key, item, limits) for item in value]
    return _decode_string(key, value, limits)


def _to_array(key: str, values, spec: TensorSpec, limits: Limits) -> np.ndarray:
    """One input's values (its batch first) as an array that fits ``spec``."""
    if spec.dtype not in _DTYPES:
        raise RestError(f"input '{key}': dtype {spec.dtype} cannot be sent as JSON")
    if spec.dtype == "DT_STRING":
        ragged = RestError(f"input '{key}': the values have different shapes (a ragged list)")
        try:
            array = np.array(_strings(key, values, limits), dtype=object)
        except ValueError:
            raise ragged from None
        if any(isinstance(x, list) for x in array.reshape(-1)):
            raise ragged
    else:
        array = _numbers(key, values, spec.dtype)
    if array.ndim == 0:
        raise RestError(f"input '{key}': expecting a batch (a list), got one value")
    if spec.shape is not None:
        if array.ndim != len(spec.shape):
            raise RestError(f"input '{key}': expecting rank {len(spec.shape)} (shape "
                            f"{_shape(spec.shape)}), got shape {_shape(array.shape)}")
        for got, want in zip(array.shape, spec.shape):
            if want != -1 and got != want:
                raise RestError(f"input '{key}': expecting shape {_shape(spec.shape)}, got "
                                f"{_shape(array.shape)}")
    if 0 in array.shape[1:]:
        raise RestError(f"input '{key}': every dimension after the batch must be at least "
                        f"1, got shape {_shape(array.shape)} (an empty image?)")
    return array


def _numbers(key: str, values, dtype: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except ValueError:
        raise RestError(f"input '{key}': the values have different shapes (a ragged "
                        "list)") from None
    if array.dtype == object or array.dtype.kind in "US":
        raise RestError(f"input '{key}' is {dtype}: expecting numbers in a rectangular "
                        "array (no strings, objects or ragged lists)")
    target = np.dtype(_DTYPES[dtype])
    if target.kind in "iu":
        if array.dtype.kind == "f" and not np.all(np.equal(np.mod(array, 1), 0)):
            raise RestError(f"input '{key}' is {dtype}: expecting integers")
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise RestError(f"input '{key}' is {dtype}: values must lie in [{info.min}, "
                            f"{info.max}], got [{array.min()}, {array.max()}]")
    elif target.kind == "b" and array.dtype.kind != "b":
        raise RestError(f"input '{key}' is {dtype}: expecting true/false")
    return array.astype(target)


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _jsonable(key: str, array: np.ndarray):
    if array.dtype == object or array.dtype.kind == "S":
        if key.endswith("_bytes"):
            convert = lambda b: {"b64": base64.b64encode(b).decode("ascii")}  # noqa: E731
        else:
            convert = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
        return np.vectorize(convert, otypes=[object])(array).tolist() if array.size else \
            array.tolist()
    return array.tolist()


def format_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """The answer to a predict request: ``{"predictions": [...]}`` or ``{"outputs": ...}``.

    Args:
        outputs: the signature's outputs by key, their batch first (row format).
        row_format: the request came as ``instances``.

    Raises:
        RestError: row format with outputs of different batch sizes.
    """
    values = {key: _jsonable(key, np.asarray(array)) for key, array in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    sizes = {len(v) for v in values.values()}
    if len(sizes) != 1:
        raise RestError("Output tensors have different batch sizes; ask in columnar format "
                        "('inputs')")
    keys = list(values)
    return {"predictions": [{key: values[key][i] for key in keys}
                            for i in range(sizes.pop())]}
