"""Greedy and beam search over a `Seq2SeqTransformer` (`nlp.search.decoding` is the public
entry: `DecodingSettings`, `search`, `compile_search`)."""
