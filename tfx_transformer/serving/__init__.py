"""Serving exports over TensorFlow Serving's REST API, on Ray Serve.

- `rest`: the predict API's request and response formats (no TensorFlow, no Ray);
- `signatures`: a SavedModel's signatures, status and metadata as TF Serving writes them;
- `model`: `ServedModel`, one export loaded in the background and run on batches;
- `app`: the Ray Serve deployments (`ModelReplica`, `Ingress`) and `build_app`;
- `command`: ``tfx-serve`` (``python scripts/serve.py``);
- `static/`: the page served at ``/``.
"""
