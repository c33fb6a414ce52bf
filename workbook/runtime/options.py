"""Options a learner types, checked in one line: seconds, counts, and the parser that says so.

``workbook run --timeout -5`` used to be accepted (every check then "hung within -5 s"). Every
command's numeric options use these ``argparse`` types, and their parsers ``OneLineErrors``, so
a bad value is one line that says what to type instead, exit status 2.
"""
from __future__ import annotations

import argparse
import math
import re


def positive_seconds(text: str) -> float:
    """``argparse`` type of an option in seconds (``--timeout``): a finite number above 0.
    Anything else is a usage error: ``--timeout must be a positive number of seconds, got -5``
    (one line, with ``OneLineErrors``; argparse's own parser adds its usage above it)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def positive_count(text: str) -> int:
    """``argparse`` type of a count (``--nproc``): a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, at least 1, got {text}")
    return value


class OneLineErrors(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit status 2:
    ``python labs/tp.py: --timeout must be a positive number of seconds, got -5``
    (``--help`` still prints the usage). Subparsers made by ``add_subparsers`` inherit it."""

    def error(self, message: str):
        message = re.sub(r"^argument ([^:]+): (must be .*)", r"\1 \2", message)
        self.exit(2, f"{self.prog}: {message}\n")
