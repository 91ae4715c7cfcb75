"""The translation model, `keras.ops` only: `Seq2SeqTransformer` and its losses."""
