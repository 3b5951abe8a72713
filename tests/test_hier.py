"""The two-level hierarchy (--inner-layers): causal at both levels, packed = padded, its joint estimator against
exact enumeration, its FLOPs, training, resuming and generating end to end, and its bad input."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.model import build_model as build
from learntok.model.hier import compose_uniforms, inner_uniforms

from .conftest import build_model, tiny_model
from .test_model import _ids, assert_gradient_causal, assert_no_lookahead

HIER = dict(inner_layers=1, inner_rate=0.5)


@pytest.mark.parametrize("strategy", ["learned", "uniform"])
@pytest.mark.parametrize("j", [1, 17, 40])
@pytest.mark.parametrize(("bucket", "pooling"), [(0, "auto"), (16, "auto"), (0, "mean")])
def test_no_lookahead_at_both_levels(strategy, j, bucket, pooling):
    """No byte's logits, boundaries or log-likelihood see a later byte, through either level (tokens selected or
    mean-pooled, as the small preset pools); super-token boundaries at tokens before j do not move either."""
    m = build_model(strategy, None, {**HIER, "token_bucket": bucket}, pooling=pooling)
    assert_no_lookahead(m, j)
    B, T = 3, 48
    seq = _ids(B, T, 1)
    seq2 = seq.clone()
    seq2[:, j:] = _ids(B, T, 2)[:, j:]
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(3))
    o1, o2 = m(seq[:, :-1], noise=noise), m(seq2[:, :-1], noise=noise)
    before = o1.boundaries.mask[:, :j].sum(1)  # tokens built at bytes < j, the same in both
    for b in range(B):
        k = int(before[b])
        assert torch.equal(o1.inner_boundaries.mask[b, :k], o2.inner_boundaries.mask[b, :k])


def test_gradient_is_causal_through_both_levels():
    assert_gradient_causal(build_model("learned", None, HIER))


@pytest.mark.parametrize("strategy", ["learned", "uniform"])
def test_packed_token_levels_equal_padded(strategy):
    """--token-bucket (every slot computed) changes the FLOPs, not the model."""
    seq = _ids(3, 48, 7)
    noise = torch.rand(3, 48, generator=torch.Generator().manual_seed(8))
    outs = [build_model(strategy, None, {**HIER, "token_bucket": n})(seq[:, :-1], seq[:, 1:], noise=noise)
            for n in (0, 16)]
    torch.testing.assert_close(outs[0].logits, outs[1].logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[0].loss, outs[1].loss, rtol=0, atol=1e-5)
    assert torch.equal(outs[0].n_super, outs[1].n_super)
    padded = outs[1]  # the super-token level is bucketed too: its count rounded up to 16, at most the token slots
    assert outs[0].super_slots is None
    assert padded.super_slots == min(-(-int(padded.n_super.max()) // 16) * 16, padded.token_slots)
    assert int(padded.n_super.min()) < padded.super_slots
    assert float(padded.super_pad_share) == pytest.approx(1 - int(padded.n_super.sum()) / (3 * padded.super_slots))
    assert outs[0].super_pad_share is None and float(padded.super_pad_share) > 0


def test_second_level_uniforms_are_the_low_bits():
    g = torch.Generator().manual_seed(0)
    u1, u2 = torch.rand(4, 64, generator=g), torch.rand(4, 64, generator=g) * 0.99
    u = compose_uniforms(u1, u2)
    torch.testing.assert_close(inner_uniforms(u), u2, rtol=0, atol=1e-3)
    assert (u - u1).abs().max() < 1 / 4096 + 1e-6  # the first level's draw moves by less than 2^-12
    assert torch.equal(inner_uniforms(torch.full((2, 3), 0.5)), torch.full((2, 3), 0.5))  # greedy stays greedy
    # Real draws: the two levels' uniforms are uncorrelated.
    v = torch.rand(200_000, generator=g)
    assert abs(torch.corrcoef(torch.stack([v, inner_uniforms(v)]))[0, 1]) < 0.01


def test_drawn_without_noise_a_text_sees_neither_its_future_nor_its_batch():
    """Validation and diagnostics pass no noise: both levels then draw from per-byte uniforms of the generator, so
    a row draws the same alone as in a batch (row 0 is first either way), and changing its later bytes moves
    nothing before them (the second level's draws do not depend on the batch's token count)."""
    m = build_model("learned", None, HIER).eval()
    B, T, j = 3, 48, 30
    seq = _ids(B, T, 1)[:, :-1]
    later = seq.clone()
    later[0, j:] = _ids(B, T, 2)[0, j: T]

    def run(ids):
        with torch.no_grad():
            return m(ids, generator=torch.Generator().manual_seed(0))

    alone, batch, changed = run(seq[:1]), run(seq), run(later)
    torch.testing.assert_close(alone.logits[0], batch.logits[0], rtol=0, atol=1e-5)
    k = int(batch.n_tokens[0])
    assert k > 3 and torch.equal(alone.inner_boundaries.mask[0, :k], batch.inner_boundaries.mask[0, :k])
    torch.testing.assert_close(changed.logits[0, :j], batch.logits[0, :j], rtol=0, atol=1e-5)


def test_greedy_evaluation_is_greedy_at_both_levels_and_needs_no_seed():
    from learntok.evaluation.bpb import BoundaryMode, evaluating

    m = build_model("learned", None, HIER, target_rate=0.6)  # greedy: a token at most bytes, p' near 0.5
    ids = _ids(2, 48, 5)[:, :-1]
    outs = []
    with evaluating(m, BoundaryMode("greedy")), torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            outs.append(m(ids))
    torch.testing.assert_close(outs[0].logits, outs[1].logits, rtol=0, atol=0)
    inner = outs[0].inner_boundaries
    real = torch.arange(inner.mask.shape[1])[None] < outs[0].n_tokens[:, None]
    assert torch.equal(inner.mask[:, 1:], ((inner.probs > 0.5) & real)[:, 1:])
    assert real.sum() > 20 and 0 < inner.mask[:, 1:].sum() < real.sum() - 2  # both levels have choices to make
    assert torch.equal(outs[0].boundaries.mask[:, 1:], (outs[0].boundaries.probs > 0.5)[:, 1:])


def test_uniform_second_level_groups_every_other_token():
    m = build_model("uniform", None, HIER)  # tokens every 5 bytes, super-tokens every 2 tokens
    out = m(_ids(2, 40, 0)[:, :-1])
    assert out.n_tokens.tolist() == [8, 8] and out.n_super.tolist() == [4, 4]
    assert out.inner_boundaries.mask[0, :8].tolist() == [True, False] * 4


# -- generation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["learned", "uniform"])
@pytest.mark.parametrize(("pooling", "bucket"), [("auto", 0), ("mean", 0), ("auto", 16)])
def test_cached_steps_equal_the_full_pass(strategy, pooling, bucket):
    """Byte by byte (byte levels cached, the token levels again at each new token): the full pass's first-level
    boundaries and logits, on rows longer than the byte window; with --token-bucket both token levels padded."""
    from .test_generate import _cached_and_full

    m = build_model(strategy, None, {**HIER, "byte_window": 8, "token_bucket": bucket}, pooling=pooling,
                    target_rate=0.6).eval()
    assert m.boundary.has_step
    logits, bounds, full, state = _cached_and_full(m)
    assert torch.equal(bounds, full.boundaries.mask)
    torch.testing.assert_close(logits, full.logits, rtol=1e-4, atol=1e-4)
    assert int(state.count.max()) > 16 and state.tok_x.shape[1] > 16  # the token store grew past its first size


def test_cached_generation_generates_what_the_full_pass_generates():
    from learntok.generation import generate

    m = build_model("learned", None, HIER, target_rate=0.6).eval()  # about 30 tokens a row: the store grows
    prompts = ["The river ", "A"]  # ragged: rows gain tokens at different steps
    cached = generate(m, prompts, 40, seed=3, temperature=0.8)
    assert cached == generate(m, prompts, 40, seed=3, temperature=0.8, use_cache=False)
    assert all(len(c) == 40 for c in cached)


def test_compiled_training_matches_eager_with_no_graph_break(tmp_path, text_corpus, monkeypatch):
    """--compile on a two-level model compiles block by block (its step reads two bucketed counts, which would
    break a stage's graph): dynamo (its eager backend here) breaks no graph, compiles a few graphs per block, not
    one per step, and the run's losses are the uncompiled run's."""
    from torch._dynamo.utils import counters

    from learntok.model.hier import HierLM
    from learntok.train import train

    from .conftest import tiny_train_config

    real = HierLM.compile_stages
    monkeypatch.setattr(HierLM, "compile_stages", lambda self, **o: real(self, backend="eager", **o))
    counters.clear()
    losses = {}
    for compiled in (False, True):
        out = tmp_path / f"run-{compiled}"
        train(tiny_train_config(out, text_corpus, model=tiny_model(**HIER), compile=compiled), log=lambda *_: None)
        losses[compiled] = _logged(out, "loss/auto")
    torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0
    assert 1 <= counters["stats"]["unique_graphs"] <= 5 * 4  # at most a graph per (block, bucket, grad mode): 4 here
    assert len(losses[False]) == 6 and losses[True] == pytest.approx(losses[False], abs=1e-5)


# -- drawing the second level (learntok.draw level 2: segment, show, the tokenizer) ----------------------------


def test_drawn_second_level_is_the_forward_pass_at_each_tokens_first_byte():
    """Level 2 draws what the model's forward pass draws with the same uniforms: token j's super-token decision
    at its first byte, nothing at bytes that start no token; greedy is greedy at both levels."""
    from learntok.draw import draw_text, uniforms
    from learntok.vocab import BOS

    m = build_model("learned", None, HIER).eval()
    data = bytes(_ids(1, 90, 4)[0, 1:].tolist())
    p1, m1 = draw_text(m, data, 200, seed=5)
    p2, m2 = draw_text(m, data, 200, seed=5, level=2)
    ids = torch.tensor([[BOS, *data]])  # the text in one window
    noise = uniforms(len(data) + 1, False, torch.Generator().manual_seed(5))[None]
    with torch.no_grad():
        out = m(ids, noise=noise)
    starts = out.boundaries.mask[0].nonzero()[:, 0]  # each token's first position (BOS's is 0)
    want_mask, want_p = torch.zeros(len(data) + 1, dtype=torch.bool), torch.zeros(len(data) + 1)
    want_mask[starts] = out.inner_boundaries.mask[0, :len(starts)]
    want_p[starts] = out.inner_boundaries.probs[0, :len(starts)].float()
    assert torch.equal(m1, out.boundaries.mask[0, 1:]) and torch.equal(m2, want_mask[1:])
    torch.testing.assert_close(p2, want_p[1:], rtol=0, atol=1e-6)
    assert 2 < m2.sum() < m1.sum() and not (m2 & ~m1).any()  # super-tokens start where tokens start
    g1, g2 = draw_text(m, data, 200, greedy=True), draw_text(m, data, 200, greedy=True, level=2)
    assert torch.equal(g2[1], (g2[0] > 0.5) & g1[1])


def test_second_level_segments_long_texts_in_windows_into_whole_tokens():
    from learntok.tokenizer import LearnedTokenizer

    m = build_model("learned", None, HIER).eval()
    text = "the river and the sea, the river and the sand; " * 4
    tokens = LearnedTokenizer(m, window=48).encode(text)  # windows of 47 bytes, each re-reading 11
    supers = LearnedTokenizer(m, window=48, level=2).encode(text)
    assert "".join(supers.tokens) == text and 3 < len(supers) < len(tokens)
    starts = {s for s, _ in tokens.byte_offsets}
    assert all(s in starts for s, _ in supers.byte_offsets)
    streamed = list(LearnedTokenizer(m, window=48, level=2).stream_spans([text.encode()[:70], text.encode()[70:]]))
    assert [(s, e) for s, e, _ in streamed] == supers.byte_offsets


def test_a_second_level_needs_a_two_level_model(capsys):
    from learntok.cli import main
    from learntok.draw import draw_text

    with pytest.raises(ValueError, match="boundary level 2: this model has one level"):
        draw_text(build_model("learned", None), b"some text", 32, level=2)
    with pytest.raises(ValueError, match="boundary level 3: this model has levels 1 to 2"):
        draw_text(build_model("learned", None, HIER), b"some text", 32, level=3)
    assert main(["segment", "--level", "2", "--text", "Tokens."]) == 2  # the bundled model has one level
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this model has one level" in err


# -- the joint estimator against exact enumeration -------------------------------------------------------

T = 4  # bytes per row: 3 free first-level decisions; given k tokens, k - 1 free second-level ones (27 patterns)


def _exact_model():
    torch.manual_seed(0)
    bcfg = boundary_config("learned", policy_window=1, logit_scale=1.0, target_rate=0.4, lambda_policy=1.0,
                           lambda_target=0.0, logit_softcap=0.0, gamma=1.0, policy_samples=2)
    m = build(tiny_model(d_model=16, **HIER), bcfg).train()
    with torch.no_grad():
        m.boundary.proj.weight.normal_(0, 0.3)
        m.inner.proj.weight.normal_(0, 0.3)
    return m


def _joint_patterns() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every (first-level a (T,), second-level s over the tokens) with a_0 = s_0 = 1."""
    out = []
    for free in itertools.product([0, 1], repeat=T - 1):
        a = torch.tensor([1, *free], dtype=torch.bool)
        for free2 in itertools.product([0, 1], repeat=int(a.sum()) - 1):
            out.append((a, torch.tensor([1, *free2], dtype=torch.bool)))
    return out


def _noise(pats) -> torch.Tensor:
    """Uniforms that make both levels draw exactly `pats` (second-level draws sit at each token's byte)."""
    rows = []
    for a, s in pats:
        u2 = torch.full((T,), 0.99)
        u2[a.nonzero().squeeze(1)[s]] = 0.0
        rows.append(compose_uniforms(torch.where(a, 0.0, 0.999), u2))
    return torch.stack(rows)


def test_joint_estimator_is_the_exact_gradient():
    """Two samples per text (leave-one-out baselines) and gamma = 1: the expected update of both policies, over
    every pair of joint patterns, equals the gradient of E[sum_t log p_t] through both levels' probabilities.
    The second level's early exit depends on the first level's draw but not on its own, so it leaves the
    expectation alone; its loss is scaled per first-level decision, as the first level's is."""
    m = _exact_model()
    params = [m.boundary.proj.weight, m.inner.proj.weight]
    ids = _ids(1, T, 3)
    x, y = ids[:, :-1], ids[:, 1:]
    pats = _joint_patterns()
    assert len(pats) == 27
    # Exact: J = sum_P pi(P) sum_t log p_t(P), differentiated through pi only.
    j = 0.0
    logpi, logp = [], []
    for p in pats:
        out = m(x.expand(2, -1), y.expand(2, -1), noise=_noise([p, p]))  # (two rows: the samples' layout)
        assert torch.equal(out.boundaries.mask[0], p[0])
        assert torch.equal(out.inner_boundaries.mask[0, : len(p[1])], p[1])
        lp = out.boundaries.log_prob[0, 1:].sum() + out.inner_boundaries.log_prob[0, 1: len(p[1])].sum()
        logpi.append(lp)
        logp.append(-out.nll[0].sum().detach())
        j = j + lp.exp() * logp[-1]
    assert abs(sum(float(v.detach().exp()) for v in logpi) - 1) < 1e-5
    exact = torch.autograd.grad(j, params)
    probs = torch.stack(logpi).detach().exp()
    # Expected update: every ordered pair of the text's two samples, weighted by its probability.
    expected = [torch.zeros_like(p) for p in params]
    for (i, p), (k, q) in itertools.product(enumerate(pats), repeat=2):
        out = m(x.expand(2, -1), y.expand(2, -1), noise=_noise([p, q]))
        n1 = 2 * (T - 1)  # first-level decisions in the batch
        # Only the policy losses reach the policies' weights (pooling selects; lambda_target = 0).
        for e, g in zip(expected, torch.autograd.grad(out.loss, params)):
            e += probs[i] * probs[k] * (-n1 / 2) * g
    for e, g in zip(expected, exact):
        torch.testing.assert_close(e, g, rtol=1e-4, atol=1e-5)  # float32 sums over 729 pairs
    assert all(g.abs().max() > 1e-3 for g in exact)  # both levels' policies have a gradient to match


# -- accounting, training, generation, bad input -----------------------------------------------------------

def test_flops_count_each_level_at_its_own_length():
    """A second level that groups every token (uniform, stride 1) runs the same blocks over the same tokens as
    a one-level model with n_mid + 2 inner layers: the same FLOPs in every convention, but for the second
    level's early-exit head (per byte)."""
    torch.manual_seed(0)
    hier = build(tiny_model(n_mid=1, inner_layers=1, inner_rate=0.99), boundary_config("uniform"))
    flat = build(tiny_model(n_mid=3), boundary_config("uniform"))
    rows, T, tokens, slots, pairs = 4, 64, 52.0, 64.0, 400.0
    got = hier.flops_conventions(rows, T, tokens, slots, pairs, tokens, slots, pairs)
    want = flat.flops_conventions(rows, T, tokens, slots, pairs)
    extra = 6.0 * hier.head_early2.weight.numel() * rows * T
    for convention in ("6n", "6n-padded", "total"):
        assert got[convention] == pytest.approx(want[convention] + extra, rel=1e-12)
    # Fewer super-tokens cost less at the mid level only.
    half = hier.flops_conventions(rows, T, tokens, slots, pairs, tokens / 2, slots / 2, pairs / 4)
    mid = sum(p.numel() for p in hier.mid.parameters() if p.dim() >= 2)
    assert got["6n"] - half["6n"] == pytest.approx(6.0 * mid * tokens / 2)


def test_inference_flops_count_the_mid_layers_per_super_token():
    """`learntok eval`'s inference FLOPs: a second level grouping (almost) every token costs what the one-level
    model with the same blocks costs; both early-exit heads are training-only. train_flops wants the super-tokens."""
    from learntok.evaluation.report import inference_flops

    torch.manual_seed(0)
    hier = build(tiny_model(n_mid=1, inner_layers=1, inner_rate=0.99), boundary_config("uniform"))
    flat = build(tiny_model(n_mid=3), boundary_config("uniform"))
    a, b = inference_flops(hier, 0.2)["per_byte"], inference_flops(flat, 0.2)["per_byte"]
    assert b * 0.99 < a < b
    with pytest.raises(ValueError, match="super-token count"):
        hier.train_flops(100, 20)
    assert hier.train_flops(100, 20, 20) > hier.train_flops(100, 20, 10)


def _logged(run, key):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


def test_accumulated_micro_batches_give_the_global_batch_estimator(tmp_path, text_corpus):
    """Both levels' batch statistics travel as one vector (PairSums): with two micro-batches per step (the
    pre-pass) each level's loss equals the one-pass value."""
    from learntok.train import train

    from .conftest import tiny_train_config

    kw = dict(model=tiny_model(**HIER), max_steps=2, batch_size=4)
    train(tiny_train_config(tmp_path / "one", text_corpus, **kw), log=lambda *_: None)
    train(tiny_train_config(tmp_path / "two", text_corpus, micro_batch_size=2, **kw), log=lambda *_: None)
    for key in ("loss/policy", "loss/inner_policy", "loss/inner_target", "loss/early2"):
        a, b = _logged(tmp_path / "one", key), _logged(tmp_path / "two", key)
        assert len(a) == 2 and a[0] != 0
        assert a == pytest.approx(b, rel=1e-4, abs=1e-7), key


def test_inner_start_trains_one_level_first_then_the_second_decides(tmp_path, text_corpus):
    """--inner-start 0.5: until half the schedule every token is its own super-token in training and the second
    level's policy takes no gradient (the rest trains) and no optimizer step (not even weight decay); from there it
    decides and trains. A model outside training decides, and a resumed run picks the phase up from its step."""
    from learntok.checkpoint import load_run
    from learntok.train import train
    from learntok.train.schedule import progress

    from .conftest import tiny_train_config

    torch.manual_seed(0)
    m = build(tiny_model(d_model=16, inner_start=0.5, **HIER), boundary_config("learned")).train()
    assert m.inner_open  # built for evaluation: it decides
    ids = _ids(2, 48, 0)
    for frac, opened in [(0.4, False), (0.5, True)]:
        m.zero_grad()
        m.set_progress(frac)
        out = m(ids[:, :-1], ids[:, 1:], generator=torch.Generator().manual_seed(1))
        out.loss.backward()
        grads = [p.grad.abs().max().item() for p in m.inner.parameters() if p.grad is not None]
        assert (out.n_super < out.n_tokens).any() == opened
        assert (max(grads, default=0.0) > 0) == opened
        assert m.inner_down[0].attn.qkv.weight.grad.abs().max() > 0  # the token levels train in both phases
    m.eval()  # outside training it decides, whatever the phase
    assert (m(ids[:, :-1], generator=torch.Generator().manual_seed(1)).n_super < out.n_tokens).any()
    kw = dict(model=tiny_model(inner_start=0.5, **HIER), max_steps=8, batch_size=4)
    train(tiny_train_config(tmp_path / "r", text_corpus, **kw), log=lambda *_: None)
    cfg = tiny_train_config(tmp_path / "r", text_corpus, **kw)
    fracs = [progress(cfg.optim, s * 256, 8 * 256) for s in range(8)]  # 256 bytes a step, the step's start
    assert [r == 1.0 for r in _logged(tmp_path / "r", "boundary/inner_rate")] == [f < 0.5 for f in fracs]
    cfg = tiny_train_config(tmp_path / "c", text_corpus, **{**kw, "model": tiny_model(inner_start=0.9, **HIER),
                                                             "max_steps": 3})  # every step before 0.9
    train(cfg, log=lambda *_: None)
    torch.manual_seed(cfg.seed)  # as train builds it
    fresh, (_, trained) = build(cfg.model, cfg.boundary), load_run(tmp_path / "c")
    assert all(torch.equal(a, b) for a, b in zip(fresh.inner.parameters(), trained.inner.parameters(), strict=True))
    assert not torch.equal(fresh.inner_down[0].attn.qkv.weight, trained.inner_down[0].attn.qkv.weight)
    train(tiny_train_config(tmp_path / "a", text_corpus, **{**kw, "max_steps": 3}), log=lambda *_: None)
    train(tiny_train_config(tmp_path / "a", text_corpus, resume=str(tmp_path / "a"), **kw), log=lambda *_: None)
    assert [r == 1.0 for r in _logged(tmp_path / "a", "boundary/inner_rate")[3:]] == [f < 0.5 for f in fracs[3:]]


def test_cli_trains_resumes_evaluates_and_generates(tmp_path, text_corpus, capsys):
    from learntok.cli import main

    run = tmp_path / "hier"
    args = ["train", "--preset", "tiny", "--inner-layers", "1", "--inner-rate", "0.4", "--data", str(text_corpus),
            "--out", str(run), "--max-steps", "2", "--batch-size", "4", "--seq-len", "64", "--val-bytes", "512",
            "--no-progress"]
    assert main(args) == 0
    assert main(["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]) == 0
    flops = _logged(run, "flops_total")
    assert flops[-1] > flops[0] > 0 and _logged(run, "boundary/inner_rate")[-1] > 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "The ", "--max-new-bytes", "8", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    assert main(["eval", str(run), "--tasks", "none", "--no-progress"]) == 0
    assert "held-out BPB" in capsys.readouterr().out
    text = "The river runs to the sea, and the sea to the river."
    assert main(["segment", str(run), "--text", text, "--format", "jsonl"]) == 0
    tokens = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["segment", str(run), "--text", text, "--format", "jsonl", "--level", "2"]) == 0
    supers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "".join(s["text"] for s in supers) == text and len(supers) < len(tokens)
    assert {s["start"] for s in supers} <= {t["start"] for t in tokens}
    assert main(["show", str(run), "--text", text, "--level", "2", "--color", "never"]) == 0
    shown = capsys.readouterr().out
    assert "second level" in shown and shown.splitlines()[0].replace("|", "") == text
    from learntok.tokenizer import LearnedTokenizer

    saved = LearnedTokenizer.from_pretrained(run, level=2).save_pretrained(tmp_path / "saved")
    assert main(["segment", str(saved), "--text", text, "--format", "jsonl"]) == 0  # the saved level
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == supers
    assert main(["segment", str(run), "--text", text * 3, "--stats", "--level", "2"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["level"] == 2 and stats["tokens"] < len(tokens) * 3 and "shift" in stats["stability"]
    assert main(["segment", str(run), "--text", text, "--level", "0"]) == 2
    assert "levels count from 1" in capsys.readouterr().err
    mean = []
    for level in ("1", "2"):
        assert main(["vocab", str(run), "--data", str(text_corpus), "--max-bytes", "4000", "--level", level]) == 0
        mean.append(float(capsys.readouterr().out.split("; mean ")[1].split(" bytes")[0]))
    assert mean[1] > mean[0]  # super-tokens are longer
    assert main(["vocab", str(saved), "--data", str(text_corpus), "--max-bytes", "4000"]) == 0  # the saved level
    assert float(capsys.readouterr().out.split("; mean ")[1].split(" bytes")[0]) == mean[1]


@pytest.mark.parametrize(("extra", "message"), [
    (["--boundaries", "whitespace"], "--inner-layers needs --boundaries learned or uniform"),
    (["--rate-range", "0.1", "0.3"], "--inner-layers does not combine with --rate-range"),
    (["--inner-rate", "1.5"], "inner_rate in (0, 1)"),
    (["--boundaries", "uniform", "--inner-gamma", "0.5"], "--inner-gamma needs --boundaries learned"),
    (["--inner-gamma", "1.5"], "--inner-gamma needs --inner-layers and a value in [0, 1]"),
    (["--inner-layers", "0", "--inner-gamma", "0.5"], "--inner-gamma needs --inner-layers"),
    (["--inner-start", "1"], "--inner-start needs --inner-layers and a value in [0, 1)"),
    (["--inner-layers", "0", "--inner-start", "0.5"], "--inner-start needs --inner-layers"),
])
def test_bad_hierarchies_are_one_line(tmp_path, capsys, extra, message):
    from learntok.cli import main

    assert main(["train", "--inner-layers", "1", *extra, "--out", str(tmp_path / "r"),
                 "--data", str(tmp_path / "no-such-data")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "no-such-data" not in err
