"""Published detectors and starting weights: DETR's checkpoints, transformers' RT-DETR and
D-FINE folders, and `--init-from`."""
