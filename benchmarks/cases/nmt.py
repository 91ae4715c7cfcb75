"""Translation speed: our model against KerasHub's, cached against uncached decoding, beam
against greedy. Prints ``ratio = ours / peer`` (lower is better), medians of alternating runs.

    pip install -e '.[bench]'
    python benchmarks/nmt.py [--presets tiny,base] [--repeats 5] [--xla]

(a) one train step (Adam, cross-entropy, no XLA: Keras's default on a CPU; ours with
    `GlobalClipAdam`, the optimizer class of ``train_nmt``, the peer with Keras's Adam) of
    ``Seq2SeqTransformer`` against the same-size model built from
    ``keras_hub.layers.TokenAndPositionEmbedding``, ``TransformerEncoder`` and
    ``TransformerDecoder``: vocabulary 8000, length 40; tiny 2+2 layers d 128 batch 64, base
    6+6 layers d 512 batch 16. With ``--xla`` also both steps XLA-compiled.
(b) greedy decoding of 64 tokens for 32 sentences: KV cache against re-running the decoder
    over the whole prefix each step (both one compiled ``tf.function`` loop), the cached one
    also XLA-compiled as the exported translator runs it (the uncached prefix grows, so XLA
    cannot compile it).
(c) beam search (width 4) against greedy, both cached and XLA-compiled.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfx_transformer.quiet import onednn_default  # noqa: E402

onednn_default()  # TensorFlow's oneDNN kernels, as the training commands run them

import keras  # noqa: E402
import numpy as np  # noqa: E402

from nlp.config import preset  # noqa: E402
from nlp.modeling.model import build_model  # noqa: E402
from nlp.search import decoding  # noqa: E402
from nlp.text.special_ids import EOS_ID  # noqa: E402
from tfx_transformer.replicas import GlobalClipAdam  # noqa: E402

VOCAB, LENGTH = 8000, 40
SIZES = {"tiny": 64, "base": 16}  # batch size per preset


def keras_hub_model(config):
    """The same-size encoder-decoder from KerasHub layers (untied output projection)."""
    import keras_hub

    layers = keras_hub.layers
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    embed_kw = dict(vocabulary_size=VOCAB, sequence_length=512, embedding_dim=config.d_model)
    x = layers.TokenAndPositionEmbedding(**embed_kw)(source)
    for _ in range(config.num_encoder_layers):
        x = layers.TransformerEncoder(config.ffn_dim, config.num_heads, dropout=config.dropout)(x)
    y = layers.TokenAndPositionEmbedding(**embed_kw)(target)
    for _ in range(config.num_decoder_layers):
        y = layers.TransformerDecoder(config.ffn_dim, config.num_heads,
                                      dropout=config.dropout)(y, x)
    return keras.Model([source, target], keras.layers.Dense(VOCAB)(y))


def median_ratio(fn_ours, fn_peer, repeats: int, iters: int = 3):
    """Alternates the two; returns (median ours s, median peer s, median of ratios)."""
    for fn in (fn_ours, fn_peer):
        fn()  # compile / warm up
    ours, peer = [], []
    for _ in range(repeats):
        for fn, out in ((fn_ours, ours), (fn_peer, peer)):
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - start) / iters)
    ratios = [a / b for a, b in zip(ours, peer)]
    return statistics.median(ours), statistics.median(peer), statistics.median(ratios)


def train_step_case(name: str, repeats: int, jit_compile: bool = False):
    config = preset(name, vocab_size=VOCAB)
    batch = SIZES[name]
    rng = np.random.default_rng(0)
    x = [rng.integers(4, VOCAB, (batch, LENGTH)).astype("int32") for _ in range(2)]
    y = rng.integers(4, VOCAB, (batch, LENGTH)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ours = build_model(config)
    # Ours with the optimizer class `train_nmt` uses (Keras's Adam step, as one fused kernel
    # under TensorFlow); the peer with Keras's Adam; the same loss.
    ours.compile(optimizer=GlobalClipAdam(), loss=loss, jit_compile=jit_compile)
    peer = keras_hub_model(config)
    peer.compile(optimizer="adam", loss=loss, jit_compile=jit_compile)
    feed = {"source": x[0], "target_in": x[1]}
    print(f"params: ours {ours.count_params():,} (tied embeddings), "
          f"keras_hub {peer.count_params():,}")
    return median_ratio(lambda: ours.train_on_batch(feed, y),
                        lambda: peer.train_on_batch(x, y), repeats)


def decoding_cases(repeats: int):
    config = preset("tiny", vocab_size=VOCAB, dropout=0.0)
    model = build_model(config)
    source = np.random.default_rng(1).integers(4, VOCAB, (32, 20)).astype("int32")
    source[:, -1] = EOS_ID
    kw = dict(max_length=64)
    cached = decoding.compile_search(model, "greedy", **kw)
    cached_xla = decoding.compile_search(model, "greedy", jit_compile=True, **kw)
    uncached = decoding.compile_search(model, "greedy_uncached", **kw)
    beam = decoding.compile_search(model, "beam", beam_size=4, jit_compile=True, **kw)
    lengths = np.argmax(np.asarray(cached(source)) == EOS_ID, axis=1) + 1
    print(f"decoding: 32 sentences, mean generated length {lengths.mean():.1f} of 64")
    return {
        "greedy cached vs uncached": median_ratio(lambda: cached(source).numpy(),
                                                  lambda: uncached(source).numpy(), repeats, 1),
        "greedy cached+XLA vs uncached": median_ratio(lambda: cached_xla(source).numpy(),
                                                      lambda: uncached(source).numpy(),
                                                      repeats, 1),
        "beam 4 vs greedy (both XLA)": median_ratio(lambda: beam(source).numpy(),
                                                    lambda: cached_xla(source).numpy(),
                                                    repeats, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,base")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--xla", action="store_true", help="also the XLA-compiled train steps")
    args = parser.parse_args(argv)
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, "
          f"{platform.machine()}, {os.cpu_count()} cores, oneDNN {onednn_default()}")
    rows = []
    for name in args.presets.split(","):
        rows.append((f"train step {name} vs keras_hub", *train_step_case(name, args.repeats)))
        if args.xla:
            rows.append((f"train step {name}, both XLA", *train_step_case(name, args.repeats,
                                                                          jit_compile=True)))
    for label, result in decoding_cases(args.repeats).items():
        rows.append((label, *result))
    print(f"{'case':<34}{'ours ms':>10}{'peer ms':>10}{'ratio':>8}")
    for label, ours, peer, ratio in rows:
        print(f"{label:<34}{ours * 1e3:>10.1f}{peer * 1e3:>10.1f}{ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
