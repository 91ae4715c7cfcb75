"""The detector's model side (``keras.ops`` only): `detr` (``DETR``, ``build_model``) composed of
`backbone`, `queries` (one layer per query strategy), `refinement` (the decoder side), `heads`,
`geometry` and `init`; box maths in `box_ops`; model outputs to detections in `postprocess`;
how it trains under ``fit`` in `set_loss` (the set criterion as its loss) and `optimizer`
(DETR's AdamW, which a compiled model saves with it)."""

__all__: list[str] = []
