"""Sentences and a vocabulary view the tokenizer and vocabulary tests share."""

SENTENCES = [
    "Ich habe einundzwanzig Äpfel.",
    "Die Straße ist schön.",
    "I have twenty-one apples.",
    "The meeting is on March 3, 2021.",
]


def vocabulary(tokenizer) -> set:
    """Every piece of ``tokenizer``'s vocabulary."""
    return {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}
