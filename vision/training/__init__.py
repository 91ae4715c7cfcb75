"""Training and export: `optimizer` (DETR's AdamW), `train` (``train_detr``), `evaluate`
(pycocotools AP), `export` (writes the ``Detector`` SavedModel; `vision.serving` loads it)."""

__all__: list[str] = []
