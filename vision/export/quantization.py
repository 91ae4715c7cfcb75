"""What the quantized detector files keep in float, by model (`vision.export.litert_onnx`).

- LiteRT ``int8-full``: `FLOAT_OPS` (attention's activation-by-activation products, its mask
  and softmax, divisions); RT-DETR's also `RTDETR_FLOAT_OPS` and its LayerNorms
  (`layer_norm_tensors`); D-FINE's also its query selection, box heads and distribution
  refinement (`dfine_float_tensors`). `litert_float_parts` gives a model's operators and
  tensors.
- ONNX ``int8`` (dynamic quantization of the weights' products): RT-DETR's and D-FINE's query
  selection (`query_selection_nodes`, `onnx_float_nodes`).

Tensors and nodes are found by their names in the converted file (TensorFlow's name scopes:
the Keras layers' names).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# The LiteRT operators `int8-full` keeps in float (see `DetectorConverter.litert`).
FLOAT_OPS = ["BATCH_MATMUL", "SOFTMAX", "SELECT_V2", "DIV"]
# RT-DETR's: also its clips (the box clip would need its input's int8 scale), its LayerNorms'
# statistics (and, by name, the rest of each LayerNorm: `layer_norm_tensors`) and the
# logarithms and sigmoids between box logits and boxes.
RTDETR_FLOAT_OPS = FLOAT_OPS + ["MINIMUM", "MAXIMUM", "MEAN", "SQUARED_DIFFERENCE", "RSQRT",
                                "LOG", "LOGISTIC"]
# RT-DETR's (and D-FINE's) query selection: the encoder's output projection and class head,
# whose scores pick the top-k cells the decoder starts from. The quantized `int8` ONNX file
# keeps their products in float: in int8 they pick other cells (a D-FINE's AP50 fell by 0.013,
# with them float by 0.008: experiments/README.md).
QUERY_SELECTION = ("enc_output", "enc_score_head")
# D-FINE's `int8-full` also keeps in float its query selection, its box heads and the
# distribution refinement between them (the decoder's own operations: the edge logits' running
# sum, their softmax, the integral over the bins and the boxes): the tensors of
# `dfine_float_tensors` (AP50 fell by 0.015 with them in int8, by 0.008 without).
DECODER_OP = re.compile(r"^[^/]+/decoder(_\d+)?/(?!layer_|lqe|class_head|query_pos_head|"
                         r"pre_box_head|box_head)[^/]+$")


def litert_float_parts(model, float32: Callable[[], bytes]) -> tuple[list[str], list[str]]:
    """The LiteRT operators and tensors ``int8-full`` keeps in float for ``model``; ``float32``
    gives the model's float32 file (read for its tensor names, RT-DETR and D-FINE only)."""
    from vision.modeling.dfine import DFine
    from vision.modeling.rtdetr import RTDetr

    # RT-DETR: with its LayerNorms in int8 too, AP50 falls by 0.04; with its box
    # logits and sigmoids in int8 as well, by 0.39 (experiments/README.md).
    if not isinstance(model, RTDetr):
        return FLOAT_OPS, []
    nodes = layer_norm_tensors(float32())
    if isinstance(model, DFine):
        nodes += dfine_float_tensors(float32())
    return RTDETR_FLOAT_OPS, nodes


def onnx_float_nodes(model, proto) -> list[str]:
    """The ONNX nodes dynamic quantization leaves in float: RT-DETR's query selection."""
    from vision.modeling.rtdetr import RTDetr

    return query_selection_nodes(proto) if isinstance(model, RTDetr) else []


def query_selection_nodes(proto) -> list[str]:
    """The ONNX nodes of an RT-DETR graph's query selection (`QUERY_SELECTION`): those under
    its layers' name scopes."""
    return [node.name for node in proto.graph.node
            if any(f"/{name}_" in node.name or f"/{name}/" in node.name
                   for name in QUERY_SELECTION)]


def dfine_float_tensors(data: bytes) -> list[str]:
    """The tensors of a D-FINE LiteRT file that `int8-full` keeps in float: its query selection
    (`QUERY_SELECTION`), every box head (the encoder's, the pre-refinement one and each layer's)
    and the decoder's own operations between them (`DECODER_OP`)."""
    from ai_edge_litert.interpreter import Interpreter

    names = [detail["name"] for detail in Interpreter(model_content=data).get_tensor_details()]
    return [name for name in names
            if any(part in name for part in (*QUERY_SELECTION, "box_head"))
            or DECODER_OP.match(name.split(";")[0])]


def layer_norm_tensors(data: bytes) -> list[str]:
    """The tensors of a LiteRT file's LayerNorms: those under a name scope that holds a
    ``moments/`` scope (where the normalization computes its mean and variance)."""
    from ai_edge_litert.interpreter import Interpreter

    names = [detail["name"] for detail in Interpreter(model_content=data).get_tensor_details()]
    scopes = {part.split("/moments/")[0] + "/" for name in names for part in name.split(";")
              if "/moments/" in part}
    return [name for name in names
            if any(part.startswith(scope) for part in name.split(";") for scope in scopes)]
