"""Static token shapes (--token-bucket) and the compiled training stages (--compile): the same numbers as the
exact, packed token level; no graph breaks for the strategies the paper trains; one graph per bucket."""

import json
import os

import pytest
import torch
from torch._dynamo.utils import counters

from learntok.boundaries import available, boundary_config, config_class
from learntok.boundaries.reinforce import SCAN_MAX_WINDOW, masked_std
from learntok.config import ModelConfig
from learntok.model import build_model

T, B = 64, 4


def tiny(strategy: str, bucket: int, **opts):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=2, n_mid=1, byte_window=16, token_bucket=bucket)
    return build_model(cfg, config_class(strategy)(**opts))


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (B, T), generator=g)
    return ids, torch.rand(B, T, generator=g)


@pytest.mark.parametrize("strategy", ["learned", "uniform", "dynamic", "hnet", "flat"])
def test_bucketed_token_level_equals_the_packed_one(strategy):
    """Padding the token level to a bucket changes FLOPs, not results: logits, loss and every gradient agree."""
    ids, noise = batch(1)
    outs = []
    for bucket in (0, 16):
        m = tiny(strategy, bucket)
        out = m(ids, ids, noise=noise)
        slots = m.token_slots(out.boundaries.mask)
        out.loss.backward()
        outs.append((out, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = outs
    if strategy != "flat":  # (flat: every byte is a token, T slots either way)
        assert int(a.n_tokens.min()) < slots < T, "rows should be padded for this test to mean anything"
        assert 0 < float(b.pad_share) == pytest.approx(1 - int(b.n_tokens.sum()) / (B * slots))
    assert a.pad_share is None and b.token_slots == slots
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-6, rtol=1e-4, msg=name)


def test_token_slots_round_up_to_the_bucket_and_never_drop_a_token():
    m = tiny("uniform", 16)
    mask = torch.zeros(2, T, dtype=torch.bool)
    mask[0, :17] = True
    assert m.token_slots(mask) == 32
    mask[1] = True
    assert m.token_slots(mask) == T
    assert tiny("uniform", 0).token_slots(mask) is None
    with pytest.raises(ValueError, match="token_bucket"):
        ModelConfig(token_bucket=-1)


def compiled_run(model, steps: int):
    """Train-mode forward + backward for `steps` batches through the compiled stages (a backend that records
    each graph dynamo hands it and runs it as traced). Returns (graphs, graph breaks, buckets seen)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model.compile_stages(backend=backend)
    counters.clear()
    buckets = set()
    for i in range(steps):
        ids, noise = batch(100 + i)
        noise = noise * (0.4 if i % 7 == 0 else 1.0)  # some batches with many boundaries: several buckets
        out = model(ids, ids, noise=noise)
        out.loss.backward()
        buckets.add(model.token_slots(out.boundaries.mask))
    torch._dynamo.reset()
    return graphs, sum(counters["graph_break"].values()), buckets


def test_the_compiled_stages_read_the_rope_tables_and_compute_no_sine():
    """forward makes the RoPE tables once and hands them to both stages, so no graph computes a sine or cosine
    (inside a graph inductor fused them into every layer's rotation: 14 % of the compiled paper-147m step on an
    H200). The token level's tables, read at its tokens' byte positions, are what computing them gives."""
    model = tiny("learned", 16)
    graphs, breaks, _ = compiled_run(model, 2)
    assert breaks == 0 and len(graphs) >= 2
    trig = {"sin", "cos", torch.sin, torch.cos}
    assert not [n for gm in graphs for n in gm.graph.nodes if n.target in trig]
    pos = torch.tensor([[0, 5, 17, 63], [0, 1, 2, 0]])
    table = model._rope(torch.arange(T))
    for a, b in zip(model._rope_at(table, pos), model._rope(pos)):
        assert a.shape == b.shape == (2, 1, 4, 8)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy,opts", [("learned", {"policy_window": 0}), ("learned", {"policy_window": 8}),
                                           ("uniform", {})])
def test_compiled_stages_have_no_graph_breaks_and_one_graph_per_bucket(strategy, opts):
    """Including the paper's w = 8 window, whose sampler is the state scan under compile (no host read)."""
    graphs, breaks, buckets = compiled_run(tiny(strategy, 16, **opts), 100)
    assert breaks == 0
    assert len(graphs) == 1 + len(buckets)  # stage 1 once, stage 2 once per bucket, over 100 steps
    if strategy == "learned":
        assert len(buckets) >= 2


def test_a_compiled_windowed_policy_draws_what_the_eager_one_draws():
    """Under compile the window sampler is the scan, eagerly it is Jacobi: the same boundaries and losses."""
    ids, noise = batch(5)
    eager = tiny("learned", 16, policy_window=3)
    compiled = tiny("learned", 16, policy_window=3)
    compiled.compile_stages(backend="eager")
    a, b = eager(ids, ids, noise=noise), compiled(ids, ids, noise=noise)
    torch._dynamo.reset()
    assert torch.equal(a.boundaries.mask, b.boundaries.mask)
    assert float(b.boundaries.stats["boundary/sample_rounds"]) == 1 + 6  # the scan: log2(64) steps
    torch.testing.assert_close(b.loss, a.loss)


def test_a_window_wider_than_the_scan_breaks_only_at_its_sampler():
    """w > SCAN_MAX_WINDOW (2^w states would not fit) keeps Jacobi's data-dependent loop: the one break."""
    _, breaks, _ = compiled_run(tiny("learned", 16, policy_window=SCAN_MAX_WINDOW + 1), 3)
    assert breaks > 0
    assert all("_jacobi_rounds" in reason for reason in counters["graph_break"])


def test_masked_std_is_the_std_of_the_selected_entries():
    x = torch.randn(5, 7)
    keep = torch.rand(5, 7) > 0.4
    torch.testing.assert_close(masked_std(x, keep.float()), x[keep].std())
    one = torch.zeros(5, 7)
    one[2, 3] = 1
    assert float(masked_std(x, one)) == 0.0 and float(masked_std(x, torch.zeros(5, 7))) == 0.0


@pytest.mark.parametrize("opts", [{"policy_window": 0},
                                  {"policy_window": 1, "value_baseline": True, "rate_range": (0.1, 0.4),
                                   "rate_strata": 2, "rate_tokens": True}])
def test_compiled_training_matches_eager_training(opts, tmp_path, text_corpus, monkeypatch):
    """`train(compile=True)`: the stages compile (dynamo with its eager backend here; inductor on CPU takes
    minutes), shapes are bucketed (COMPILE_BUCKET), the step has no graph break and compiles once per bucket
    (a variable-rate model's new targets every step included), and the run's losses are the uncompiled run's."""
    from learntok.boundaries import boundary_config
    from learntok.model.lm import ByteLM
    from learntok.train import train

    from .conftest import tiny_train_config

    real = ByteLM.compile_stages
    monkeypatch.setattr(ByteLM, "compile_stages", lambda self, **o: real(self, backend="eager", **o))
    bcfg = boundary_config("learned", **opts)
    counters.clear()
    losses = []
    for compiled in (False, True):
        out = tmp_path / f"run-{compiled}"
        train(tiny_train_config(out, text_corpus, boundary=bcfg, compile=compiled))
        rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if '"loss/auto"' in r]
        losses.append([r["loss/auto"] for r in rows])
        pads = [r.get("train/token_pad_share") for r in rows]
        assert all(0 < p < 1 for p in pads) if compiled else pads == [None] * len(rows)  # logged when bucketed
    torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0
    assert 2 <= counters["stats"]["unique_graphs"] <= 4  # stage 1, and stage 2 per bucket: not a graph per step
    assert len(losses[0]) == 6
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


@pytest.mark.parametrize("strategy", [s for s in available() if s != "learned"])
def test_every_strategy_trains_as_one_graph_per_stage(strategy, tmp_path, text_corpus, monkeypatch):
    """compile_stages uses fullgraph=True where `traces_whole` says so, so a graph break fails the run here
    (learned, the paper's strategy, is covered above with w = 0, 8 and w > 8)."""
    from learntok.model.lm import ByteLM
    from learntok.train import train

    from .conftest import tiny_train_config

    seen = []
    real = ByteLM.compile_stages

    def spy(self, **o):
        seen.append(self.boundary.traces_whole)
        real(self, backend="eager", **o)

    monkeypatch.setattr(ByteLM, "compile_stages", spy)
    train(tiny_train_config(tmp_path / "run", text_corpus, boundary=boundary_config(strategy), compile=True,
                            max_steps=2))
    torch._dynamo.reset()
    assert seen == [True]


def test_fullgraph_is_off_only_for_a_window_wider_than_the_scan():
    assert tiny("learned", 16, policy_window=SCAN_MAX_WINDOW).boundary.traces_whole
    assert not tiny("learned", 16, policy_window=SCAN_MAX_WINDOW + 1).boundary.traces_whole


@pytest.mark.skipif(not os.environ.get("LEARNTOK_SLOW_TESTS"),
                    reason="inductor compiles for minutes on CPU: set LEARNTOK_SLOW_TESTS=1 to run it")
def test_inductor_stages_match_eager():
    ids, noise = batch(1)
    grads = []
    for compiled in (False, True):
        m = tiny("learned", 16, policy_window=0)
        if compiled:
            m.compile_stages()
        out = m(ids, ids, noise=noise)
        out.loss.backward()
        grads.append((out, [p.grad for p in m.parameters() if p.grad is not None]))
    torch._dynamo.reset()
    (a, ga), (b, gb) = grads
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("batch_stats,expected", [("prepass", 4), ("lagged", 3)])
def test_compiled_accumulation_builds_one_graph_per_bucket_and_grad_mode(batch_stats, expected, tmp_path, text_corpus,
                                                                           monkeypatch):
    """Gradient accumulation under --compile (the paper-147m recipe on one GPU): the statistics must not be
    recorded by mutating Python state inside a graph, or dynamo guards on it and recompiles stage 2 for every
    micro-batch (6 micro-batches gave 9 graphs). With 64-byte sequences every batch falls in one bucket, so:
    prepass: stage 1 and stage 2 each with and without gradients (the pre-pass) = 4; lagged: no pre-pass, one
    more stage-2 graph for the first step's local statistics = 3. The losses are the eager run's."""
    from learntok.model.lm import ByteLM
    from learntok.train import train

    from .conftest import tiny_train_config

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    real = ByteLM.compile_stages
    monkeypatch.setattr(ByteLM, "compile_stages", lambda self, **o: real(self, backend=backend, **o))
    losses = []
    counters.clear()
    for compiled in (False, True):
        out = tmp_path / f"run-{compiled}"
        train(tiny_train_config(out, text_corpus, boundary=boundary_config("learned", policy_window=0),
                                compile=compiled, max_steps=3, batch_size=6, micro_batch_size=1,
                                batch_stats=batch_stats), log=lambda *_: None)
        rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if '"loss/auto"' in r]
        losses.append([r["loss/policy"] for r in rows])
    torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0
    assert len(graphs) == expected
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)
