"""Shared argparse pieces for the subcommands: errors as one-line ValueErrors, validated integers."""

from __future__ import annotations

import argparse


class Parser(argparse.ArgumentParser):
    """argparse that raises ValueError (one line, printed by the CLI) instead of exiting."""

    def error(self, message: str):
        raise ValueError(f"{self.prog}: {message}")


def non_negative_int(name: str):
    """An argparse `type` accepting integers >= 0, naming the flag in its error."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {s!r}") from None
        if v < 0:
            raise argparse.ArgumentTypeError(f"{name} must be non-negative, got {v}")
        return v
    return parse
