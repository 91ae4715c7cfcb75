"""Quick start: a tiny encoder-decoder built from the shared layers learns to copy sequences.

Runs offline on a CPU in a few minutes and prints the held-out accuracy of greedy decoding
with the KV cache.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import tfx_transformer as tt  # noqa: E402

PAD, BOS, VOCAB, LENGTH, D_MODEL = 0, 1, 16, 10, 64


def copy_data(n: int, seed: int):
    """Random token sequences (ids 2..VOCAB-1); the target is the source itself."""
    rng = np.random.default_rng(seed)
    src = rng.integers(2, VOCAB, size=(n, LENGTH)).astype("int32")
    tgt_in = np.concatenate([np.full((n, 1), BOS, "int32"), src[:, :-1]], axis=1)
    return {"source": src, "target_in": tgt_in}, src


def build_model():
    """Embedding + sinusoidal positions -> encoder -> causal decoder -> logits."""
    embed = keras.layers.Embedding(VOCAB, D_MODEL, name="embedding")
    positions = tt.SinusoidalPositionEncoding(max_length=64)
    encoder = tt.TransformerEncoder(2, num_heads=4, hidden_dim=128, dropout=0.0, name="encoder")
    decoder = tt.TransformerDecoder(2, num_heads=4, hidden_dim=128, dropout=0.0, name="decoder")
    logits = keras.layers.Dense(VOCAB, name="logits")
    source = keras.Input((None,), dtype="int32", name="source")
    target_in = keras.Input((None,), dtype="int32", name="target_in")
    x = embed(source)
    memory = encoder(x + positions(x))
    y = embed(target_in)
    model = keras.Model(
        [source, target_in], logits(decoder(y + positions(y), memory, use_causal_mask=True))
    )
    return model, (embed, positions, encoder, decoder, logits)


def greedy_decode(parts, source):
    """Greedy decoding, one token per step, with the decoder's KV cache."""
    embed, positions, encoder, decoder, logits = parts
    x = embed(source)
    memory = encoder(x + positions(x))
    cross = decoder.compute_cross_attention_cache(memory)
    cache = decoder.empty_cache(source.shape[0], LENGTH)
    token = ops.full((source.shape[0], 1), BOS, "int32")
    out = []
    for t in range(LENGTH):
        y = embed(token)
        h, cache = decoder(y + positions(y, start_index=t), None, use_causal_mask=True,
                           cache=cache, cache_index=t, cross_attention_cache=cross)
        token = ops.cast(ops.argmax(logits(h), axis=-1), "int32")
        out.append(token)
    return ops.convert_to_numpy(ops.concatenate(out, axis=1))


class TimeLimit(keras.callbacks.Callback):
    def __init__(self, seconds: float):
        super().__init__()
        self.deadline = time.time() + seconds

    def on_train_batch_end(self, batch, logs=None):
        if time.time() > self.deadline:
            self.model.stop_training = True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=2.0, help="training time budget")
    parser.add_argument("--steps", type=int, default=1500, help="most training steps")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.steps <= 0:
        parser.error("--minutes and --steps must be positive")
    keras.utils.set_random_seed(0)
    model, parts = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(tt.NoamSchedule(D_MODEL, 200, scale=2.0), 0.9, 0.98, 1e-9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    x, y = copy_data(64 * args.steps, seed=1)
    model.fit(x, y, batch_size=64, epochs=1, callbacks=[TimeLimit(args.minutes * 60)])
    test_x, test_y = copy_data(256, seed=2)
    pred = greedy_decode(parts, test_x["source"])
    print(f"copy task, greedy decoding with KV cache on 256 held-out sequences: "
          f"token accuracy {np.mean(pred == test_y):.3f}, "
          f"sequence accuracy {np.mean(np.all(pred == test_y, axis=1)):.3f}")
    print("example:", test_x["source"][0].tolist(), "->", pred[0].tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
