"""Data parallelism on CPU with gloo: 2 processes x b == 1 process x 2b (with the learned policy, which proves
the global advantage and rate statistics), accumulation == a double batch, and a 2-process resume."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from learntok.train import train

from .conftest import tiny_train_config

pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cfg) -> None:
    """One torchrun-like process. Rank 0 writes OUT/group.json: the backend and world size of the process group
    training ran in, and how many DDP wrappers it built."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)

    wrapped = []

    class SpyDDP(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, *a, **k):
            wrapped.append(1)
            super().__init__(*a, **k)

    torch.nn.parallel.DistributedDataParallel = SpyDDP
    try:
        train(cfg, log=lambda *_: None)
        if rank == 0 and torch.distributed.is_initialized():
            Path(cfg.out, "group.json").write_text(json.dumps({
                "backend": torch.distributed.get_backend(), "world": torch.distributed.get_world_size(),
                "ddp": len(wrapped)}))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _run(cfg, world: int, launcher: bool | None = None) -> None:
    """Train `cfg` in `world` processes: spawned torchrun-like workers, or this process when world is 1 and no
    `launcher` is asked for."""
    if launcher is None:
        launcher = world > 1
    if not launcher:
        train(cfg, log=lambda *_: None)
        return
    mp.start_processes(_worker, args=(world, _free_port(), cfg), nprocs=world, join=True, start_method="spawn")


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / (run / "latest").read_text().strip() / "model.safetensors"))


def _assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < atol, worst


def run_resumed(cfg, at: int, world: int = 1) -> Path:
    """Train `cfg` (checkpoints every `at` steps) to its end, then undo it back to step `at`: drop the later
    checkpoints, point `latest` at step `at`, and resume: an interrupted run continued. Returns the run directory."""
    import shutil

    part = replace(cfg, ckpt_every=at)
    _run(part, world=world)
    out = Path(part.out)
    for ckpt in out.glob("step_*"):
        if int(ckpt.name.split("_")[1]) > at:
            shutil.rmtree(ckpt)
    (out / "latest").write_text(f"step_{at:06d}\n")
    _run(replace(part, resume=str(out)), world=world)
    return out


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss/auto"]) for r in rows if "loss/auto" in r]


@pytest.fixture
def cfg(tmp_path, text_corpus):
    return tiny_train_config(tmp_path / "x", text_corpus, max_steps=3, batch_size=4, lr=1e-2)


@pytest.mark.integration
def test_two_processes_equal_one_process_with_double_batch(tmp_path, cfg):
    _run(replace(cfg, out=str(tmp_path / "one")), world=1)
    _run(replace(cfg, out=str(tmp_path / "two")), world=2)
    _assert_same(_weights(tmp_path / "one"), _weights(tmp_path / "two"), atol=2e-5)


@pytest.mark.integration
def test_torchrun_with_one_process_trains_under_ddp_like_a_plain_process(tmp_path, cfg):
    """`torchrun --nproc-per-node 1` joins a process group of one and wraps the model in DDP (on a GPU: the
    NCCL path, tests/test_gpu.py), with a plain process's result."""
    _run(replace(cfg, out=str(tmp_path / "plain")), world=1)
    _run(replace(cfg, out=str(tmp_path / "group")), world=1, launcher=True)
    assert not (tmp_path / "plain" / "group.json").exists()
    group = json.loads((tmp_path / "group" / "group.json").read_text())
    assert group == {"backend": "gloo", "world": 1, "ddp": 1}
    _assert_same(_weights(tmp_path / "plain"), _weights(tmp_path / "group"), atol=1e-6)


@pytest.mark.integration
def test_two_processes_with_accumulation_equal_one_process(tmp_path, cfg):
    """DDP with no_sync micro-steps and the global-statistics pre-pass."""
    _run(replace(cfg, out=str(tmp_path / "one")), world=1)
    _run(replace(cfg, out=str(tmp_path / "two"), micro_batch_size=1), world=2)
    _assert_same(_weights(tmp_path / "one"), _weights(tmp_path / "two"), atol=2e-5)


def test_accumulation_equals_double_batch(tmp_path, cfg):
    _run(replace(cfg, out=str(tmp_path / "full")), world=1)
    _run(replace(cfg, out=str(tmp_path / "acc"), micro_batch_size=2), world=1)
    _assert_same(_weights(tmp_path / "full"), _weights(tmp_path / "acc"), atol=2e-5)


def test_local_statistics_would_differ(tmp_path, cfg, monkeypatch):
    """The check above can fail: using each micro-batch's own statistics changes the result."""
    import learntok.train.parallel as parallel

    _run(replace(cfg, out=str(tmp_path / "full")), world=1)
    monkeypatch.setattr(parallel.GlobalStats, "reducer", lambda self, pre_pass: None)
    _run(replace(cfg, out=str(tmp_path / "local"), micro_batch_size=2), world=1)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "local")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-4


def test_reducers_return_the_strategys_own_statistics():
    """The loop reduces any strategy's `BatchSums` through `stacked()` / `unstacked()` alone: the global sums of
    two micro-batches come back as the learned policy's own statistics, also from a checkpoint's vector."""
    from learntok.boundaries.reinforce import BatchStatistics
    from learntok.train.parallel import AllReduceStats, Dist, FixedStats, GlobalStats, global_sum

    s = BatchStatistics(g_sum=torch.tensor([1.0, 2.0]), g_cnt=torch.tensor([1.0, 1.0]),
                        g2_sum=torch.tensor([1.0, 4.0]), p_sum=torch.tensor(0.5), n=torch.tensor(2.0))
    assert torch.equal(s.unstacked(s.stacked()).stacked(), s.stacked())
    assert torch.equal(AllReduceStats(Dist())(s).stacked(), s.stacked())
    twice = FixedStats(global_sum([s, s], Dist()))(s)
    assert isinstance(twice, BatchStatistics) and torch.equal(twice.stacked(), 2 * s.stacked())
    stats = GlobalStats(Dist(), accum=2, mode="lagged")
    stats.observe([s, s])
    resumed = GlobalStats(Dist(), accum=2, mode="lagged")
    resumed.load_state_dict(stats.state_dict(), torch.device("cpu"))
    assert torch.equal(resumed.reducer(lambda: [])(s).p_sum, torch.tensor(1.0))


@pytest.mark.integration
def test_two_process_resume_continues_like_uninterrupted(tmp_path, cfg):
    full = replace(cfg, out=str(tmp_path / "full"), max_steps=4)
    _run(full, world=2)
    part = replace(cfg, out=str(tmp_path / "part"), max_steps=4, ckpt_every=2)
    _run(part, world=2)
    import shutil

    # Interrupt after step 2: drop the later checkpoint and metric lines, then resume from step 2.
    shutil.rmtree(tmp_path / "part" / "step_000004")
    (tmp_path / "part" / "latest").write_text("step_000002\n")
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "part" / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    _run(replace(part, resume=str(tmp_path / "part")), world=2)
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full")
    _assert_same(_weights(tmp_path / "full"), _weights(tmp_path / "part"), atol=1e-12)


@pytest.mark.integration
def test_fsdp2_two_processes_equal_one_process(tmp_path, cfg):
    _run(replace(cfg, out=str(tmp_path / "one")), world=1)
    _run(replace(cfg, out=str(tmp_path / "fsdp"), parallel="fsdp", ckpt_every=2), world=2)
    _assert_same(_weights(tmp_path / "one"), _weights(tmp_path / "fsdp"), atol=2e-5)


@pytest.mark.integration
def test_two_level_curriculum_two_processes_equal_one_process(tmp_path, cfg):
    """A two-level model with --inner-start (closed for steps 0-2 of 4, then deciding): under DDP the second
    level's zero-weighted losses keep every parameter in the graph, its gradients are dropped on every rank alike,
    both levels' statistics are global and both of its losses divide by counts that do not depend on the draw, so
    2 processes x b train what 1 process x 2b trains (its rate loss once divided by its own drawn count: 5e-3)."""
    from .conftest import tiny_model

    two_level = replace(cfg, model=tiny_model(inner_layers=1, inner_rate=0.5, inner_start=0.5), max_steps=4)
    _run(replace(two_level, out=str(tmp_path / "one")), world=1)
    _run(replace(two_level, out=str(tmp_path / "two")), world=2)
    _assert_same(_weights(tmp_path / "one"), _weights(tmp_path / "two"), atol=2e-5)
    rates = [json.loads(x).get("boundary/inner_rate") for x in (tmp_path / "two" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [r == 1.0 for r in rates if r is not None] == [True, True, True, False]


@pytest.mark.integration
def test_lagged_statistics_two_processes_equal_one_process_with_accumulation(tmp_path, cfg):
    """--batch-stats lagged uses the previous step's global batch (the first step: each micro-batch's own), so
    2 processes x 2 rows and 1 process x 2 micro-batches of 2 rows make the same updates; and they differ from
    the pre-pass's current-batch statistics (the check can fail)."""
    lagged = replace(cfg, batch_stats="lagged", max_steps=4)
    _run(replace(lagged, out=str(tmp_path / "acc"), micro_batch_size=2), world=1)
    _run(replace(lagged, out=str(tmp_path / "two")), world=2)
    _assert_same(_weights(tmp_path / "acc"), _weights(tmp_path / "two"), atol=2e-5)
    _run(replace(lagged, out=str(tmp_path / "prepass"), micro_batch_size=2, batch_stats="prepass"), world=1)
    a, b = _weights(tmp_path / "acc"), _weights(tmp_path / "prepass")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-4


def test_lagged_statistics_resume_like_uninterrupted(tmp_path, cfg):
    """The lag is part of the checkpoint: a run resumed from step 2 ends with the uninterrupted run's weights."""
    lagged = replace(cfg, batch_stats="lagged", max_steps=4, micro_batch_size=2)
    _run(replace(lagged, out=str(tmp_path / "full")), world=1)
    part = run_resumed(replace(lagged, out=str(tmp_path / "part")), at=2)
    _assert_same(_weights(tmp_path / "full"), _weights(part), atol=1e-7)


def test_fsdp_with_compile_compiles_block_by_block_and_trains_like_a_plain_process(tmp_path, cfg, monkeypatch):
    """FSDP2's hooks are excluded from compilation, so compiling the whole stages (fullgraph) under FSDP failed
    at its first step ("Attempted to call function marked as skipped"). Under --parallel fsdp --compile the
    blocks are compiled one by one before sharding (torchtitan's order): a process group of one (gloo), no
    graph break, every block compiled, and a plain eager process's weights."""
    from torch._dynamo.utils import counters

    from learntok.model.lm import ByteLM
    from learntok.nn.layers import Block

    _run(replace(cfg, out=str(tmp_path / "plain")), world=1)
    compiled_blocks, stages = [], []
    real = Block.compile

    def spy(self, **o):
        compiled_blocks.append(self)
        real(self, **{**o, "backend": "eager"})  # dynamo's tracing without inductor's minutes on CPU

    monkeypatch.setattr(Block, "compile", spy)
    monkeypatch.setattr(ByteLM, "compile_stages", lambda self, **o: stages.append(1))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    counters.clear()
    try:
        train(replace(cfg, out=str(tmp_path / "fsdp"), parallel="fsdp", compile=True), log=lambda *_: None)
        assert torch.distributed.get_world_size() == 1
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0
    assert len(compiled_blocks) == 3 and not stages  # n_down + n_mid + n_up of the tiny model; stages eager
    _assert_same(_weights(tmp_path / "plain"), _weights(tmp_path / "fsdp"), atol=2e-5)


def _slots_worker(rank: int, world: int, port: int, cfg) -> None:
    """A torchrun-like process that records the token slots of every training forward pass in OUT/slots-RANK."""
    from learntok.model.lm import ByteLM

    real, seen = ByteLM.token_slots, []

    def spy(self, mask):
        slots = real(self, mask)
        if self.training:
            seen.append((slots, int(mask.sum(1).max())))
        return slots

    ByteLM.token_slots = spy
    _worker(rank, world, port, cfg)
    Path(cfg.out, f"slots-{rank}.json").write_text(json.dumps(seen))


@pytest.mark.integration
def test_ranks_bucket_the_token_level_by_the_largest_count_over_ranks(tmp_path, cfg):
    """Under torchrun each rank used to bucket its own largest token count, so ranks ran (and compiled) different
    token-level shapes at different times. The count is now all-reduced (MAX) first: both ranks use the same
    slots at every step, the bucket above the larger of their counts, though their own counts differ."""
    cfg = replace(cfg, out=str(tmp_path / "two"), model=replace(cfg.model, token_bucket=4), max_steps=4)
    mp.start_processes(_slots_worker, args=(2, _free_port(), cfg), nprocs=2, join=True, start_method="spawn")
    a, b = (json.loads((tmp_path / "two" / f"slots-{r}.json").read_text()) for r in (0, 1))
    assert len(a) == len(b) == 4
    assert [s for s, _ in a] == [s for s, _ in b]
    assert all(s == -(-max(ca, cb) // 4) * 4 for (s, ca), (_, cb) in zip(a, b))
    assert any(ca != cb for (_, ca), (_, cb) in zip(a, b))  # the ranks' own counts differed
