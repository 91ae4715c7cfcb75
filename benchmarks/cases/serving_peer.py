"""The hand-rolled peer of the ``serving`` case: a single-threaded ``http.server`` around
``tf.saved_model.load``.

    python benchmarks/cases/serving_peer.py [--translator DIR] [--detector DIR] [--port 8501]

One ``tf.saved_model.load`` per export given, called from the handler of a single-threaded
``http.server.HTTPServer`` on 127.0.0.1 (one request at a time, one instance per call, HTTP/1.0:
one connection per request), on the REST server's paths and JSON: ``GET /v1/models/NAME``,
``POST /v1/models/translator:predict`` with ``{"instances": [SENTENCE, ...]}`` (the export's
``serving_default``) and ``POST /v1/models/detector:predict`` with ``{"signature_name":
"serving_bytes", "instances": [{"b64": PNG}, ...]}``, answering ``{"predictions": [...]}`` (a
bad request: 400 with ``{"error": ...}``). Its listen backlog is 128 instead of
``HTTPServer``'s 5, so that many waiting clients queue in the kernel instead of retrying their
connections. Prints ``listening on ...`` and ``ready: MODELS`` once it serves; exits 0 on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal

HOST = "127.0.0.1"


def peer_server(translator: str | None, detector: str | None, port: int) -> int:
    """Serves the exports one request at a time until SIGTERM or SIGINT; returns 0."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from http.server import BaseHTTPRequestHandler, HTTPServer

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    def translate(body):
        text = tf.constant([str(s) for s in body["instances"]], tf.string)
        out = translator_fn(text=text)["translation"].numpy()
        return [t.decode("utf-8") for t in out]

    def detect(body):
        if body.get("signature_name", "serving_bytes") != "serving_bytes":
            raise ValueError("only the serving_bytes signature is served")
        data = [base64.b64decode(i["b64"]) for i in body["instances"]]
        out = detector_fn(image_bytes=tf.constant(data, tf.string, shape=[len(data)]))
        out = {k: v.numpy().tolist() for k, v in out.items()}
        return [{k: v[i] for k, v in out.items()} for i in range(len(data))]

    models, keep = {}, []
    if translator:
        keep.append(tf.saved_model.load(translator))
        translator_fn = keep[-1].signatures["serving_default"]
        models["translator"] = translate
    if detector:
        keep.append(tf.saved_model.load(detector))
        detector_fn = keep[-1].signatures["serving_bytes"]
        models["detector"] = detect

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code: int, payload) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            name = self.path.removeprefix("/v1/models/")
            if not self.path.startswith("/v1/models/") or name not in models:
                return self.reply(404, {"error": f"no model at {self.path}"})
            self.reply(200, {"model_version_status": [
                {"version": "1", "state": "AVAILABLE",
                 "status": {"error_code": "OK", "error_message": ""}}]})

        def do_POST(self):  # noqa: N802
            name = self.path.removeprefix("/v1/models/").removesuffix(":predict")
            if not self.path.endswith(":predict") or name not in models:
                return self.reply(404, {"error": f"no model at {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                predictions = models[name](body)
            except Exception as error:  # a bad request: its message, as TF Serving answers
                return self.reply(400, {"error": f"{type(error).__name__}: {error}"})
            self.reply(200, {"predictions": predictions})

        def log_message(self, *args):
            pass

    class Server(HTTPServer):
        request_queue_size = 128

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    server = Server((HOST, port), Handler)
    print(f"listening on http://{HOST}:{port}", flush=True)
    print(f"ready: {', '.join(models)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--translator", default=None, help="translator export directory")
    parser.add_argument("--detector", default=None, help="detector export directory")
    parser.add_argument("--port", type=int, default=8501)
    args = parser.parse_args(argv)
    return peer_server(args.translator, args.detector, args.port)


if __name__ == "__main__":
    raise SystemExit(main())
