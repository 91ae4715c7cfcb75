"""The pieces that greedy and beam search (`nlp.search.greedy`, `nlp.search.beam`) share: the length
penalty, the token restrictions and limits, the start tokens, the per-layer attention caches,
one cached decoder step and the two-stage cached loop. The conventions are those of
`nlp.search.decoding`'s docstring. These are the search's own steps, public to the modules of
`nlp.search` (and the step benchmark); users call `nlp.search.decoding`.
"""

from __future__ import annotations

import functools

import keras
from keras import ops

NEG = -1e9  # "minus infinity" that keeps arithmetic finite; also the score of no hypothesis
FIRST_WIDTH_EXTRA = 8  # the cache starts min(N, S + S // 4 + FIRST_WIDTH_EXTRA) wide


def length_normalizer(length, length_penalty: float, convention: str = "gnmt"):
    """The length penalty: GNMT's ``((5 + length) / 6) ** length_penalty``, or
    transformers' ``length ** length_penalty`` (``convention="transformers"``)."""
    length = ops.cast(length, "float32")
    if convention == "transformers":
        return ops.power(length, length_penalty)
    return ops.power((5.0 + length) / 6.0, length_penalty)


def _restrict(model, logits, step, limit, forced_bos_id: int | None = None,
              forced_eos: bool = False):
    """Forbids the model's ``banned_ids`` everywhere, and all but eos from a row's last step
    (their logits become ``NEG``); with ``forced_bos_id``, the first step (``step == 0``) may
    only give that id, at log-probability 0 (transformers' ``forced_bos_token_id``: NLLB's
    target language); with ``forced_eos``, eos at a row's last step has log-probability 0
    (transformers' ``forced_eos_token_id``, which replaces the step's log-probabilities).

    ``logits`` ``(R, V)`` (logits or log-probabilities); ``limit`` ``(R,)``: each row's most
    tokens, eos included.
    """
    logits = ops.cast(logits, "float32")
    vocab = ops.arange(ops.shape(logits)[-1])
    banned = ops.zeros_like(vocab, "bool")
    for token in model.banned_ids:
        banned = banned | (vocab == token)
    last = ops.greater_equal(step, limit - 1)[:, None]  # (R, 1)
    banned = banned | (last & (vocab != model.eos_id))
    logits = ops.where(banned, NEG, logits)
    if forced_eos:
        logits = ops.where(last & (vocab == model.eos_id), 0.0, logits)
    if forced_bos_id is not None:
        forced = ops.where(vocab == forced_bos_id, 0.0, NEG)[None, :]  # (1, V)
        logits = ops.where(ops.equal(step, 0), forced, logits)
    return logits


def next_log_probs(model, logits, step, limit, renormalize: bool, forced_bos_id=None,
               convention: str = "gnmt"):
    """A step's log-probabilities ``(R, V)`` with `_restrict`'s restrictions: normalized over
    the ids that may be generated (``renormalize``), else over the whole vocabulary before the
    bans (their share lost; transformers' ``renormalize_logits=False``). One log-softmax,
    except for transformers' convention with ``renormalize``: normalize, ban, normalize again,
    its arithmetic kept bit for bit (one log-softmax over the allowed ids is the same up to
    rounding, and that rounding changed 1 of 100 beam translations of a base-size model).
    In transformers' convention the eos forced at a row's last step has log-probability 0
    whether or not the step is normalized again (its ``forced_eos_token_id``)."""
    if renormalize and convention != "transformers":
        return ops.log_softmax(_restrict(model, logits, step, limit, forced_bos_id), axis=-1)
    logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    logp = _restrict(model, logp, step, limit, forced_bos_id,
                     forced_eos=convention == "transformers")
    return ops.log_softmax(logp, axis=-1) if renormalize else logp


def _minimum(a, b):
    """``min(a, b)`` of two ints, either of which may be a scalar tensor."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


def prepare_source(model, source, max_length, extra_length):
    """The source as int32, the batch size, the buffer length ``N``, each sentence's limit
    ``(B,)`` (its own length + ``extra_length``, or ``max_length``), the first cache width
    (see the module docstring) and the encoder output."""
    source = ops.cast(source, "int32")
    batch, width = ops.shape(source)[0], ops.shape(source)[1]
    if max_length is None:
        lengths = ops.sum(ops.cast(ops.not_equal(source, model.source_pad_id), "int32"), axis=1)
        limit = lengths + extra_length
        max_length = width + extra_length
    else:
        limit = ops.full((batch,), max_length, "int32")
    first_width = _minimum(max_length, width + width // 4 + FIRST_WIDTH_EXTRA)
    memory, memory_mask = model.encode(source)
    return source, batch, max_length, limit, first_width, memory, memory_mask


def initial_tokens(model, batch, max_length, beam_size=None):
    """The decoder start id (bos) then pads: ``(B, max_length + 1)``, or
    ``(B, K, max_length + 1)`` for a beam."""
    if beam_size is None:
        shape = (batch, max_length + 1)
    else:
        shape = (batch, beam_size, max_length + 1)
    tokens = ops.full(shape, model.pad_id, "int32")
    bos = ops.full((*shape[:-1], 1), model.decoder_start_id, "int32")
    return ops.concatenate([bos, tokens[..., 1:]], axis=-1)


def empty_caches(model, batch, width):
    """Empty self-attention caches, one ``(2, R, H, width, D)`` per decoder layer."""
    return tuple(layer.empty_cache(batch, width) for layer in model.decoder.layers)


def cross_attention_caches(model, memory):
    """Cross-attention keys/values of ``memory``, one ``(2, R, H, S, D)`` per decoder layer."""
    return tuple(layer.compute_cross_attention_cache(memory) for layer in model.decoder.layers)


def cached_decoder_step(model, tokens, index, caches, cross, memory_mask):
    """``model.decode_step`` with one cache per decoder layer (`empty_caches`,
    `cross_attention_caches`): the same layers, in the same order, without stacking the caches
    at every step.

    Returns:
        Logits ``(R, V)`` (float32) and the updated caches.
    """
    x = model.embed_target(tokens, start_index=index)
    updated = []
    for layer, cache, cross_cache in zip(model.decoder.layers, caches, cross):
        out = layer(x, None, memory_mask=memory_mask, use_causal_mask=True, cache=cache,
                    cache_index=index, cross_attention_cache=cross_cache)
        x = out.output
        updated.append(out.cache)
    return model.project(model.decoder.normalize(x))[:, 0], tuple(updated)


def _while_loop(cond, body, state, shrinking=None):
    """``ops.while_loop``; ``shrinking`` ``{position: axis or axes}`` names the loop variables
    whose size on those axes may change from step to step (TensorFlow: a ``None`` shape
    invariant there; not for XLA, whose shapes are static)."""
    if not shrinking:
        return ops.while_loop(cond, body, state)
    import tensorflow as tf

    invariants = [tf.TensorShape(_unknown(x, shrinking.get(k))) for k, x in enumerate(state)]
    return tf.while_loop(cond, lambda *s: tuple(body(*s)), tuple(state),
                         shape_invariants=tuple(invariants))


def finished_dropper(drop_finished):
    """``drop_finished`` as given, or by default: the TensorFlow backend (where a loop's
    tensors may shrink; not with XLA: `nlp.search.decoding.compile_search` turns it off there)."""
    if drop_finished is None:
        return keras.backend.backend() == "tensorflow"
    return bool(drop_finished)


def run_cached_loop(cond, body, state, num_caches, first_width, max_length, shrinking=None):
    """``ops.while_loop`` whose state ends with ``num_caches`` self-attention caches
    ``(2, R, H, W, D)``.

    Runs while ``cond(W, *state)`` with the caches ``first_width`` wide, then pads them with
    zeros to ``max_length`` and runs on while ``cond(max_length, *state)`` (no step at all
    when the batch was decided within ``first_width``). ``shrinking``: see `_while_loop`; with
    it (TensorFlow), the caches' width is left unknown too and both loops call one
    `tf.function` of ``body``, traced once: a search's graph is built in about half the time.
    """
    if shrinking:
        shrinking = {**shrinking, **{k: (shrinking.get(k), 3)
                                     for k in range(len(state) - num_caches, len(state))}}
        body = _traced_once(body, state, shrinking)
    state = _while_loop(functools.partial(cond, first_width), body, state, shrinking)
    rest, caches = state[:-num_caches], state[-num_caches:]
    padding = [[0, 0], [0, 0], [0, 0], [0, max_length - first_width], [0, 0]]
    caches = tuple(ops.pad(cache, padding) for cache in caches)
    return _while_loop(functools.partial(cond, max_length), body, (*rest, *caches), shrinking)


def _unknown(x, axes):
    """``x``'s shape with the ``axes`` (an int, None, or a tuple of them) unknown."""
    shape = list(x.shape)
    for axis in axes if isinstance(axes, tuple) else (axes,):
        if axis is not None:
            shape[axis] = None
    return shape


def _traced_once(body, state, shrinking):
    """``body`` as a `tf.function` of loop variables shaped like ``state``, with the axes
    ``shrinking`` names unknown."""
    import tensorflow as tf

    specs = [tf.TensorSpec(_unknown(x, shrinking.get(k)), x.dtype)
             for k, x in enumerate(state)]
    return tf.function(lambda *s: tuple(body(*s)), input_signature=specs, autograph=False)
