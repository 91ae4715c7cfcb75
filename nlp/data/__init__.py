"""Translation data.

- `nlp.data.sources`: the `--data` specs (`embedded`, `tsv:PATH`, `tfds:NAME`), their splits
  and loaders of `(source, target)` sentence pairs.
- `nlp.data.batching`: tokenized, length-bucketed batches by token budget for Keras `fit`.
- `nlp.data.embedded`: the offline English→German corpus, drawn from the phrase templates of
  `nlp.data.phrases` (`num2words` and `babel`).
"""
