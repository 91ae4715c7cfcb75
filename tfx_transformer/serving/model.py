"""One served SavedModel: loaded in the background, run on batches of requests.

`ServedModel` is what a replica of the server holds (`app.ModelReplica`), and it runs without
Ray too: ``ServedModel(name, path, threads)`` starts loading at once; `state` is ``LOADING``,
then ``AVAILABLE`` (or ``END`` with `error` when the export cannot be loaded). `run_batch`
runs several parsed requests (`rest.PredictRequest`) in as few signature calls as their shapes
allow: requests of one signature whose inputs agree beyond the batch dimension are concatenated,
run once and split again, so a batch answers each request exactly what it would get alone
(both exports decode or detect every row independently).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict

import numpy as np

from tfx_transformer.serving import signatures as sig
from tfx_transformer.serving.rest import PredictRequest, RestError

__all__ = ["ServedModel"]


class ServedModel:
    """A SavedModel being loaded or served.

    Args:
        name: the model's name in the API.
        path: the export directory (a SavedModel).
        threads: TensorFlow's intra-op thread pool size (the replica's CPUs); None keeps
            TensorFlow's default. Set before TensorFlow runs anything in this process.
    """

    def __init__(self, name: str, path: str | os.PathLike, threads: int | None = None):
        self.name = name
        self.path = os.fspath(path)
        self.threads = threads
        self.state = "LOADING"
        self.error = ""
        self.specs = {}
        self.metadata = {}
        self._signatures = {}
        self._loaded = threading.Event()
        threading.Thread(target=self._load, name=f"load-{name}", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the model is loaded or failed to; True if it is `AVAILABLE`."""
        self._loaded.wait(timeout)
        return self.state == "AVAILABLE"

    def _load(self) -> None:
        try:
            import tensorflow as tf

            if self.threads:
                try:
                    tf.config.threading.set_intra_op_parallelism_threads(self.threads)
                    tf.config.threading.set_inter_op_parallelism_threads(min(2, self.threads))
                except RuntimeError:  # TensorFlow runs already in this process: its pools stay
                    self.threads = None
            try:
                import tensorflow_text  # noqa: F401  (the translator's SentencePiece ops)
            except ImportError:
                pass
            defs = sig.read_signature_defs(self.path)
            self.specs = sig.signature_specs(defs)
            self.metadata = sig.metadata(self.name, defs)
            self._saved_model = tf.saved_model.load(self.path)
            self._signatures = dict(self._saved_model.signatures)
            self._tf = tf
            self.state = "AVAILABLE"
        except Exception as error:  # noqa: BLE001  (any failure is the model's status)
            self.error = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            self.state = "END"
        finally:
            self._loaded.set()

    def check_available(self) -> None:
        """Raises `RestError` 503 while loading, 500 after a failed load."""
        if self.state == "LOADING":
            raise RestError(f"Servable {self.name} is loading; retry shortly", 503)
        if self.state != "AVAILABLE":
            raise RestError(f"Servable {self.name} failed to load: {self.error}", 500)

    def _call(self, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = self._tf
        tensors = {k: tf.constant(v, tf.string if v.dtype == object else None)
                   for k, v in inputs.items()}
        outputs = self._signatures[name](**tensors)
        return {k: outputs[k].numpy() for k in sorted(outputs)}

    def run(self, request: PredictRequest) -> dict[str, np.ndarray]:
        """One request's outputs; `RestError` (400) when the model refuses its values."""
        self.check_available()
        try:
            return self._call(request.signature_name, request.inputs)
        except self._tf.errors.InvalidArgumentError as error:
            raise RestError(_op_message(error.message)) from None

    def run_batch(self, requests: list[PredictRequest]) -> list:
        """Each request's outputs (a dict of arrays) or its `RestError`, in order."""
        results: list = [None] * len(requests)
        groups = defaultdict(list)
        for index, request in enumerate(requests):
            key = (request.signature_name,
                   tuple((k, v.dtype.str, v.shape[1:]) for k, v in request.inputs.items()))
            groups[key].append(index)
        for indices in groups.values():
            try:
                self.check_available()
                if len(indices) == 1:
                    results[indices[0]] = self.run(requests[indices[0]])
                    continue
                batch = [requests[i] for i in indices]
                inputs = {k: np.concatenate([r.inputs[k] for r in batch])
                          for k in batch[0].inputs}
                outputs = self._call(batch[0].signature_name, inputs)
            except RestError as error:
                for i in indices:
                    results[i] = error
                continue
            except self._tf.errors.InvalidArgumentError:
                for i in indices:  # one bad request (an undecodable image) fails only itself
                    results[i] = _outcome(self.run, requests[i])
                continue
            start = 0
            for i in indices:
                stop = start + requests[i].size
                results[i] = {k: v[start:stop] for k, v in outputs.items()}
                start = stop
        return results


def _outcome(run, request):
    try:
        return run(request)
    except RestError as error:
        return error


def _op_message(message: str) -> str:
    """The cause in a TensorFlow op error, without its graph trace (e.g. "Unknown image file
    format. One of JPEG, PNG, GIF, BMP required.")."""
    for line in message.splitlines():
        line = line.strip()
        if line and not line.startswith(("Graph execution error", "Detected at node", "<stack",
                                          "[[")):
            return line.split(" [[")[0].strip()
    return "the model refused the request's values"
