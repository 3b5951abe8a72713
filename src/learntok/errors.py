"""Errors that the command line reports as one line `learntok: error: ...` with exit status 2 (a traceback only
with LEARNTOK_DEBUG=1, learntok.cli).

They subclass `LearntokError`, which imports nothing, so `learntok.cli` can catch them without loading torch.
ValueError, FileNotFoundError and other OSErrors are reported the same way; these name learntok's own failures.
"""

from __future__ import annotations


class LearntokError(Exception):
    """A failure with a message meant for people."""


class CheckpointError(LearntokError):
    """A checkpoint that is damaged, missing or could not be written."""


class TrainingError(LearntokError):
    """Training cannot go on (e.g. too many consecutive non-finite steps)."""


class MissingDependency(LearntokError, ImportError):
    """An optional package the command needs is not installed; the message names the pip extra. An ImportError
    too, so code that treats an optional dependency as optional keeps catching it."""


class LearntokWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints it as one line)."""
