"""Training: `train(cfg) -> RunResult` on one process or under torchrun.

    loop.py        train() and one optimizer step
    schedule.py    step count, learning-rate schedule, AdamW, the training-time stopwatch
    state.py       run directory, config.json provenance, TrainState <-> checkpoints
    parallel.py    devices, process group, DDP / FSDP2 wrapping, global-batch statistics, boundary noise
    logs.py        per-window metrics and their sinks (metrics.jsonl, TensorBoard, progress bar)
    validation.py  validation BPB during training, and the evaluation hook
"""

from learntok.train.loop import RunResult, train
from learntok.train.schedule import check_config, lr_at, make_optimizer, total_steps
from learntok.train.validation import EvalHook, Preview, validate

__all__ = ["EvalHook", "Preview", "RunResult", "check_config", "lr_at", "make_optimizer", "total_steps", "train",
           "validate"]
