"""Training and export: `train` (``train_detr``), `evaluate`
(pycocotools AP), `export` (writes the ``Detector`` SavedModel; `vision.serving` loads it)."""

__all__: list[str] = []
