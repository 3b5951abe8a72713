"""learntok: byte-level language models that learn their own tokenization end to end."""

__version__ = "0.1.0"
