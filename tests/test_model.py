"""The U-Net: no lookahead for every strategy, attention backends, pooling invariants, shapes."""

from __future__ import annotations

import pytest
import torch

from learntok.boundaries import REGISTRY, available, boundary_config, strategy_class
from learntok.boundaries.pooling import distribute_add, select
from learntok.model.lm import ByteLM
from learntok.nn.attention import attend, reference_attention
from learntok.vocab import BOS, VOCAB_SIZE

from .conftest import build_model, prescribed_for, tiny_model

STRATEGIES = available()


def _model(strategy: str, tmp_path) -> ByteLM:
    return build_model(strategy, tmp_path)


def _ids(B: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (B, T + 1), generator=g)
    ids[:, 0] = BOS
    return ids


def assert_no_lookahead(m: ByteLM, j: int, B: int = 3, T: int = 48) -> None:
    """Changing bytes j.. of a batch moves nothing at positions < j: logits, boundaries, boundary probabilities,
    and the log-likelihood (hence reward) of every byte before j; and the change does reach position j onwards."""
    seq = _ids(B, T, 1)
    seq2 = seq.clone()
    seq2[:, j:] = _ids(B, T, 2)[:, j:]
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(3))
    o1 = m(seq[:, :-1], seq[:, 1:], noise=noise, prescribed=prescribed_for(m, seq[:, :-1]))
    o2 = m(seq2[:, :-1], seq2[:, 1:], noise=noise, prescribed=prescribed_for(m, seq2[:, :-1]))
    torch.testing.assert_close(o1.logits[:, :j], o2.logits[:, :j], rtol=0, atol=1e-5)
    assert torch.equal(o1.boundaries.mask[:, :j], o2.boundaries.mask[:, :j])
    torch.testing.assert_close(o1.boundaries.probs[:, :j], o2.boundaries.probs[:, :j], rtol=0, atol=1e-6)
    torch.testing.assert_close(o1.nll[:, :j - 1], o2.nll[:, :j - 1], rtol=0, atol=1e-5)
    # The test can fail: the change does reach position j onwards.
    assert not torch.allclose(o1.logits[:, j:], o2.logits[:, j:])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("j", [1, 17, 40])
def test_no_lookahead(strategy, j, tmp_path):
    """Every exactly causal strategy (assert_no_lookahead)."""
    if not strategy_class(strategy).exactly_causal:
        pytest.skip(f"{strategy} peeks ahead by construction; its leak rate is measured in its own tests")
    assert_no_lookahead(_model(strategy, tmp_path), j)


def assert_gradient_causal(m: ByteLM, B: int = 2, T: int = 40, t: int = 19) -> None:
    """d logits[t] / d embedding[s] = 0 for every s > t (with boundaries fixed by the noise), and not for s <= t."""
    seq = _ids(B, T, 4)
    captured = {}

    def keep(_mod, _inp, out):
        out.retain_grad()
        captured["emb"] = out

    h = m.embed.register_forward_hook(keep)
    out = m(seq[:, :-1], noise=torch.rand(B, T, generator=torch.Generator().manual_seed(5)),
            prescribed=prescribed_for(m, seq[:, :-1]))
    h.remove()
    out.logits[:, t].sum().backward()
    g = captured["emb"].grad  # (B,T,D)
    assert g[:, t + 1:].abs().max() == 0
    assert g[:, : t + 1].abs().max() > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradient_is_causal(strategy, tmp_path):
    assert_gradient_causal(_model(strategy, tmp_path))


@pytest.mark.parametrize("window,cap", [(8, 0.0), (8, 50.0), (5, 30.0), (40, 50.0), (None, 50.0), (None, 0.0)])
def test_attention_matches_dense_reference(window, cap):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 70, 16, requires_grad=True) for _ in range(3))
    ref = reference_attention(q, k, v, window=window, cap=cap)
    backends = ["eager"] + (["sdpa"] if cap == 0 else [])
    gref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for backend in backends:
        out = attend(q, k, v, window=window, cap=cap, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        g = torch.autograd.grad(out.square().sum(), (q, k, v))
        for a, b in zip(g, gref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_sdpa_refuses_softcap():
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match="soft-cap"):
        attend(q, q, q, window=4, cap=50.0, backend="sdpa")


def test_select_distribute_invariants():
    torch.manual_seed(0)
    x = torch.randn(3, 20, 8)
    ones = torch.ones(3, 20, dtype=torch.bool)
    tok = select(x, ones)
    assert torch.equal(tok.x, x)  # every byte is a token: select is the identity
    assert torch.equal(distribute_add(torch.zeros_like(x), x, tok), x)
    mask = torch.rand(3, 20) < 0.3
    mask[:, 0] = True
    tok = select(x, mask)
    assert torch.equal(tok.count, mask.sum(1))
    for b in range(3):
        pos = mask[b].nonzero().squeeze(1)
        assert torch.equal(tok.pos[b, : len(pos)], pos)
        assert torch.equal(tok.x[b, : len(pos)], x[b, pos])
        # byte t reads the latest token whose boundary is at or before t
        for t in range(20):
            assert pos[tok.index[b, t]] == pos[pos <= t].max()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_shapes_and_first_boundary(strategy, tmp_path):
    m = _model(strategy, tmp_path)
    seq = _ids(2, 33, 6)
    out = m(seq[:, :-1], seq[:, 1:], prescribed=prescribed_for(m, seq[:, :-1]))
    assert out.logits.shape == (2, 33, VOCAB_SIZE)
    assert out.boundaries.mask.shape == (2, 33) and out.boundaries.mask[:, 0].all()
    assert torch.isfinite(out.loss)
    assert set(out.terms) >= {"loss/auto", "loss/early"}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prescribed_strategies_have_no_boundary_parameters(strategy, tmp_path):
    m = _model(strategy, tmp_path)
    n = sum(p.numel() for p in m.boundary.parameters())
    assert (n == 0) == (m.boundary.learns_by in ("prescribed", "random"))


def test_uniform_worked_examples(tmp_path):
    mask = _model("uniform", tmp_path)(_ids(1, 20, 0)[:, :-1]).boundaries.mask[0]
    assert mask.nonzero().squeeze(1).tolist() == [0, 5, 10, 15]
    ids = _ids(2, 4096, 0)[:, :-1]
    assert _model("uniform", tmp_path)(ids[:, :64]).boundaries.mask.sum(1).tolist() == [13, 13]
    m = _model("uniform-random", tmp_path)
    assert m.boundary.propose(None, ids, noise=None, generator=None).mask.sum(1).tolist() == [819, 819]
    assert _model("uniform", tmp_path).boundary.propose(None, ids, noise=None, generator=None).mask.sum(1).tolist() \
        == [820, 820]


def test_spacebyte_worked_examples():
    from learntok.boundaries.whitespace import spacebyte_boundaries

    def marks(text: str) -> str:
        data = text.encode()
        ids = torch.tensor([[BOS, *data]])
        mask = spacebyte_boundaries(ids)[0, 1:].tolist()
        return "".join(("|" if m else "") + chr(b) if b < 128 else ("|" if m else "") + "#" for b, m in
                       zip(data, mask))

    assert marks("hello world, again") == "hello| world|, again"
    assert marks("a  b...c") == "a|  b|...c"  # runs of spacelike bytes: one boundary at their start
    assert marks("日本 語") == "######| ###"  # UTF-8 bytes count as word bytes
    assert marks("emoji😀 x") == "emoji####| x"


def test_early_head_starts_as_copy(tmp_path):
    m = _model("learned", tmp_path)
    assert torch.equal(m.head.weight, m.head_early.weight)


@pytest.mark.parametrize("strategy,mode,reaches_encoder", [("uniform", "rewards", False), ("learned", "rewards", True),
                                                          ("uniform", "always", True), ("learned", "never", False)])
def test_early_exit_loss_trains_encoder_only_for_reward_strategies(strategy, mode, reaches_encoder):
    """For strategies without rewards the early-exit head is a detached probe: its loss weight does not
    change the encoder's gradient; --early-loss-to-encoder always gives it to every strategy, never to none."""
    seq = _ids(2, 24, 0)
    noise = torch.rand(2, 24, generator=torch.Generator().manual_seed(1))
    grads = []
    for lam in (0.0, 0.5):
        torch.manual_seed(0)
        quiet = {"lambda_policy": 0.0, "lambda_target": 0.0} if strategy == "learned" else {}
        mc = tiny_model(lambda_early=lam, early_loss_to_encoder=mode)
        m = ByteLM(mc, boundary_config(strategy, **quiet)).train()
        m(seq[:, :-1], seq[:, 1:], noise=noise).loss.backward()
        grads.append(m.down[0].mlp.up.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1]) != reaches_encoder


def test_packed_token_level_equals_padded():
    """The token level runs on real tokens only; on their rows it must equal the padded computation."""
    from learntok.nn.layers import Block, Packing, rope_tables

    torch.manual_seed(0)
    blk = Block(16, 2, 64, None, 50.0, "eager")
    x = torch.randn(3, 7, 16)
    pos = torch.arange(7).expand(3, 7) * 3
    count = torch.tensor([7, 2, 5])
    packing = Packing.from_counts(count, 7)
    padded = blk(x, rope_tables(pos, 8, 1e4))
    packed = packing.unpack(blk(packing.pack(x), rope_tables(packing.pack(pos), 8, 1e4), packing))
    valid = torch.arange(7)[None] < count[:, None]
    torch.testing.assert_close(packed[valid], padded[valid], rtol=1e-5, atol=1e-5)
    assert (packed[~valid] == 0).all()


class ConstantInit(strategy_class("uniform")):
    """uniform boundaries plus one Linear that the strategy initialises to a constant itself."""

    def __init__(self, cfg, dim):
        super().__init__(cfg, dim)
        self.probe = torch.nn.Linear(dim, 1, bias=False)

    def reset_parameters(self, init_std):
        torch.nn.init.constant_(self.probe.weight, 0.5)


def test_strategies_keep_their_own_initialisation(monkeypatch):
    """The U-Net initialises its own modules and calls the strategy's reset_parameters, never overwriting it."""
    monkeypatch.setitem(REGISTRY, "uniform", "tests.test_model:ConstantInit")
    m = ByteLM(tiny_model(), boundary_config("uniform"))
    assert (m.boundary.probe.weight == 0.5).all()
    monkeypatch.undo()
    hnet = ByteLM(tiny_model(), boundary_config("hnet")).boundary
    assert torch.equal(hnet.w_q, torch.eye(32)) and torch.equal(hnet.w_k, torch.eye(32))
    dyn = ByteLM(tiny_model(), boundary_config("dynamic")).boundary
    assert all((lin.bias == 0).all() for lin in dyn.mlp if isinstance(lin, torch.nn.Linear))
    assert 0.01 < float(dyn.mlp[0].weight.detach().std()) < 0.03  # N(0, init_std = 0.02), as the U-Net's


def test_validation_bpb_counts_byte_targets_for_both_heads():
    """val/bpb and val/early_bpb share learntok.bpb's accounting: EOS separators are not byte targets."""
    import math

    from learntok.data import ByteSequences, val_batches_with_flags
    from learntok.train import validate

    from .conftest import sample_docs

    m = build_model("uniform")
    batches = val_batches_with_flags(ByteSequences([d[:100] for d in sample_docs()], 64, True), 4, 64 * 8)
    ev = validate(m, batches, torch.device("cpu"))
    nats = {"main": 0.0, "early": 0.0, "early_all": 0.0}
    n_bytes = n_pos = 0
    m.eval()
    with torch.no_grad():
        for batch, _ in batches:
            out = m(batch[:, :-1], batch[:, 1:])
            byte = batch[:, 1:] < 256
            nats["main"] += float(out.nll[byte].sum())
            nats["early"] += float(out.nll_early[byte].sum())
            nats["early_all"] += float(out.nll_early.sum())
            n_bytes, n_pos = n_bytes + int(byte.sum()), n_pos + byte.numel()
    assert n_bytes < n_pos  # the packed documents put EOS targets in these batches
    assert ev["val/bpb"] == pytest.approx(nats["main"] / (math.log(2) * n_bytes), rel=1e-6)
    assert ev["val/early_bpb"] == pytest.approx(nats["early"] / (math.log(2) * n_bytes), rel=1e-6)
    # the accounting it replaced (every target, every position) gives another number
    assert ev["val/early_bpb"] != pytest.approx(nats["early_all"] / (math.log(2) * n_pos), rel=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_rmsnorm_backward_equals_autograd_through_the_formula(dtype, tol):
    """RMSNorm's hand-written backward (it keeps x and the row's rsqrt, not two fp32 copies) gives autograd's
    gradients for x and the weight, in fp32 and for bf16 inputs (the residual stream under bf16-mixed)."""
    from learntok.nn.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(48)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (3 * torch.randn(2, 5, 48)).to(dtype).requires_grad_()
    g = torch.randn(2, 5, 48).to(dtype)
    def reference(x):  # the plain formula, differentiated by autograd
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight).type_as(x)

    grads = []
    for fn in (norm, reference):
        y = fn(x)
        assert y.dtype == dtype
        grads.append((y, *torch.autograd.grad(y, (x, norm.weight), g)))
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_gradients_are_the_same_under_torch_compile(dtype):
    """Dynamo traces RMSNorm's autograd.Function forward and backward; torch 2.11 gave zero gradients when its
    forward returned a no-op cast (`y.to(y.dtype)`), so a compiled step would have trained nothing."""
    from learntok.nn.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(8)
    x = torch.randn(2, 3, 8).to(dtype).requires_grad_()

    def f(x):
        return (norm(x).float() * torch.arange(8.0)).sum()

    eager = torch.autograd.grad(f(x), (x, norm.weight))
    compiled = torch.autograd.grad(torch.compile(f, backend="eager", fullgraph=True)(x), (x, norm.weight))
    torch._dynamo.reset()
    for a, b in zip(eager, compiled):
        assert b.abs().max() > 0
        torch.testing.assert_close(b, a)
