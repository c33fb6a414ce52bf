"""The ``workbook trace`` commands.

``workbook trace summary PATH... [--json] [--step N]``
    per-rank metrics of trace files or run directories, and each step's own when a trace has
    several (``ProfilerStep#N`` markers: two builds of a comparison traced into one file);
``workbook trace report RUN_DIR -o report.html``
    the standalone HTML report;
``workbook trace merge RUN_DIR -o merged.json``
    one multi-rank Chrome trace for Perfetto.

The main ``workbook`` command calls :func:`register` to add these to its own
argument parser (for ``workbook --help``), and hands ``workbook trace ...``
to :func:`main`, which builds a parser of these commands only: reading a
trace imports neither torch nor the grader.  ``python -m workbook.trace.cli``
runs them on their own too.
Every handler takes the parsed ``argparse.Namespace`` and returns an exit
code: 0 on success, 2 when the input cannot be read (with a one-line
``error:`` message naming the file, never a traceback).  Unreadable ranks
next to readable ones are reported as ``warning:`` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .load import TraceError, load_run


def _load(paths):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = load_run(paths)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return run


def _guard(fn):
    def handler(args) -> int:
        try:
            return fn(args)
        except (TraceError, OSError) as exc:      # a bad or missing trace: one line, exit 2
            print(f"error: {exc}", file=sys.stderr)
            return 2
    handler.__name__ = fn.__name__
    handler.__doc__ = fn.__doc__
    return handler


def _fmt(x, pct=False):
    if x is None:
        return "–"
    return f"{x:.1f}" if pct else f"{x:,.1f}"


@_guard
def cmd_summary(args) -> int:
    """Print the per-rank metrics."""
    from .analyse import summary
    run = _load(args.paths)
    result = summary(run, step=args.step)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"source: {run.label()}   (times in µs, summed over the profiled steps)")
    head = ("rank", "device", "step", "compute", "comm", "overlap %", "exposed", "idle")
    rows = [head]
    for r in result["ranks"]:
        rows.append((str(r["rank"]), r["device"], _fmt(r["step_us"]), _fmt(r["compute_us"]),
                     _fmt(r["comm_us"]), _fmt(r["overlap_pct"], True), _fmt(r["exposed_comm_us"]),
                     _fmt(r["idle_us"])))
    _print_table(rows)
    if any(len(r["steps"]) > 1 for r in result["ranks"]):
        _print_steps(result["ranks"])
    for r in result["ranks"]:
        parts = [f"{n} ×{c['count']} ({'? B' if c['bytes'] is None else format(c['bytes'], ',') + ' B'})"
                 for n, c in r["collectives"].items()]
        print(f"rank {r['rank']} collectives: " + (", ".join(parts) if parts else "none"))
    return 0


def _print_table(rows, left=()) -> None:
    """Columns right-aligned, but those numbered in ``left``."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) if i in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())


_MAX_STEP_ROWS = 12      # steps listed per rank; --json has them all


def _print_steps(ranks) -> None:
    """One row per rank and step: a trace of several steps (two builds of a comparison, each
    its own step) has a figure per step; the sum above mixes them."""
    print("each step (the sum above mixes them; --step N for one):")
    rows = [("rank", "step", "label", "step", "compute", "comm", "overlap %", "exposed", "idle")]
    more = 0
    for r in ranks:
        for st in r["steps"][:_MAX_STEP_ROWS]:
            rows.append((str(r["rank"]), str(st["step"]), st["label"] or "-", _fmt(st["step_us"]),
                         _fmt(st["compute_us"]), _fmt(st["comm_us"]), _fmt(st["overlap_pct"], True),
                         _fmt(st["exposed_comm_us"]), _fmt(st["idle_us"])))
        more += max(0, len(r["steps"]) - _MAX_STEP_ROWS)
    _print_table(rows, left=(2,))
    if more:
        print(f"({more} more rank-steps not listed: --json has them all)")


def _write_from_run(write, args, note: str = "") -> int:
    """Load the run in ``args.run_dir``, write ``write(run, args.output)`` and say where."""
    run = _load([args.run_dir])
    out = write(run, args.output)
    print(f"wrote {out}{note}")
    return 0


@_guard
def cmd_report(args) -> int:
    """Write the HTML report."""
    from .report import write_report
    return _write_from_run(write_report, args)


@_guard
def cmd_merge(args) -> int:
    """Write the merged multi-rank trace."""
    from .merge import merge
    return _write_from_run(merge, args, note=" (open it in https://ui.perfetto.dev)")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``trace`` command and its subcommands to ``subparsers``
    (the object returned by ``parser.add_subparsers()``).  Each subcommand
    sets ``func`` to its handler: call ``args.func(args)``."""
    p = subparsers.add_parser("trace", help="summarise, report or merge profiler traces",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="trace_command", metavar="{summary,report,merge}")
    sub.required = True
    s = sub.add_parser("summary", help="per-rank compute/communication/overlap metrics")
    s.add_argument("paths", nargs="+", metavar="PATH", help="trace files or run directories")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--step", type=int, default=None,
                   help="only ProfilerStep#STEP (the summary lists each trace's steps)")
    s.set_defaults(func=cmd_summary)
    r = sub.add_parser("report", help="standalone HTML report of a run")
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("-o", "--output", default="report.html")
    r.set_defaults(func=cmd_report)
    m = sub.add_parser("merge", help="one multi-rank trace for Perfetto")
    m.add_argument("run_dir", metavar="RUN_DIR")
    m.add_argument("-o", "--output", default="merged.json")
    m.set_defaults(func=cmd_merge)
    return p


def main(argv=None, prog: str = "python -m workbook.trace.cli") -> int:
    """Run ``trace summary|report|merge`` given as ``argv`` (``["trace", "summary", ...]``).

    ``workbook trace ...`` comes straight here (``prog="workbook"``) before the
    main command builds its full parser: that parser imports the grader and
    the benchmarks to list them, and reading a trace needs none of it.
    """
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
