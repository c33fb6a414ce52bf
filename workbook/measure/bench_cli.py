"""A benchmark's command line: one error type for bad options (exit status 2, one line that says
what to fix) and sizes written as people write them (``256K``, ``1MiB``, ``2G``).
"""
from __future__ import annotations

import re


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class UsageError(SystemExit):
    """A benchmark's bad options: exit status 2, the message one line that starts with the
    command (``workbook bench pp_overlap: --nproc must be 2 to 4``)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def parse_size(text: str) -> int:
    """``"4096"``, ``"1K"``, ``"64M"``, ``"1G"`` (binary units) -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGB]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 1K, 64M)")
    return int(m[1]) * _UNITS[m[2]]
