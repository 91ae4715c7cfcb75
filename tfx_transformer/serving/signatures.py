"""A SavedModel's signatures as TensorFlow Serving describes them.

`read_signature_defs` reads ``saved_model.pb`` (the protocol buffer only: no graph is loaded);
`metadata` is the body of ``GET /v1/models/NAME/metadata`` and `status` the body of
``GET /v1/models/NAME``, in TensorFlow Serving's JSON (protobuf's JSON mapping with the field
names kept); `signature_specs` gives the `rest.SignatureSpec` that requests are checked against.
"""

from __future__ import annotations

import os

from google.protobuf import json_format

from tfx_transformer.serving.rest import SignatureSpec, TensorSpec

__all__ = ["VERSION", "metadata", "read_signature_defs", "signature_specs", "status"]

VERSION = "1"  # an export directory is served as the model's only version
PREDICT_METHOD = "tensorflow/serving/predict"


def read_signature_defs(path: str | os.PathLike) -> dict:
    """``{name: SignatureDef}`` of the SavedModel at ``path`` (its first MetaGraph)."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    with open(os.path.join(os.fspath(path), "saved_model.pb"), "rb") as f:
        model.ParseFromString(f.read())
    return dict(model.meta_graphs[0].signature_def)


def _to_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def metadata(name: str, signature_defs: dict) -> dict:
    """The body of ``GET /v1/models/NAME/metadata``: the model spec and every SignatureDef."""
    defs = {key: _to_dict(value) for key, value in sorted(signature_defs.items())}
    for value in defs.values():  # TF Serving writes the method name of every signature
        value.setdefault("method_name", PREDICT_METHOD)
    return {"model_spec": {"name": name, "signature_name": "", "version": VERSION},
            "metadata": {"signature_def": {"signature_def": defs}}}


def status(state: str, error_message: str = "") -> dict:
    """The body of ``GET /v1/models/NAME``: one version in ``state`` (``LOADING``, ``AVAILABLE``,
    ``END`` after a failed load, with its ``error_message``)."""
    code = "OK" if not error_message else "UNKNOWN"
    return {"model_version_status": [{"version": VERSION, "state": state,
                                      "status": {"error_code": code,
                                                 "error_message": error_message}}]}


def _tensor_spec(info) -> TensorSpec:
    from tensorflow.core.framework import types_pb2

    shape = info.tensor_shape
    dims = None if shape.unknown_rank else tuple(int(d.size) for d in shape.dim)
    return TensorSpec(types_pb2.DataType.Name(info.dtype), dims)


def signature_specs(signature_defs: dict) -> dict[str, SignatureSpec]:
    """`rest.SignatureSpec` of every signature that takes inputs (not ``__saved_model_init_op``)."""
    return {name: SignatureSpec({k: _tensor_spec(v) for k, v in sorted(d.inputs.items())},
                                {k: _tensor_spec(v) for k, v in sorted(d.outputs.items())})
            for name, d in signature_defs.items() if d.inputs}
