"""DETR-style object detection on the shared Transformer layers of `tfx_transformer`.

- `vision.data`: sources (``embedded``, ``coco:``, ``tfds:``), augmentation, batching.
- `vision.modeling`: the model (``keras.ops`` only): backbone, query strategies, decoder-side
  refinement, heads, box maths, post-processing.
- `vision.matching`: the Hungarian matcher, its solvers and the set loss.
- `vision.training`: ``train_detr`` and evaluation.
- `vision.export`: the Detector SavedModel (written, and loaded with TensorFlow alone:
  ``load_detector``), its LiteRT and ONNX files.
- `vision.pretrained`: published checkpoints and folders, ``--init-from``.
- `vision.commands`: the installed commands.
- `vision.config` (``DetrConfig`` and presets) and `vision.plots` join them.
"""

from tfx_transformer.registry import register_lazily

# Importing the package registers the classes a run saves with Keras (`tfx_transformer.
# registry`): ``keras.saving.load_model("runs/detr/model.keras")`` reads a run's model.
register_lazily({f"vision>{name}": f"vision.{module}" for module, names in {
    "modeling.detr": ("DETR",),
    "modeling.backbone": ("TinyBackbone", "ValidBatchNorm"),
    "modeling.resnet": ("ResNetBackbone",),
    "modeling.heads": ("MLP",),
    "modeling.denoising": ("ContrastiveDenoising", "RTDetrDenoising"),
    "modeling.queries": ("LearnedQueries", "MixedQueries", "ReferenceQueries",
                         "TwoStageQueries"),
    "matching.matcher": ("HungarianMatcher",),
    "matching.losses": ("SetCriterion",),
    "modeling.optimizer": ("DetrAdamW",),
    "modeling.rtdetr": ("RTDetr",),
    "modeling.rtdetr_backbone": ("RTDetrResNetBackbone",),
    "modeling.hybrid_encoder": ("ConvNorm", "CSPRepLayer", "HybridEncoder", "RepVggBlock"),
    "modeling.rtdetr_decoder": ("RTDetrDecoder", "RTDetrDecoderLayer"),
    "modeling.dfine": ("DFine",),
    "modeling.hgnetv2": ("HGNetV2Backbone",),
    "modeling.dfine_encoder": ("DFineHybridEncoder", "RepNCSPELAN4", "SCDown"),
    "modeling.dfine_decoder": ("DFineDecoder", "DFineDecoderLayer"),
    "matching.fdr_losses": ("DFineCriterion",),
}.items() for name in names})

__all__: list[str] = []
