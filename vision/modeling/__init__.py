"""The detector's model side (``keras.ops`` only): `detr` (``DETR``, ``build_model``) composed of
`backbone`, `queries` (one layer per query strategy), `refinement` (the decoder side), `heads`,
`geometry` and `init`; box maths in `box_ops`; model outputs to detections in `postprocess`."""

__all__: list[str] = []
