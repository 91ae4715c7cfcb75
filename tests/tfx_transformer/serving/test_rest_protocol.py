"""TensorFlow Serving's REST predict API without a server: `rest`, `signatures`, `model`.

A small SavedModel stands in for any export: ``half_plus_two`` (TF Serving's own example model:
``y = 0.5 x + 2``), ``tagged`` (the three inputs of TF Serving's row/columnar example:
``tag`` string, ``signal`` (5,) and ``sensor`` (2, 2)) and ``decode`` (PNG bytes → the image's
height and width, so that undecodable data fails in the model). The expected answers are TF
Serving's documented ones, or computed here from the inputs.
"""

import base64
import io
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bombs import png_bomb  # noqa: E402

from tfx_transformer.serving import signatures as sig
from tfx_transformer.serving.app import parse_model_path
from tfx_transformer.serving.model import ServedModel
from tfx_transformer.serving.rest import RestError, format_response, parse_predict

# On the worker of the shared server: `parse_model_path`'s module imports Ray Serve and FastAPI
# (0.9 s of CPU), which that worker imports anyway and no other test file does.
pytestmark = pytest.mark.xdist_group("serving")

# TF Serving's REST API documentation: the same two instances in row and in columnar format.
ROW_EXAMPLE = {"instances": [
    {"tag": "foo", "signal": [1, 2, 3, 4, 5], "sensor": [[1, 2], [3, 4]]},
    {"tag": "bar", "signal": [3, 4, 1, 2, 5], "sensor": [[4, 5], [6, 8]]},
]}
COLUMNAR_EXAMPLE = {"inputs": {
    "tag": ["foo", "bar"],
    "signal": [[1, 2, 3, 4, 5], [3, 4, 1, 2, 5]],
    "sensor": [[[1, 2], [3, 4]], [[4, 5], [6, 8]]],
}}


class _Examples(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def half_plus_two(self, x):
        return {"y": 0.5 * x + 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="tag"),
                                  tf.TensorSpec([None, 5], tf.float32, name="signal"),
                                  tf.TensorSpec([None, 2, 2], tf.float32, name="sensor")])
    def tagged(self, tag, signal, sensor):
        total = tf.reduce_sum(signal, axis=1) + tf.reduce_sum(sensor, axis=[1, 2])
        return {"tag_bytes": tf.strings.join([tag, b"\x00!"]), "total": total}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="png")])
    def decode(self, png):
        size = tf.map_fn(lambda data: tf.shape(tf.io.decode_png(data, channels=3))[:2], png,
                         fn_output_signature=tf.int32)
        return {"size": size}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("examples") / "export"
    module = _Examples()
    tf.saved_model.save(module, str(path), signatures={
        "serving_default": module.half_plus_two, "tagged": module.tagged,
        "decode": module.decode})
    model = ServedModel("examples", path, threads=1)
    assert model.wait(60), model.error
    return model


def _png(height: int, width: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros([height, width, 3], np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _predict(model, request: dict) -> dict:
    parsed = parse_predict(json.dumps(request).encode(), model.specs, max_string_bytes=1000)
    return format_response(model.run(parsed), parsed.row_format)


def test_half_plus_two_answers_as_tf_serving_documents(served):
    assert _predict(served, {"instances": [1.0, 2.0, 5.0]}) == {"predictions": [2.5, 3.0, 4.5]}
    assert _predict(served, {"inputs": [1.0, 2.0, 5.0]}) == {"outputs": [2.5, 3.0, 4.5]}
    assert _predict(served, {"instances": [{"x": 1.0}]}) == {"predictions": [2.5]}


def test_row_and_columnar_formats_are_the_same_request(served):
    rows = parse_predict(json.dumps({"signature_name": "tagged", **ROW_EXAMPLE}).encode(),
                         served.specs)
    columns = parse_predict(json.dumps({"signature_name": "tagged", **COLUMNAR_EXAMPLE}).encode(),
                            served.specs)
    assert rows.row_format and not columns.row_format and rows.size == columns.size == 2
    for key in ("tag", "signal", "sensor"):
        np.testing.assert_array_equal(rows.inputs[key], columns.inputs[key])
    assert rows.inputs["tag"].tolist() == [b"foo", b"bar"]
    assert rows.inputs["sensor"].dtype == np.float32 and rows.inputs["sensor"].shape == (2, 2, 2)

    totals = [1 + 2 + 3 + 4 + 5 + 1 + 2 + 3 + 4, 3 + 4 + 1 + 2 + 5 + 4 + 5 + 6 + 8]
    tag_b64 = [{"b64": base64.b64encode(t + b"\x00!").decode()} for t in (b"foo", b"bar")]
    row_answer = format_response(served.run(rows), True)
    assert row_answer == {"predictions": [{"tag_bytes": tag_b64[0], "total": totals[0]},
                                          {"tag_bytes": tag_b64[1], "total": totals[1]}]}
    assert format_response(served.run(columns), False) == {
        "outputs": {"tag_bytes": tag_b64, "total": totals}}


def test_b64_values_arrive_as_their_bytes(served):
    binary = bytes(range(256)) + b"\x00\x00"
    request = {"signature_name": "tagged", "inputs": {
        "tag": [{"b64": base64.b64encode(binary).decode()}], "signal": [[0] * 5],
        "sensor": [[[0, 0], [0, 0]]]}}
    parsed = parse_predict(json.dumps(request).encode(), served.specs)
    assert parsed.inputs["tag"].tolist() == [binary]
    out = format_response(served.run(parsed), False)["outputs"]
    assert base64.b64decode(out["tag_bytes"][0]["b64"]) == binary + b"\x00!"


BAD_REQUESTS = [
    (b"{not json", "JSON Parse error"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"signature_name": "nope", "instances": [1.0]}',
     'Serving signature name: "nope" not found in signature def'),
    (b'{"signature_name": 3, "instances": [1.0]}', "'signature_name' must be a string"),
    (b'{"instances": [1.0], "inputs": [1.0]}', "only one of 'inputs' or 'instances'"),
    (b'{"examples": [1.0]}', "Missing 'inputs' or 'instances' key"),
    (b'{"instances": []}', "No values in 'instances'"),
    (b'{"instances": 1.0}', "Expecting 'instances' to be an list/array"),
    (b'{"instances": ["one"]}', "expecting numbers"),
    (b'{"instances": [[1.0], [1.0, 2.0]]}', "different shapes"),
    (b'{"instances": [[1.0], [2.0]]}', "expecting rank 1"),
    (b'{"signature_name": "tagged", "instances": [{"tag": "a", "signal": [1, 2, 3, 4]}]}',
     "missing ['sensor']"),
    (b'{"signature_name": "tagged", "instances": [{"tag": 7, "signal": [1, 2, 3, 4, 5], '
     b'"sensor": [[1, 2], [3, 4]]}]}', "is a string tensor"),
    (b'{"signature_name": "tagged", "inputs": {"tag": ["a"], "signal": [[1, 2, 3, 4, 5]], '
     b'"sensor": [[[1, 2], [3, 4]], [[1, 2], [3, 4]]]}}', "different batch sizes"),
    (b'{"signature_name": "tagged", "instances": [{"tag": "a", "signal": [1, 2, 3, 4, 5, 6], '
     b'"sensor": [[1, 2], [3, 4]]}]}', "expecting shape [-1,5]"),
    (b'{"signature_name": "decode", "instances": [{"b64": "%%%"}]}', "Unable to base64 decode"),
    (b'{"signature_name": "decode", "instances": ["' + b"x" * 1001 + b'"]}',
     "1001 bytes is longer than the server's limit of 1000 bytes"),
]


def test_the_text_limit_leaves_binary_values_alone(served):
    data = _png(300, 400) + bytes(5000)  # over 1000 bytes
    body = {"signature_name": "decode", "instances": [{"b64": base64.b64encode(data).decode()}]}
    parsed = parse_predict(json.dumps(body).encode(), served.specs, max_string_bytes=1000)
    assert parsed.inputs["png"].tolist() == [data]


@pytest.mark.parametrize("request_body, message", BAD_REQUESTS,
                         ids=[message.split(":")[0][:32] for _, message in BAD_REQUESTS])
def test_bad_requests_are_refused_with_tf_servings_message(served, request_body, message):
    with pytest.raises(RestError) as error:
        parse_predict(request_body, served.specs, max_string_bytes=1000)
    assert error.value.status == 400
    assert message in error.value.message


def test_integer_inputs_are_checked_against_their_dtype():
    from tfx_transformer.serving.rest import SignatureSpec, TensorSpec

    specs = {"serving_default": SignatureSpec(
        {"images": TensorSpec("DT_UINT8", (-1, -1, -1, 3))},
        {"boxes": TensorSpec("DT_FLOAT", None)})}
    image = np.arange(2 * 3).reshape(2, 3, 1).repeat(3, axis=2) * 40
    parsed = parse_predict(json.dumps({"instances": [image.tolist()]}).encode(), specs)
    assert parsed.inputs["images"].dtype == np.uint8
    np.testing.assert_array_equal(parsed.inputs["images"][0], image)
    for bad, message in ((256, "values must lie in [0, 255]"), (1.5, "expecting integers"),
                         (-1, "values must lie in [0, 255]")):
        pixels = image.tolist()
        pixels[0][0][0] = bad
        with pytest.raises(RestError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_predict(json.dumps({"instances": [pixels]}).encode(), specs)
    with pytest.raises(RestError, match=r"expecting rank 4 \(shape \[-1,-1,-1,3\]\), got shape "
                                        r"\[1,0\]"):
        parse_predict(json.dumps({"instances": [[]]}).encode(), specs)  # an empty image
    anything = {"serving_default": SignatureSpec({"x": TensorSpec("DT_UINT8", None)}, {})}
    with pytest.raises(RestError, match="at least 1, got shape"):
        parse_predict(json.dumps({"instances": [[[]]]}).encode(), anything)


def test_a_batch_answers_each_request_what_it_gets_alone(served):
    texts = [{"inputs": [1.0, 3.0]}, {"instances": [5.0]}, {"instances": [-2.0, 0.0, 8.0]}]
    requests = [parse_predict(json.dumps(t).encode(), served.specs) for t in texts]
    batched = served.run_batch(requests)
    for request, outputs in zip(requests, batched):
        np.testing.assert_array_equal(outputs["y"], 0.5 * request.inputs["x"] + 2.0)
        assert outputs.keys() == served.run(request).keys()


def test_an_undecodable_image_fails_only_its_own_request(served):
    def request(data: bytes):
        body = {"signature_name": "decode", "instances": [{"b64": base64.b64encode(data).decode()}]}
        return parse_predict(json.dumps(body).encode(), served.specs)

    requests = [request(_png(7, 5)), request(b"not an image at all"), request(_png(2, 9))]
    first, failed, third = served.run_batch(requests)
    assert first["size"].tolist() == [[7, 5]] and third["size"].tolist() == [[2, 9]]
    assert isinstance(failed, RestError) and failed.status == 400
    assert "Graph execution" not in failed.message and "PNG" in failed.message


def test_metadata_and_status_have_tf_servings_layout(served):
    meta = served.metadata
    assert meta["model_spec"] == {"name": "examples", "signature_name": "", "version": "1"}
    defs = meta["metadata"]["signature_def"]["signature_def"]
    loaded = tf.saved_model.load(served.path).signatures
    for name in ("serving_default", "tagged", "decode"):
        assert defs[name]["method_name"] == "tensorflow/serving/predict"
        specs = loaded[name].structured_input_signature[1]
        assert set(defs[name]["inputs"]) == set(specs)
        for key, spec in specs.items():
            entry = defs[name]["inputs"][key]
            assert entry["dtype"] == "DT_" + spec.dtype.name.upper().replace("FLOAT32", "FLOAT")
            assert entry["tensor_shape"]["dim"] == [
                {"size": str(-1 if d is None else d), "name": ""} for d in spec.shape]
            assert entry["tensor_shape"]["unknown_rank"] is False
    assert sig.status("AVAILABLE") == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                          "error_message": ""}}]}


def test_a_model_that_cannot_load_reports_why(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"not a protocol buffer")
    model = ServedModel("broken", tmp_path)
    assert not model.wait(60)
    assert model.state == "END" and model.error
    with pytest.raises(RestError) as error:
        model.check_available()
    assert error.value.status == 500 and "broken failed to load" in error.value.message


@pytest.mark.parametrize("path, parsed", [
    ("translator", ("translator", None, "status")),
    ("translator/versions/1", ("translator", "1", "status")),
    ("translator/metadata", ("translator", None, "metadata")),
    ("translator/versions/1/metadata", ("translator", "1", "metadata")),
    ("translator:predict", ("translator", None, "predict")),
    ("translator/versions/1:predict", ("translator", "1", "predict")),
    ("translator:classify", ("translator", None, "classify")),
])
def test_model_paths(path, parsed):
    assert parse_model_path(path) == parsed


@pytest.mark.parametrize("path", ["", "a/b", "a/versions/", "a:predict/x", "a/metadata:predict"])
def test_malformed_model_paths(path):
    with pytest.raises(RestError) as error:
        parse_model_path(path)
    assert error.value.status == 404


def test_the_bomb_maker_makes_real_images():
    data = png_bomb(37, 23)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))),
                                  np.zeros([23, 37, 3], np.uint8))
    assert tf.io.decode_png(png_bomb(300, 1234)).shape == (1234, 300, 3)


@pytest.mark.parametrize("fmt, options", [
    ("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("GIF", {}), ("BMP", {}),
    ("WEBP", {}), ("WEBP", {"lossless": True}), ("WEBP", {"mode": "RGBA"}),
    ("JPEG", {"exif": True}),
])
def test_image_sizes_are_read_from_the_header_as_pillow_reads_them(fmt, options):
    from tfx_transformer.serving.images import image_size

    options = dict(options)
    mode = options.pop("mode", "RGB")
    for width, height in ((1, 1), (37, 23), (640, 17), (300, 4100)):
        image = Image.new(mode, (width, height), "red")
        buffer = io.BytesIO()
        if options.pop("exif", False):
            exif = Image.Exif()
            exif[0x0112] = 6  # rotated: the header's size is the stored one
            options["exif"] = exif
        image.save(buffer, fmt, **options)
        data = buffer.getvalue()
        assert image_size(data) == Image.open(io.BytesIO(data)).size == (width, height)
        assert image_size(data[:8]) is None or fmt == "GIF"
    assert image_size(b"not an image") is None and image_size(b"") is None
    assert image_size(png_bomb(20000, 20000)[:40]) == (20000, 20000)


def test_limits_refuse_bombs_deep_json_and_too_many_values_before_parsing(served):
    from tfx_transformer.serving.rest import Limits

    limits = Limits(max_string_bytes=1000, max_json_depth=8, max_json_values=1000,
                    max_image_pixels=10_000)

    def refused(body: bytes) -> str:
        with pytest.raises(RestError) as error:
            parse_predict(body, served.specs, limits=limits)
        assert error.value.status == 400
        return error.value.message

    bomb = base64.b64encode(png_bomb(101, 100)).decode()
    assert refused(json.dumps({"signature_name": "decode", "instances": [{"b64": bomb}]})
                   .encode()) == ("input 'png': a 101 x 100 image (10,100 pixels) is larger "
                                  "than the limit of 10,000 pixels (--max-image-pixels)")
    fits = base64.b64encode(png_bomb(100, 100)).decode()
    body = json.dumps({"signature_name": "decode", "instances": [{"b64": fits}]}).encode()
    assert parse_predict(body, served.specs, limits=limits).size == 1
    deep = b'{"instances": ' + b"[" * 100_000 + b"1" + b"]" * 100_000 + b"}"
    assert refused(deep) == ("the request's JSON is nested 100,001 levels deep, deeper than "
                             "the server's limit of 8 (--max-json-depth)")
    with pytest.raises(RestError, match="JSON Parse error: nested too deeply"):
        parse_predict(deep, served.specs)  # no limit: Python's parser's RecursionError
    brackets_in_text = json.dumps({"signature_name": "decode",
                                   "instances": ['[[[[[[[[[[\\"{{{{{{{{{']}).encode()
    assert parse_predict(brackets_in_text, served.specs, limits=limits).size == 1
    assert refused(json.dumps({"instances": [1.0] * 1000}).encode()) == (
        "the request's JSON holds about 1,002 values, more than the server's limit of 1,000 "
        "(--max-json-values)")
    assert parse_predict(json.dumps({"instances": [1.0] * 998}).encode(), served.specs,
                         limits=limits).size == 998
    assert refused(b'{"signature_name": "decode", "instances": ["\\ud800 alone"]}') == (
        "input 'png': the text is not valid Unicode (surrogates not allowed: '\\ud800' at "
        "character 0)")
