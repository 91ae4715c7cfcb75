"""The special ids of every vocabulary: pad 0, unk 1, bos 2, eos 3, defined here and nowhere else.

The model, the searches and the losses import them from here (without loading SentencePiece);
`nlp.text.vocabulary.train_tokenizer` trains every vocabulary with them and
`nlp.text.tokenizer.Tokenizer` refuses a model that has others.
"""

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "SPECIAL_PIECES", "UNK_ID"]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")  # the pieces of ids 0-3
