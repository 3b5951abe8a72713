"""Preemption: SIGTERM (how SLURM and Kubernetes stop a job) and SIGUSR1 (SLURM's `--signal=USR1@SECONDS`
warning) ask the run to stop at the next step boundary with a checkpoint, instead of dying mid-step.

The handler only records the signal; the training loop reads `requested` once per step, and under torchrun
all ranks agree on it (an all-reduce), so every rank stops after the same step and the checkpoint is taken
collectively. Ctrl-C (SIGINT) keeps Python's KeyboardInterrupt, which the loop also turns into a checkpoint.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")


class StopRequest:
    """A context that catches STOP_SIGNALS while it is open (main thread only; elsewhere it does nothing) and
    restores the previous handlers on exit."""

    def __init__(self) -> None:
        self.signal: str | None = None
        """Name of the first stop signal received, or None."""
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, _frame) -> None:  # no printing here: a handler may interrupt a print
        if self.signal is None:
            self.signal = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                if hasattr(signal, name):
                    num = getattr(signal, name)
                    self._previous[num] = signal.signal(num, self._handle)
        return self

    def __exit__(self, *_exc) -> None:
        for num, handler in self._previous.items():
            signal.signal(num, handler)
        self._previous.clear()
