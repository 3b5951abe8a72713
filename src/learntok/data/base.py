"""What every data reader shares: the one error type for bad data (a one-line message naming the problem and the
path; the CLI exits 2 on it) and a row's text as UTF-8."""

from __future__ import annotations

from typing import Any


class DataError(ValueError):
    """Bad input data or data settings; the message names the problem and the path."""


def _text_bytes(value: Any, where: str, text_field: str) -> bytes:
    """UTF-8 of a row's text value; None counts as empty, any other non-string is an error."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {text_field!r} is {type(value).__name__}, not a string")
    return value.encode("utf-8", errors="replace")  # lone surrogates from JSON escapes become '?'
