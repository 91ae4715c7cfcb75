"""Text to ids and back: the SentencePiece vocabulary and tokenizer, the special ids, and the
tokenizers of the published families (OPUS-MT, NLLB)."""
