"""The REST API of a real server (``scripts/serve.py`` on 127.0.0.1, the `serving` fixture),
against the exports loaded here directly: every answer is what the export computes itself."""

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from nlp.export.load import load_translator
from vision.export.load import load_detector

pytestmark = pytest.mark.xdist_group("serving")

SENTENCES = ["I have three apples.", "Good morning.", "The red car is fast.", "",
             "Where is the station?", "We eat bread."]


@pytest.fixture(scope="module")
def translator(serving):
    return load_translator(serving.translator_path)


@pytest.fixture(scope="module")
def detector(serving):
    return load_detector(serving.detector_path)


def _image(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, [height, width, 3], dtype=np.uint8)


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG")
    return buffer.getvalue()


def _b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


def test_models_answer_503_while_loading_then_are_available(serving):
    loading = [(what, status, body) for what, status, body in serving.early
               if what == "status" and body["model_version_status"][0]["state"] == "LOADING"]
    assert loading, f"no answer while loading: {serving.early[:4]}"
    assert loading[0][1] == 200
    refused = [(status, body) for what, status, body in serving.early
               if what == "predict" and status != 200]
    assert refused and all(status == 503 and "is loading" in body["error"]
                           for status, body in refused)
    for name in ("translator", "detector"):
        for path in (f"/v1/models/{name}", f"/v1/models/{name}/versions/1"):
            assert serving.get(path) == (200, {"model_version_status": [{
                "version": "1", "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""}}]})
    status, listed = serving.get("/v1/models")
    assert status == 200 and [(m["name"], m["kind"]) for m in listed["models"]] == [
        ("translator", "translator"), ("detector", "detector")]


@pytest.mark.parametrize("name", ["translator", "detector"])
def test_metadata_lists_the_exports_signatures(serving, name, request):
    status, body = serving.get(f"/v1/models/{name}/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": name, "signature_name": "", "version": "1"}
    defs = body["metadata"]["signature_def"]["signature_def"]
    # The signatures as `tf.saved_model.load` gives them: the SavedModel that the module's
    # `translator` or `detector` loaded from the served path (loading it again took 2 s).
    loaded = request.getfixturevalue(name)
    assert loaded.path == getattr(serving, f"{name}_path")
    signatures = loaded._saved_model.signatures
    assert set(signatures) <= set(defs)
    for key, function in signatures.items():
        inputs = function.structured_input_signature[1]
        assert {k: defs[key]["inputs"][k]["dtype"] for k in inputs} == {
            k: "DT_" + spec.dtype.name.upper() for k, spec in inputs.items()}
        assert set(defs[key]["outputs"]) == set(function.structured_outputs)


def test_translations_in_row_and_columnar_format(serving, translator):
    expected = [t.decode() for t in translator(tf.constant(SENTENCES)).numpy()]
    assert serving.post("/v1/models/translator:predict", {"instances": SENTENCES}) == (
        200, {"predictions": expected})
    assert serving.post("/v1/models/translator/versions/1:predict",
                        {"inputs": {"text": SENTENCES[:2]}}) == (200, {"outputs": expected[:2]})
    hypotheses, scores = translator.translate_nbest(tf.constant(SENTENCES[:2]))
    status, body = serving.post("/v1/models/translator:predict",
                                {"signature_name": "translate_nbest",
                                 "instances": [{"text": s} for s in SENTENCES[:2]]})
    assert status == 200
    for row, hyps, score in zip(body["predictions"], hypotheses.numpy(), scores.numpy()):
        assert row["hypotheses"] == [h.decode() for h in hyps]
        np.testing.assert_allclose(row["scores"], score, rtol=1e-5)


def test_concurrent_requests_each_get_their_own_answer(serving, translator):
    sentences = [f"I have {n} apples." for n in range(2, 14)]
    expected = [t.decode() for t in translator(tf.constant(sentences)).numpy()]
    with ThreadPoolExecutor(len(sentences)) as pool:
        answers = list(pool.map(lambda s: serving.post("/v1/models/translator:predict",
                                                       {"instances": [s]}), sentences))
    assert answers == [(200, {"predictions": [e]}) for e in expected]


def test_detections_of_pixels_and_of_encoded_images(serving, detector):
    images = np.stack([_image(40, 56, 1), _image(40, 56, 2)])
    direct = detector(images)
    status, body = serving.post("/v1/models/detector:predict",
                                {"instances": images.tolist()})
    assert status == 200 and len(body["predictions"]) == 2
    for i, row in enumerate(body["predictions"]):
        np.testing.assert_allclose(row["boxes"], direct["boxes"][i], rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(row["scores"], direct["scores"][i], rtol=1e-4, atol=1e-6)
        assert row["labels"] == direct["labels"][i].tolist()
    encoded = [_png(_image(30, 45, 3)), _png(_image(64, 20, 4))]
    direct = detector.detect_bytes(encoded)
    status, body = serving.post("/v1/models/detector:predict", {
        "signature_name": "serving_bytes", "instances": [_b64(d) for d in encoded]})
    assert status == 200
    for i, row in enumerate(body["predictions"]):
        np.testing.assert_allclose(row["boxes"], direct["boxes"][i], rtol=1e-4, atol=1e-3)
        assert row["labels"] == direct["labels"][i].tolist()


LONG = "word " * 4001  # 20,005 bytes: over the default --max-string-bytes (20,000)


@pytest.mark.parametrize("path, body, status, message", [
    ("/v1/models/nope:predict", {"instances": ["a"]}, 404,
     "Servable not found for request: Latest(nope)"),
    ("/v1/models/translator/versions/7:predict", {"instances": ["a"]}, 404,
     "Servable not found for request: Specific(translator, 7)"),
    ("/v1/models/translator:predict", {"signature_name": "beam", "instances": ["a"]}, 400,
     'Serving signature name: "beam" not found in signature def'),
    ("/v1/models/translator:predict", {"instances": [42]}, 400, "is a string tensor"),
    ("/v1/models/translator:predict", {"instances": [LONG]}, 400,
     "longer than the server's limit of 20000 bytes"),
    ("/v1/models/translator:predict", b'{"instances": ["a"', 400, "JSON Parse error"),
    ("/v1/models/translator:classify", {"examples": []}, 400, "answers :predict only"),
    ("/v1/models/detector:predict", {"signature_name": "serving_bytes", "instances": [
        _b64(b"GIF87a\x01\x00\x01\x00 not really")]}, 400, "GIF"),  # a 1 x 1 header
    ("/v1/models/detector:predict", {"instances": [[[[0, 0, 300]]]]}, 400,
     "values must lie in [0, 255]"),
])
def test_bad_requests_get_tf_servings_errors(serving, path, body, status, message):
    got_status, got = serving.post(path, body)
    assert got_status == status and set(got) == {"error"}
    assert message in got["error"] and "Traceback" not in got["error"]


def test_a_bad_image_in_a_busy_server_fails_alone(serving, detector):
    good = _png(_image(32, 32, 5))
    requests = [[_b64(good)], [_b64(b"\x89PNG broken")]] * 3
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: serving.post(
            "/v1/models/detector:predict", {"signature_name": "serving_bytes",
                                            "instances": r}), requests))
    expected = detector.detect_bytes([good])["labels"][0].tolist()
    for i, (status, body) in enumerate(answers):
        if i % 2 == 0:
            assert status == 200 and body["predictions"][0]["labels"] == expected
        else:
            assert status == 400 and "PNG" in body["error"]


def test_a_request_over_the_size_limit_is_refused(serving):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", serving.port, timeout=60)
    connection.putrequest("POST", "/v1/models/translator:predict")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(33 * 2**20))  # over the default 32 MiB
    connection.endheaders(b'{"instances": ["')  # the server answers before the rest comes
    response = connection.getresponse()
    assert response.status == 413
    assert "larger than the server's limit" in json.loads(response.read())["error"]
    connection.close()
    status, answer = serving.request("/v1/models/translator:predict", method="GET")
    assert status == 405 and "Use POST" in answer["error"]


def test_the_page_and_its_files_are_served(serving):
    import urllib.request

    with urllib.request.urlopen(serving.url + "/", timeout=30) as response:
        assert response.status == 200 and "text/html" in response.headers["content-type"]
        assert b"<html" in response.read().lower()
    assert serving.get("/static/no-such-file.js")[0] == 404


def test_sigterm_stops_the_server_and_every_process_it_started(serving):
    code, alive = serving.stop()
    assert code == 0, serving.stderr[-20:]
    assert serving.lines[-1] == "stopped"
    assert alive == []
