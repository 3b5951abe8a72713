"""The models: the autoregressive U-Net (lm.py), its two-level form (hier.py) and the BPE-tokenized baseline
(token_lm.py)."""

from __future__ import annotations


def build_model(cfg, bcfg):
    """The model a ModelConfig describes (`arch`), with the boundary strategy's options `bcfg`."""
    if cfg.arch == "token":
        from learntok.model.token_lm import TokenLM

        return TokenLM(cfg, bcfg)
    if cfg.inner_layers:
        from learntok.model.hier import HierLM

        return HierLM(cfg, bcfg)
    from learntok.model.lm import ByteLM

    return ByteLM(cfg, bcfg)
