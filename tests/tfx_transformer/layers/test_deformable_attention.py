"""``MultiScaleDeformableAttention`` against a NumPy transcription and transformers' modules.

The NumPy reference below samples each point with explicit loops and the bilinear formula
``(1 - |px - i|) (1 - |py - j|)`` over the pixels around it, skipping those outside the map
(torch's ``grid_sample(align_corners=False, padding_mode="zeros")``). transformers'
``RTDetrMultiscaleDeformableAttention`` and ``DFineMultiscaleDeformableAttention`` run at
random weights in a process of their own (reference_deformable_attention.py); the layer,
given the same weights, must give their outputs within 1e-5.
"""

import importlib.util

import numpy as np
import pytest

import tfx_transformer as tt
from tfx_transformer.layers.testing import check_layer

SHAPES = [(3, 4), (2, 3)]  # (height, width) of each level
LENGTH = sum(h * w for h, w in SHAPES)
DENSES = ("sampling_offsets", "attention_weights", "value_proj", "output_proj")


# --- The NumPy transcription ---

def _sample(feature, x, y, method, pixel_centre=0.5):
    """``feature`` ``(h, w, D)`` at the normalized location ``(x, y)``."""
    h, w, _ = feature.shape
    if method == "discrete":
        i = min(max(int(np.floor(y * h + 0.5)), 0), h - 1)
        j = min(max(int(np.floor(x * w + 0.5)), 0), w - 1)
        return feature[i, j]
    px, py = x * w - pixel_centre, y * h - pixel_centre  # pixel (i, j) has its centre at (j, i)
    total = np.zeros(feature.shape[-1])
    for i in range(int(np.floor(py)), int(np.floor(py)) + 2):
        for j in range(int(np.floor(px)), int(np.floor(px)) + 2):
            if 0 <= i < h and 0 <= j < w:
                total += (1 - abs(px - j)) * (1 - abs(py - i)) * feature[i, j]
    return total


def numpy_attention(params, query, value, reference, heads, points, offset_scale=0.5,
                    method="default", mask=None, pixel_centre=0.5):
    """The layer's output, point by point; ``params`` in PyTorch's ``(out, in)`` layout."""
    def linear(x, name):
        return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]

    projections = "value_proj.weight" in params
    value = linear(value, "value_proj") if projections else value.astype("float64")
    if mask is not None:
        value = value * mask[..., None]
    batch, queries, _ = query.shape
    total, head_dim = sum(points), value.shape[-1] // heads
    offsets = linear(query, "sampling_offsets").reshape(batch, queries, heads, total, 2)
    logits = linear(query, "attention_weights").reshape(batch, queries, heads, total)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    if reference.ndim == 3:
        reference = reference[:, :, None]
    starts = np.cumsum([0] + [h * w for h, w in SHAPES])
    out = np.zeros((batch, queries, heads, head_dim))
    for b in range(batch):
        for q in range(queries):
            for head in range(heads):
                p = 0
                for level, (h, w) in enumerate(SHAPES):
                    feature = value[b, starts[level]:starts[level + 1],
                                    head * head_dim:(head + 1) * head_dim].reshape(h, w, -1)
                    ref = reference[b, q, level if reference.shape[2] > 1 else 0]
                    for _ in range(points[level]):
                        offset = offsets[b, q, head, p]
                        if len(ref) == 2:
                            x, y = ref + offset / np.array([w, h])
                        else:
                            x, y = ref[:2] + offset / points[level] * ref[2:] * offset_scale
                        out[b, q, head] += weights[b, q, head, p] * _sample(
                            feature, x, y, method, pixel_centre)
                        p += 1
    out = out.reshape(batch, queries, heads * head_dim)
    return linear(out, "output_proj") if projections else out


def load(layer, params):
    """Copies PyTorch ``nn.Linear`` parameters onto the layer's Dense layers of the same name."""
    for name in DENSES:
        if f"{name}.weight" in params:
            getattr(layer, name).kernel.assign(params[f"{name}.weight"].T)
            getattr(layer, name).bias.assign(params[f"{name}.bias"])


def random_params(rng, d, heads, points, projections=True, offset_std=2.0):
    total = sum(points)
    sizes = {"sampling_offsets": heads * total * 2, "attention_weights": heads * total}
    if projections:
        sizes.update(value_proj=d, output_proj=d)
    params = {}
    for name, units in sizes.items():
        params[f"{name}.weight"] = rng.normal(size=(units, d)) * 0.4
        params[f"{name}.bias"] = rng.normal(size=units) * (
            offset_std if name == "sampling_offsets" else 0.4)
    return {k: v.astype("float32") for k, v in params.items()}


def run_layer(params, query, value, reference, heads, points, **kwargs):
    mask = kwargs.pop("mask", None)
    layer = tt.MultiScaleDeformableAttention(
        num_heads=heads, num_levels=len(SHAPES), num_points=points,
        use_projections="value_proj.weight" in params, **kwargs)
    layer(query, value, reference, spatial_shapes=SHAPES)
    load(layer, params)
    return np.asarray(layer(query, value, reference, spatial_shapes=SHAPES,
                            value_mask=mask).output)


# Normalized coordinates on every kind of place: pixel centres, the map's borders, just
# inside and just outside the half-pixel band where one neighbour is outside, far away.
SPECIAL = np.array([0.0, 1.0, 0.125, 0.5, 0.9999, -0.1, -0.125, -0.2, 1.1, 1.125, 1.3, 3.0, -2.0,
                    1e9, -1e9, 0.37])


def test_special_locations_match_the_numpy_bilinear_formula():
    rng = np.random.default_rng(1)
    queries = len(SPECIAL) ** 2 // 2
    xs, ys = np.meshgrid(SPECIAL, SPECIAL)
    reference = np.stack([xs, ys], -1).reshape(2, queries, 1, 2).repeat(2, 2).astype("float32")
    reference[:, :, 1] = reference[:, ::-1, 1]  # the other level at other places
    params = random_params(rng, 8, 2, [1, 1], projections=False)
    params["sampling_offsets.weight"][:] = 0.0  # the locations are the references
    params["sampling_offsets.bias"][:] = 0.0
    query = rng.normal(size=(2, queries, 8)).astype("float32")
    value = rng.normal(size=(2, LENGTH, 8)).astype("float32")
    got = run_layer(params, query, value, reference, 2, [1, 1])
    want = numpy_attention(params, query, value, reference, 2, [1, 1])
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The test can fail: with pixel centres on integer coordinates (align_corners-like), or
    # with the nearest pixel, the NumPy answer is another one.
    for other in (dict(pixel_centre=0.0), dict(method="discrete")):
        wrong = numpy_attention(params, query, value, reference, 2, [1, 1], **other)
        assert np.abs(got - wrong).max() > 0.1


@pytest.mark.parametrize("case", [
    dict(coords=2, levels=2, points=[2, 2]),
    dict(coords=4, levels=1, points=[3, 1], offset_scale=0.7, mask=True),
    dict(coords=4, levels=2, points=[2, 3], projections=False, method="discrete"),
    dict(coords=2, levels=0, points=[2, 2], mask=True),
])
def test_random_weights_match_the_numpy_transcription(case):
    rng = np.random.default_rng(2)
    points, heads = case["points"], 2
    params = random_params(rng, 8, heads, points, case.get("projections", True))
    query = rng.normal(size=(2, 3, 8)).astype("float32")
    value = rng.normal(size=(2, LENGTH, 8)).astype("float32")
    shape = (2, 3, case["levels"], case["coords"]) if case["levels"] else (2, 3, case["coords"])
    reference = rng.uniform(-0.2, 1.2, size=shape).astype("float32")
    kwargs = {k: case[k] for k in ("offset_scale", "method") if k in case}
    mask = rng.uniform(size=(2, LENGTH)) > 0.3 if case.get("mask") else None
    got = run_layer(params, query, value, reference, heads, points, mask=mask, **kwargs)
    want = numpy_attention(params, query, value, reference, heads, points, mask=mask, **kwargs)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.fixture(scope="module")
def transformers_cases(torch_references):
    path = torch_references["deformable_attention"]  # reference_deformable_attention.py's
    arrays = dict(np.load(path))
    assert [tuple(s) for s in arrays.pop("spatial_shapes")] == SHAPES
    cases = {}
    for key, array in arrays.items():
        case, name = key.split("/")
        cases.setdefault(case, {})[name] = array
    return cases


TRANSFORMERS_CASES = {  # case -> layer arguments (as reference_deformable_attention.CASES)
    "rtdetr_points": dict(num_points=3),
    "rtdetr_boxes": dict(num_points=3),
    "dfine_default": dict(num_points=[3, 2], offset_scale=0.7, use_projections=False),
    "dfine_discrete": dict(num_points=[3, 2], offset_scale=0.7, use_projections=False,
                           method="discrete"),
}


@pytest.mark.xdist_group("torch_reference")  # one worker makes the references
@pytest.mark.parametrize("case", sorted(TRANSFORMERS_CASES))
def test_transformers_deformable_attention_at_random_weights(transformers_cases, case):
    arrays = transformers_cases[case]
    layer = tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2,
                                             **TRANSFORMERS_CASES[case])
    inputs = (arrays["query"], arrays["value"], arrays["reference_points"])
    layer(*inputs, spatial_shapes=SHAPES)
    load(layer, arrays)
    got = np.asarray(layer(*inputs, spatial_shapes=SHAPES,
                           value_mask=arrays.get("value_mask")).output)
    np.testing.assert_allclose(got, arrays["output"], atol=1e-5)
    # The comparison can fail: x and y offsets swapped give other outputs.
    kernel = layer.sampling_offsets.kernel
    kernel.assign(np.asarray(kernel).reshape(16, -1, 2)[..., ::-1].reshape(16, -1))
    swapped = np.asarray(layer(*inputs, spatial_shapes=SHAPES,
                               value_mask=arrays.get("value_mask")).output)
    assert np.abs(swapped - arrays["output"]).max() > 1e-2


def test_spatial_shapes_may_be_tensors_of_a_traced_image_size():
    import tensorflow as tf

    rng = np.random.default_rng(5)
    layer = tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2, num_points=[2, 1])
    inputs = [rng.normal(size=(2, 3, 8)), rng.normal(size=(2, LENGTH, 8)),
              rng.uniform(-0.2, 1.2, size=(2, 3, 2, 2))]
    inputs = [x.astype("float32") for x in inputs]
    layer(*inputs, spatial_shapes=SHAPES)
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape) * 0.5)
    want = np.asarray(layer(*inputs, spatial_shapes=SHAPES).output)

    @tf.function(input_signature=[tf.TensorSpec((None, None, 8)), tf.TensorSpec((None, None, 8)),
                                  tf.TensorSpec((None, None, 2, 2)),
                                  tf.TensorSpec((2, 2), tf.int32)])
    def traced(q, v, r, shapes):
        return layer(q, v, r, spatial_shapes=[(shapes[i, 0], shapes[i, 1]) for i in (0, 1)]).output

    got = traced(*inputs, np.array(SHAPES, "int32"))
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_initial_offsets_point_each_head_its_own_way():
    layer = tt.MultiScaleDeformableAttention(num_heads=4, num_levels=2, num_points=[2, 1])
    layer(np.zeros((1, 1, 8), "float32"), np.zeros((1, LENGTH, 8), "float32"),
          np.full((1, 1, 2), 0.5, "float32"), spatial_shapes=SHAPES)
    bias = np.asarray(layer.sampling_offsets.bias).reshape(4, 3, 2)  # (head, point, xy)
    steps = np.array([1, 2, 1])[:, None]
    np.testing.assert_allclose(bias, np.array([[1, 0], [0, 1], [-1, 0], [0, -1]])[:, None]
                               * steps, atol=1e-6)
    assert not np.any(layer.sampling_offsets.kernel) and not np.any(layer.attention_weights.kernel)


def test_layer_contract_and_attention_weights():
    rng = np.random.default_rng(3)
    inputs = {"query": rng.normal(size=(2, 4, 8)).astype("float32"),
              "value": rng.normal(size=(2, LENGTH, 8)).astype("float32"),
              "reference_points": rng.uniform(size=(2, 4, 4)).astype("float32"),
              "value_mask": rng.uniform(size=(2, LENGTH)) > 0.2}
    check_layer(tt.MultiScaleDeformableAttention,
                dict(num_heads=2, num_levels=2, num_points=[2, 3], offset_scale=0.7),
                inputs, {"spatial_shapes": SHAPES}, expected_output_shape=(2, 4, 8))
    layer = tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2, method="discrete")
    result = layer(*list(inputs.values())[:3], spatial_shapes=SHAPES,
                   return_attention_scores=True)
    assert result.attention.shape == (2, 2, 4, 8)  # (B, H, Q, levels * points)
    np.testing.assert_allclose(np.asarray(result.attention).sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("kwargs,message", [
    (dict(spatial_shapes=[(3, 4)]), "spatial_shapes"),
    (dict(spatial_shapes=[(3, 4), (2, 2)]), "sum"),
    (dict(spatial_shapes=SHAPES, reference=(2, 1, 3, 2)), "reference_points"),
])
def test_bad_inputs_name_the_argument(kwargs, message):
    layer = tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2)
    reference = np.zeros(kwargs.pop("reference", (2, 1, 2)), "float32")
    with pytest.raises(ValueError, match=message):
        layer(np.zeros((2, 1, 8), "float32"), np.zeros((2, LENGTH, 8), "float32"), reference,
              **kwargs)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_points"):
        tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2, num_points=[2])
    with pytest.raises(ValueError, match="method"):
        tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2, method="nearest")


def test_litert_builtins_hold_the_sampling(tmp_path):
    """Converted with TensorFlow Lite's builtin operators only (no grid_sample, no Flex), the
    layer gives the Keras outputs."""
    if importlib.util.find_spec("ai_edge_litert") is None:
        pytest.skip("ai-edge-litert is not installed (make test installs it)")
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    from tfx_transformer.saved_model import write_saved_model

    rng = np.random.default_rng(4)
    layer = tt.MultiScaleDeformableAttention(num_heads=2, num_levels=2, num_points=[2, 3])
    inputs = [rng.normal(size=(1, 4, 8)), rng.normal(size=(1, LENGTH, 8)),
              rng.uniform(-0.2, 1.2, size=(1, 4, 4))]
    inputs = [x.astype("float32") for x in inputs]
    layer(*inputs, spatial_shapes=SHAPES)
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape) * 0.5)
    want = np.asarray(layer(*inputs, spatial_shapes=SHAPES).output)
    signature = [tf.TensorSpec(x.shape, name=n) for x, n in zip(inputs, ("q", "v", "r"))]
    write_saved_model(tmp_path, layer, [
        ("serving_default", lambda q, v, r: layer(q, v, r, spatial_shapes=SHAPES).output,
         signature)])
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    runner = Interpreter(model_content=converter.convert()).get_signature_runner()
    got = next(iter(runner(q=inputs[0], v=inputs[1], r=inputs[2]).values()))
    np.testing.assert_allclose(got, want, atol=1e-5)
