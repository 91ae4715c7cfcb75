"""The child process of the ``nmt`` case: ``prepare`` builds a job's models and compiles its
functions (one call each, untimed); ``time`` runs its contenders in turns (`harness.alternate`)
and answers their times, from which the parent makes the rows.

TensorFlow starts with its oneDNN kernels on (`tfx_transformer.quiet.onednn_default`, as the
training commands run it) unless the environment sets ``TF_ENABLE_ONEDNN_OPTS``; in a process
of its own, so that no other case has imported TensorFlow before with another setting.

The jobs: ``train`` (one train step of ``Seq2SeqTransformer`` against the same-size model of
KerasHub layers) and ``decode`` (greedy with the KV cache, the same XLA-compiled, greedy
re-running the whole prefix, beam search XLA-compiled).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfx_transformer.quiet import onednn_default  # noqa: E402

ONEDNN = onednn_default()  # before TensorFlow is imported

import harness  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import workers  # noqa: E402

from nlp.config import preset  # noqa: E402
from nlp.modeling.model import build_model  # noqa: E402
from nlp.search import decoding  # noqa: E402
from nlp.text.special_ids import EOS_ID  # noqa: E402
from tfx_transformer.replicas import GlobalClipAdam  # noqa: E402


def keras_hub_model(config):
    """The same-size encoder-decoder from KerasHub layers (untied output projection)."""
    import keras_hub

    layers = keras_hub.layers
    vocab = config.vocab_size
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    embed_kw = dict(vocabulary_size=vocab, sequence_length=512, embedding_dim=config.d_model)
    x = layers.TokenAndPositionEmbedding(**embed_kw)(source)
    for _ in range(config.num_encoder_layers):
        x = layers.TransformerEncoder(config.ffn_dim, config.num_heads, dropout=config.dropout)(x)
    y = layers.TokenAndPositionEmbedding(**embed_kw)(target)
    for _ in range(config.num_decoder_layers):
        y = layers.TransformerDecoder(config.ffn_dim, config.num_heads,
                                      dropout=config.dropout)(y, x)
    return keras.Model([source, target], keras.layers.Dense(vocab)(y))


def mean_seconds(fn, iters: int):
    """A contender: ``iters`` calls of ``fn``, returning the seconds of one."""
    def run():
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) / iters
    return run


def train(payload: dict):
    """One train step (Adam, cross-entropy) of ours and of KerasHub's model."""
    config = preset(payload["preset"], vocab_size=payload["vocab"], **payload.get("overrides", {}))
    batch, length, vocab = payload["batch"], payload["length"], payload["vocab"]
    jit = bool(payload.get("xla", False))
    rng = np.random.default_rng(0)
    x = [rng.integers(4, vocab, (batch, length)).astype("int32") for _ in range(2)]
    y = rng.integers(4, vocab, (batch, length)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ours = build_model(config)
    # Ours with the optimizer class `train_nmt` uses (Keras's Adam step, as one fused kernel
    # under TensorFlow); the peer with Keras's Adam; the same loss.
    ours.compile(optimizer=GlobalClipAdam(), loss=loss, jit_compile=jit)
    peer = keras_hub_model(config)
    peer.compile(optimizer="adam", loss=loss, jit_compile=jit)
    feed = {"source": x[0], "target_in": x[1]}
    iters = payload["iters"]
    contenders = {"ours": mean_seconds(lambda: ours.train_on_batch(feed, y), iters),
                  "keras_hub": mean_seconds(lambda: peer.train_on_batch(x, y), iters)}
    return contenders, {
        "params": {"ours": ours.count_params(), "keras_hub": peer.count_params()},
        "model": {"layers": f"{config.num_encoder_layers}+{config.num_decoder_layers}",
                  "d_model": config.d_model, "heads": config.num_heads, "ffn": config.ffn_dim,
                  "dropout": config.dropout}}


def decode(payload: dict):
    """Greedy cached, cached + XLA, uncached and beam (+ XLA) in the same rounds."""
    config = preset(payload["preset"], vocab_size=payload["vocab"], dropout=0.0,
                    **payload.get("overrides", {}))
    model = build_model(config)
    vocab, sentences = payload["vocab"], payload["sentences"]
    source = np.random.default_rng(1).integers(
        4, vocab, (sentences, payload["source_length"])).astype("int32")
    source[:, -1] = EOS_ID
    kw = dict(max_length=payload["max_length"])
    cached = decoding.compile_search(model, "greedy", **kw)
    cached_xla = decoding.compile_search(model, "greedy", jit_compile=True, **kw)
    uncached = decoding.compile_search(model, "greedy_uncached", **kw)
    beam = decoding.compile_search(model, "beam", beam_size=payload["beam"], jit_compile=True,
                                   **kw)
    ids = np.asarray(cached(source))
    has_eos = (ids == EOS_ID).any(axis=1)
    lengths = np.where(has_eos, np.argmax(ids == EOS_ID, axis=1) + 1, ids.shape[1])
    contenders = {"greedy cached": lambda: cached(source).numpy(),
                  "greedy cached + XLA": lambda: cached_xla(source).numpy(),
                  "greedy uncached": lambda: uncached(source).numpy(),
                  "beam + XLA": lambda: beam(source).numpy()}
    return contenders, {
        "mean_generated_length": float(lengths.mean()),
        "model": {"layers": f"{config.num_encoder_layers}+{config.num_decoder_layers}",
                  "d_model": config.d_model}}


JOBS = {"train": train, "decode": decode}
PREPARED = {}  # a job's key -> its contenders


def prepare(payload: dict) -> dict:
    """Builds the job ``payload["job"]`` and calls each contender once (tracing, compiling)."""
    start, cpu = time.perf_counter(), time.process_time()
    contenders, meta = JOBS[payload["job"]](payload)
    for fn in contenders.values():
        fn()
    PREPARED[payload["key"]] = contenders
    print(f"job {payload['key']} ({payload['job']}) prepared: "
          f"{time.perf_counter() - start:.1f} s, {time.process_time() - cpu:.1f} CPU s",
          file=sys.stderr, flush=True)
    return {**meta, "onednn": ONEDNN}


def time_job(payload: dict) -> dict:
    """The times of a prepared job's contenders (`harness.alternate`); then forgets it."""
    contenders = PREPARED.pop(payload["key"])
    return harness.alternate(contenders, repeats=payload["repeats"], warmup=payload["warmup"])


if __name__ == "__main__":
    print(f"imported: {time.process_time():.1f} CPU s", file=sys.stderr, flush=True)
    workers.serve({"prepare": prepare, "time": time_job},
                  ready={"keras": keras.__version__, "backend": keras.backend.backend(),
                         "onednn": ONEDNN})
