"""transformers loads learntok models through this file (auto_map in config.json); learntok must be installed."""

from learntok.transformers_model import LearntokConfig, LearntokForCausalLM  # noqa: F401
