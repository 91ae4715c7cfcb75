"""Training and export: `optimizer` (DETR's AdamW), `train` (``train_detr``), `evaluate`
(pycocotools AP), `export` (the ``Detector`` SavedModel and its loader)."""

__all__: list[str] = []
