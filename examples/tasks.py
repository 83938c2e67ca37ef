"""The two tasks the examples train on, with no Keras in them: scikit-learn's digits and a counting task.

Not a recipe itself: `qat_digits.py`, `qat_transformer.py` and `relu_to_gelu.py` import it.
"""

import numpy as np

SEQUENCE_LENGTH = 24
VOCABULARY = 12
CLASSES = 6  # the tokens whose counts are compared


def load_digits_split(seed):
    """(x_train, y_train, x_test, y_test): scikit-learn's 8x8 digits, 80/20, stratified, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=seed,
                                                        stratify=digits.target)
    return x_train, y_train, x_test, y_test


def make_token_task(count, seed):
    """(tokens, labels): sequences of SEQUENCE_LENGTH token ids out of VOCABULARY; the label is the most frequent
    of tokens 0 to CLASSES - 1, ties going to the smaller token. Counting across the sequence is what attention
    is for."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCABULARY, size=(count, SEQUENCE_LENGTH))
    counts = np.stack([(tokens == token).sum(axis=1) for token in range(CLASSES)], axis=1)
    return tokens.astype(np.int32), np.argmax(counts, axis=1)  # argmax takes the first maximum


def make_sequence_task(count, seed):
    """(features, labels): the token task (`make_token_task`) as one-hot tokens and one-hot positions."""
    tokens, labels = make_token_task(count, seed)
    features = np.concatenate([np.eye(VOCABULARY, dtype=np.float32)[tokens],
                               np.broadcast_to(np.eye(SEQUENCE_LENGTH, dtype=np.float32),
                                               (count, SEQUENCE_LENGTH, SEQUENCE_LENGTH))], axis=-1)
    return features.astype(np.float32), labels
