"""DETR-style object detection on the shared Transformer layers of `tfx_transformer`.

- Data, `vision.data`: sources (``embedded``, ``coco:``, ``tfds:``), augmentation, batching.
- Model: `vision.model` (``DETR``, ``build_model``, ``build_criterion``) composed of
  `vision.backbone`, `vision.queries` (query strategies), `vision.refinement` (the decoder
  side), `vision.heads`, `vision.geometry` and `vision.init`; the loss is `vision.losses`
  with `vision.matcher` and `vision.assignment`; boxes in `vision.box_ops`.
- Training and use: `vision.config`, `vision.optimizer`, `vision.train`, `vision.evaluate`,
  `vision.postprocess`, `vision.export`, `vision.plots`, and `vision.legacy` for files saved
  before the query layers.
"""
