"""Training a translator (`train_nmt`, `TranslationTask`), its callbacks and its evaluation."""
