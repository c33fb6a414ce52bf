"""A benchmark's command line: one error type for bad options (exit status 2, one line that says
what to fix), sizes written as people write them (``256K``, ``1MiB``, ``2G``), lists written with
commas, and what every model benchmark's ``run_bench`` and ``main`` do once its options are read.
"""
from __future__ import annotations

import re
import sys


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


def listed(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: an option that lists names (``--variants``)."""
    return [x.strip() for x in text.split(",") if x.strip()]


def measure_and_save(args, measure, report, figure=None, **options) -> dict:
    """A model benchmark's ``run_bench`` once its options are read: ``measure(impl=, nproc=,
    trace_dir=, **options)`` from ``args``; a bad option (``UsageError``) said on stderr, in one
    line, before it exits with status 2; then the report printed and the ``--json`` and
    ``--figure`` files written (``output.save_outputs``, ``figure(result)`` making the figure)."""
    from workbook.measure.output import save_outputs
    try:
        result = measure(impl=args.impl, nproc=args.nproc, trace_dir=args.trace_dir, **options)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        raise
    print(report(result))
    save_outputs(result, args.json, getattr(args, "figure", None), figure)
    return result


def run_as_command(add_arguments, run_bench, description: str, argv=None, prog=None) -> None:
    """A benchmark module run as a command (``python -m workbook.<family>.<lab>_bench``): its
    own parser (``add_arguments``), then ``run_bench``."""
    import argparse
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    run_bench(parser.parse_args(argv))
