"""learntok's version, in a module of its own that imports nothing, so that any module can record it (checkpoints,
exported models, prepared corpora) without importing the package's public API."""

__version__ = "0.2.0"
