"""Neural machine translation on the shared Transformer layers of `tfx_transformer`.

- `nlp.data`: sources (``embedded``, ``tsv:``, ``tfds:``) and token-budget batching.
- `nlp.text`: the SentencePiece vocabulary and tokenizers, the published families' tokenizers.
- `nlp.modeling`: ``Seq2SeqTransformer`` and its losses (``keras.ops`` only).
- `nlp.search`: greedy and beam search (``nlp.search.decoding``).
- `nlp.training`: ``train_nmt``, its callbacks, BLEU and chrF.
- `nlp.export`: the Translator SavedModel (written, and loaded with TensorFlow alone:
  ``load_translator``) and the CTranslate2 model directory.
- `nlp.pretrained`: OPUS-MT and NLLB-200 folders, Hub ids, the converted model directory.
- `nlp.commands`: the installed commands.
- `nlp.config` (``NMTConfig`` and presets) and `nlp.plots` join them.

Importing it registers the classes a translation run saves with Keras (`tfx_transformer.
registry`), so ``keras.saving.load_model("runs/nmt/model.keras")`` reads a run's model; no
Keras or TensorFlow is imported until then.
"""

from tfx_transformer.registry import register_lazily

register_lazily({"nlp>Seq2SeqTransformer": "nlp.modeling.model",
                 "nlp>MaskedAccuracy": "nlp.modeling.losses",
                 "nlp>MaskedLabelSmoothedCrossEntropy": "nlp.modeling.losses"})

__all__: list[str] = []
