"""Translation data.

- `nlp.data.sources`: the `--data` specs (`embedded`, `tsv:PATH`, `tfds:NAME`), their splits
  and loaders of `(source, target)` sentence pairs.
- `nlp.data.batching`: tokenized, length-bucketed batches by token budget for Keras `fit`.
- `nlp.data.embedded`: the offline English→German corpus (`num2words` and `babel`).
"""
