"""Detection data: `--data` sources, their records, augmentation and padded Keras batches.

- `vision.data.sources`: `load_source(spec)` -> `DetectionSource` (``embedded``, ``coco:``,
  ``tfds:``), `parse_data_spec`, `evaluation_split`.
- `vision.data.shapes`, `vision.data.coco`, `vision.data.tfds_source`: the three kinds of
  source.
- `vision.data.augment`: DETR's resize, flip and crop; `vision.data.batching`:
  `make_batches` (records -> padded batches) and the object limit (`ObjectLimit`).

The model side (`vision.modeling.detr`, `vision.modeling.queries`, ...) never imports this package,
nor this
package the model: only the trainer, the evaluation and the export join them.
"""
