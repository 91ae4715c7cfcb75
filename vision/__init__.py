"""DETR-style object detection on the shared Transformer layers of `tfx_transformer`.

- `vision.data`: sources (``embedded``, ``coco:``, ``tfds:``), augmentation, batching.
- `vision.modeling`: the model (``keras.ops`` only): backbone, query strategies, decoder-side
  refinement, heads, box maths, post-processing.
- `vision.matching`: the Hungarian matcher, its solvers and the set loss.
- `vision.training`: optimizer, ``train_detr``, evaluation and the SavedModel export.
- `vision.serving`: loading an export (``load_detector``), with TensorFlow alone.
- `vision.config` (``DetrConfig`` and presets) and `vision.plots` join them.
"""

__all__: list[str] = []
