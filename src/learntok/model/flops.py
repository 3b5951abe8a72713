"""Training FLOPs under three conventions, counted every step and logged side by side (metrics.jsonl `flops`,
`flops_padded`, `flops_total`; the wall clock is `time`).

- `6n` (logged as `flops`): the paper's accounting, 6 x matrix parameters per position: byte-level parameters
  (encoder, decoder, heads, boundary strategy) per byte, token-level parameters per real token. Embedding
  lookups and attention's own products are free.
- `6n-padded` (`flops_padded`): the same with the token level counted at its padded slots: every row as long
  as the step's longest row in tokens (a dense (B, L_max) token level), or --token-bucket's slots. Variable-rate
  strategies pay for the rows the longest one pads; fixed patches pay nothing extra.
- `total` (`flops_total`): 6n plus attention's score and value products, 12 d per query-key pair per layer
  (forward: 2 d for q.k and 2 d for the weighted values; the backward pass twice that), with d = d_model over
  all heads: byte layers attend to a window of byte_window keys (position t to min(t + 1, W) keys), token
  layers causally to every earlier token of their row (L (L + 1) / 2 pairs for L tokens). A flat byte model's
  full attention over every byte is counted here and nowhere else.

Per-step inputs come from the model's output (real tokens per row, the padded slots), so no extra device read is
needed beyond the one the step already makes.
"""

from __future__ import annotations

CONVENTIONS = ("6n", "6n-padded", "total")
"""Names used by --flops-convention; metrics.jsonl keys: flops, flops_padded, flops_total."""
KEYS = {"6n": "flops", "6n-padded": "flops_padded", "total": "flops_total"}


def window_pairs(seq_len: int, window: int | None) -> int:
    """Query-key pairs of one row of seq_len positions under causal attention to at most `window` keys
    (including itself); window None: full causal attention."""
    w = seq_len if not window else min(window, seq_len)
    # positions 0..w-1 see t + 1 keys, the rest w keys
    return w * (w + 1) // 2 + (seq_len - w) * w


def conventions(byte_positions_x_params: float, token_params: float, tokens: float, slots: float,
                attention: float, levels: tuple[tuple[float, float, float], ...] = ()) -> dict:
    """{"6n", "6n-padded", "total"} FLOPs from: byte-level matrix parameters x byte positions, token-level matrix
    parameters, real tokens, padded token slots, and sum over attention layers of d x query-key pairs; `levels`:
    (matrix parameters, real positions, padded slots) of further levels (a two-level model's super-tokens)."""
    six_n = 6.0 * (byte_positions_x_params + token_params * tokens + sum(p * n for p, n, _ in levels))
    padded = 6.0 * (byte_positions_x_params + token_params * slots + sum(p * s for p, _, s in levels))
    return {"6n": six_n, "6n-padded": padded, "total": six_n + 12.0 * attention}
