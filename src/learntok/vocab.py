"""The byte vocabulary: 256 byte values plus a few special ids."""

BOS = 256
"""Begins every sequence; always a boundary (a_0 = 1)."""
EOS = 257
"""Separates packed documents."""
PAD = 258
"""Fills unused positions at evaluation; never a training target."""
VOCAB_SIZE = 260
"""Rows of the embedding and the output heads (259 used, rounded up to a multiple of 4)."""
IGNORE = -100
"""Target value that every loss and metric skips (padding)."""
