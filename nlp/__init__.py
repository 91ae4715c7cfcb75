"""Neural machine translation on the shared Transformer layers of `tfx_transformer`.

Importing it registers the classes a translation run saves with Keras (`tfx_transformer.
registry`), so ``keras.saving.load_model("runs/nmt/model.keras")`` reads a run's model; no
Keras or TensorFlow is imported until then.
"""

from tfx_transformer.registry import register_lazily

register_lazily({"nlp>Seq2SeqTransformer": "nlp.model",
                 "nlp>MaskedAccuracy": "nlp.losses",
                 "nlp>MaskedLabelSmoothedCrossEntropy": "nlp.losses"})

__all__: list[str] = []
