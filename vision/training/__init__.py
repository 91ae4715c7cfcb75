"""Training and export: `train` (``train_detr``), `evaluate`
(pycocotools AP), `export` (writes the ``Detector`` SavedModel; `vision.export.load` loads it)."""

__all__: list[str] = []
