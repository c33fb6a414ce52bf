"""One check engine for the self-check and the grader.

A lab's checks are the grading tests in ``tests/grading/test_<lab>.py``. Each test has two
halves: a *rank side* that runs the learner's code on every rank and records what happened
(results, the calls the flight recorder saw, trace figures), and a *judge* that reads those
records and raises ``AssertionError`` with a message that teaches. The engine runs them three
ways, with the same code and so the same messages:

* under pytest (``workbook grade``): each test is a pytest test worth its ``points``;
* as a self-check (``workbook run LAB``, ``python labs/LAB.py``, a notebook cell): the engine
  calls the same test functions itself, in order, and turns each outcome into a ``Verdict``;
* under ``torchrun``: the same, on the job's own ranks (``workbook.grading.torchrun_ranks``).

Two rules make a wrong answer give a verdict instead of a hang or a crash:

1. every rank runs every case to the end: the rank side records, it never stops at the first
   difference (only the judge, after the results are gathered, decides);
2. rank code runs only through ``on_ranks``: it adds the timeout (a hang ends in the flight
   recorder's per-rank report), replays a cached run to the tests that share it, and knows
   whether this is a warm rank pool or a torchrun job.
"""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbook.runtime.messages import first_line

PASSED, FAILED, NOT_IMPLEMENTED, HANG, ERROR, SKIPPED = (
    "passed", "failed", "not implemented", "hang", "error", "skipped")


class Skipped(Exception):
    """A check that cannot run here (e.g. it needs 2 ranks and this torchrun job has 4)."""


@dataclass
class _State:
    nproc: int | None = None            # self-check: the world size asked for (None: all)
    timeout: float | None = None        # self-check: seconds before a run is a hang
    job: object = None                  # a torchrun job's ranks (torchrun_ranks.JobRanks)
    current: str = ""                   # the check running now (a torchrun hang report names it)
    before_report: object = None        # called before a torchrun hang report (prints progress)
    tmpdir: str = ""                    # this run's scratch folder (a torchrun exit removes it)
    cache: dict = field(default_factory=dict)
    deadline: float | None = None       # a per-test time limit: time.monotonic() by which the test
                                        # ends (the autograder's workbook.grading.limits sets it)


STATE = _State()


# --------------------------------------------------------------------------- for the tests
ENV_MAX_RANKS = "WORKBOOK_MAX_RANKS"


def max_ranks() -> int | None:
    """The most ranks grading uses (``$WORKBOOK_MAX_RANKS``, ``workbook grade --max-ranks``), or
    None for no cap. A small grading machine (Gradescope's default has half a vCPU and 768 MB)
    sets it: each rank is a process holding torch. Under a cap of N, ``world_sizes`` drops the
    sizes above N (with the exceptions it lists), and only the pools of sizes up to N stay
    alive (``_live_ranks``). A cap of 1 grades like a cap of 2: one rank alone cannot show a
    communication mistake."""
    value = os.environ.get(ENV_MAX_RANKS, "").strip()
    if not value:
        return None
    try:
        cap = int(value)
    except ValueError:
        raise ValueError(f"{ENV_MAX_RANKS} must be a whole number of ranks, got {value!r}") from None
    if cap < 1:
        raise ValueError(f"{ENV_MAX_RANKS} must be at least 1, got {cap}")
    return cap


def _requested(sizes: tuple[int, ...]) -> tuple[int, ...]:
    n = STATE.nproc
    if n is None or n in sizes:
        return sizes if n is None else (n,)
    if STATE.job is not None:
        raise Skipped(f"runs on {' or '.join(map(str, sizes))} ranks; this job has {n}")
    return sizes


def world_sizes(*sizes: int, needs: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The world sizes a check runs on: all of ``sizes`` when grading; in a self-check on N
    ranks only N when ``sizes`` holds it (a pool can still run the others; a torchrun job of
    N ranks cannot, and the check is skipped).

    Under a rank cap (``max_ranks()``; a self-check's own ``--nproc`` is not capped) the sizes
    above it are dropped, so that the verdict stays the one a full grading gives:

    * when every size is above the cap, the smallest still runs: a check never vanishes;
    * a check on several ranks keeps its smallest size above 1 (under a cap of 1): one rank
      alone cannot show a communication mistake;
    * ``needs``: sizes the check cannot tell right from wrong without (a chain and a binomial
      tree take the same number of rounds on up to 3 ranks) are kept whatever the cap."""
    chosen = _requested(sizes)
    cap = max_ranks()
    if cap is None or STATE.job is not None or chosen == (STATE.nproc,):
        return chosen
    kept = [s for s in chosen if s <= cap or s in needs]
    several = [s for s in chosen if s > 1]
    if several and not any(s > 1 for s in kept):
        kept.append(min(several))
    return tuple(sorted(kept)) or (min(chosen),)


def graded_size(n: int, *sizes: int) -> int:
    """For a test parametrised by world size ``n`` (one of ``sizes``): ``n``, or, when a rank cap
    drops ``n``, the largest size the cap keeps. The test still runs and is worth its points
    (its verdict is the one the kept size gives), so a total never depends on the machine."""
    kept = world_sizes(*sizes)
    return n if n in kept else max(kept)


def simulated_link(n: int, preset: str = "dgx-h100") -> str:
    """The link a traced run on ``n`` ranks uses: ``preset`` where the ranks talk over gloo,
    ``"none"`` on NCCL (no simulated link there: the trace is the GPU's own)."""
    from workbook.runtime.ranks import choose_backend
    return preset if choose_backend(None, n) == "gloo" else "none"


def on_ranks(n: int, fn, *args, link: str = "none", timeout: float = 60.0, key=None,
             nnodes: int = 1, **kwargs):
    """``fn(*args, **kwargs)`` on ``n`` ranks; the per-rank results, indexed by rank.
    ``nnodes``: the ranks form that many simulated nodes (``workbook.runtime.launch.run``); under
    torchrun the job's own nodes.

    ``key``: tests that read the same run pass the same key; the run (or its exception) is
    replayed to the second test instead of run again."""
    from workbook.grading.labs import ENV_IMPL
    full_key = None if key is None else (
        getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""), key, n, link, nnodes,
        os.environ.get(ENV_IMPL))
    if full_key is not None and full_key in STATE.cache:
        ok, value = STATE.cache[full_key]
        if ok:
            return value
        raise value
    timeout = STATE.timeout or timeout
    try:
        if STATE.job is not None:
            if link not in (None, "none") and getattr(STATE.job, "backend", "gloo") != "gloo":
                raise Skipped(f"runs on the simulated {link} link, whose ranks are CPU ranks over "
                              f"gloo; this torchrun job runs on {STATE.job.backend}: start it with "
                              f"--backend gloo, or run it as `workbook run LAB`")
            value = STATE.job.run(n, fn, args, kwargs, link=link, timeout=timeout,
                                  wall=_within_deadline(None))
        else:
            from workbook.runtime.launch import shared_pool
            from workbook.runtime.ranks import backend_for_link
            from workbook.runtime.rank_loop import release_freed_memory
            release_freed_memory()                  # what the last judge freed, before ranks run
            started = time.monotonic()
            pool = shared_pool(n, backend_for_link(link), max_live=_live_ranks(n), nnodes=nnodes)
            if STATE.deadline is not None:          # starting ranks is not the test's own time
                STATE.deadline += time.monotonic() - started
            value = pool.run(_in_impl, os.environ.get(ENV_IMPL), fn, *args, link=link,
                             timeout=timeout, wall=_within_deadline(None), **kwargs)
    except Exception as exc:                     # noqa: BLE001 - replayed to every reader
        if full_key is not None:
            STATE.cache[full_key] = (False, exc)
        raise
    if full_key is not None:
        STATE.cache[full_key] = (True, value)
    return value


def _live_ranks(n: int) -> int | None:
    """Under a rank cap N, the most ranks alive at once: the pools of every size up to N stay
    warm (1 + 2 + ... + N ranks; a cap of 1 keeps 1 and 2, as it grades on both), and a check
    that needs a larger pool closes the pools used longest ago first. None: no cap, no limit."""
    cap = max_ranks()
    if cap is None:
        return None
    cap = max(cap, 2)
    return max(cap * (cap + 1) // 2, n)


def _within_deadline(wall: float | None) -> float | None:
    """The wall limit of a run: ``wall`` (None: the pool's default), cut to what is left of the
    test's time limit (``STATE.deadline``), so that a run under the autograder ends, with the
    per-rank report, inside that limit."""
    if STATE.deadline is None:
        return wall
    left = round(STATE.deadline - time.monotonic(), 1)
    if left <= 0:
        from workbook.runtime.pool import RanksTimedOut
        raise RanksTimedOut("this test's time limit was spent before its next run on ranks began.")
    return left if wall is None else min(wall, left)


def _in_impl(impl, fn, *args, **kwargs):
    """On a pool rank: import the lab files the caller is checking (a warm pool may have been
    started for another folder), then run ``fn``."""
    from workbook.grading.labs import ENV_IMPL
    if impl:
        os.environ[ENV_IMPL] = impl
    return fn(*args, **kwargs)


# --------------------------------------------------------------------------- verdicts
from workbook.grading.labs import LabDoesNotImport  # noqa: E402


@dataclass
class Verdict:
    """What one check concluded: ``status`` is one of passed, failed, not implemented, hang,
    error (the learner's code raised), skipped."""
    lab: str
    name: str
    points: float
    status: str
    message: str = ""

    @property
    def score(self) -> float:
        return self.points if self.status == PASSED else 0.0


def _chain(exc):
    seen = 0
    while exc is not None and seen < 6:
        yield exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1


def not_implemented_message(exc) -> str | None:
    """``not implemented yet: <lab>.<function>`` when ``exc`` comes from an unfinished stub."""
    for e in _chain(exc):
        if isinstance(e, NotImplementedError):
            text = str(e).strip() or "not implemented yet"
            return text if text.startswith("not implemented yet") else f"not implemented yet: {text}"
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _learner_frame(exc) -> str:
    """``labs/collectives.py:170 in reduce``: the deepest frame in a lab file, if any."""
    from workbook.grading.labs import LABS
    text = "".join(str(e) for e in _chain(exc) if type(e).__name__ == "RemoteTraceback")
    if not text:
        import traceback
        text = "".join(traceback.format_exception(exc))
    frames = [m for m in _FRAME.finditer(text) if Path(m.group(1)).stem in LABS
              and "tests" not in Path(m.group(1)).parts]
    if not frames:
        return ""
    path, line, fn = frames[-1].groups()
    return f" (at {Path(path).parent.name}/{Path(path).name}:{line}, in {fn})"


def verdict_for(lab: str, name: str, points: float, exc: BaseException | None) -> Verdict:
    """Turn a check's outcome (None: it returned) into a verdict with a one-paragraph message."""
    from workbook.runtime.pool import RankFailed, RanksStillRunning, RanksTimedOut
    if exc is None:
        return Verdict(lab, name, points, PASSED)
    if isinstance(exc, LabDoesNotImport):
        return Verdict(lab, name, points, ERROR, str(exc))
    stub = not_implemented_message(exc)
    if stub:
        return Verdict(lab, name, points, NOT_IMPLEMENTED, stub)
    if isinstance(exc, RanksTimedOut):
        return Verdict(lab, name, points, HANG, str(exc))
    if isinstance(exc, RanksStillRunning):
        return Verdict(lab, name, points, ERROR, str(exc))
    if isinstance(exc, RankFailed):                    # a rank died: the whole explanation
        return Verdict(lab, name, points, ERROR, str(exc).strip())
    if isinstance(exc, Skipped) or type(exc).__name__ == "Skipped":
        return Verdict(lab, name, points, SKIPPED, f"skipped: {exc}")
    if isinstance(exc, AssertionError) or type(exc).__name__ == "Failed":   # pytest.raises, fail
        return Verdict(lab, name, points, FAILED, str(exc).strip())
    rank = getattr(exc, "rank", None)
    where = f"rank {rank}: " if rank is not None else ""
    first = first_line(str(exc))
    frame = _learner_frame(exc)
    who = "your code raised" if frame else "the check stopped on"
    return Verdict(lab, name, points, ERROR, f"{where}{who} {type(exc).__name__}: {first}{frame}")


def exit_code(verdicts: list[Verdict]) -> int:
    """0: every check passed (or was skipped); 1: one failed or is not implemented; 2: a hang."""
    if any(v.status == HANG for v in verdicts):
        return 2
    return 1 if any(v.status not in (PASSED, SKIPPED) for v in verdicts) else 0


# --------------------------------------------------------------------------- the checks
@dataclass
class Check:
    lab: str
    name: str
    points: float
    fn: object
    params: dict
    sizes: tuple = ()                   # a test parametrised by world size ``n``: all its values


def checks_path(lab: str) -> Path:
    from workbook.grading.labs import repo_root
    return repo_root() / "tests" / "grading" / f"test_{lab}.py"


_LOADS = itertools.count()


def _compile_with_pytest_asserts(path: Path):
    """The module's code with pytest's assertion rewriting, so that a plain ``assert a == b``
    says what a and b were in the self-check exactly as it does under pytest."""
    import ast
    source = path.read_bytes()
    tree = ast.parse(source, filename=str(path))
    try:
        from _pytest.assertion.rewrite import rewrite_asserts
        rewrite_asserts(tree, source, str(path))
    except Exception:                           # noqa: BLE001 - plain asserts still work
        pass
    return compile(tree, str(path), "exec", dont_inherit=True)


def load_checks(lab: str) -> list[Check]:
    """The grading tests of ``lab``, freshly imported (no run of an earlier check is reused),
    in file order, parametrised tests expanded."""
    path = checks_path(lab)
    if not path.is_file():
        raise FileNotFoundError(f"no checks for lab {lab!r}: {path} is missing")
    spec = importlib.util.spec_from_file_location(f"workbook_checks_{lab}_{next(_LOADS)}", path)
    module = importlib.util.module_from_spec(spec)
    exec(_compile_with_pytest_asserts(path), module.__dict__)
    tests = [(name, f) for name, f in vars(module).items()      # in file order, as pytest sees
             if name.startswith("test_") and callable(f)          # them (a test made by a
             and getattr(f, "__module__", None) == module.__name__]   # function: its own name)
    out = []
    for name, f in tests:
        marks = getattr(f, "pytestmark", [])
        points = next((float(m.args[0]) for m in marks if m.name == "points"), 0.0)
        base = name[len("test_"):]
        params = [m for m in marks if m.name == "parametrize"]
        if not params:
            out.append(Check(lab, base, points, f, {}))
            continue
        argname, values = params[0].args[0], params[0].args[1]
        for value in values:
            out.append(Check(lab, f"{base}[{value}]", points, f, {argname: value},
                             tuple(values) if argname == "n" else ()))
    return out


def run_checks(lab: str, *, nproc: int | None = None, timeout: float | None = None,
               only=None, job=None, on_verdict=None) -> list[Verdict]:
    """Run every check of ``lab`` (or those named in ``only``) and return their verdicts.

    ``nproc``: a self-check on that many ranks (None: the grader's world sizes);
    ``timeout``: seconds a run may take before it counts as a hang (None: each check's own);
    ``job``: a torchrun job's ranks; ``on_verdict``: called with each verdict as it is made."""
    STATE.nproc, STATE.timeout, STATE.job, STATE.cache = nproc, timeout, job, {}
    STATE.before_report = getattr(on_verdict, "flush", None)
    verdicts = []
    problem = lab_import_problem(lab)
    try:
        with tempfile.TemporaryDirectory(prefix=f"workbook-{lab}-") as tmp:
            STATE.tmpdir = tmp
            fixtures = {"trace_root": Path(tmp) / "traces"}
            fixtures["trace_root"].mkdir()
            for k, check in enumerate(load_checks(lab)):
                if only and check.name not in only and check.name.split("[")[0] not in only:
                    continue
                kwargs = dict(check.params)
                for name in inspect.signature(check.fn).parameters:
                    if name in kwargs:
                        continue
                    if name == "tmp_path":
                        kwargs[name] = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{k}-"))
                    else:
                        kwargs[name] = fixtures[name]
                verdict = (_run_one(check, kwargs) if problem is None else
                           verdict_for(lab, check.name, check.points, LabDoesNotImport(problem)))
                verdicts.append(verdict)
                if on_verdict:
                    on_verdict(verdict)
    finally:
        STATE.nproc, STATE.timeout, STATE.job, STATE.cache = None, None, None, {}
    return verdicts


def lab_import_problem(lab: str) -> str | None:
    """Why the lab file under test does not import (one line, file and line), or None."""
    from workbook.grading.labs import load_lab
    try:
        load_lab(lab)
    except LabDoesNotImport as exc:
        return str(exc)
    except Exception:                                   # noqa: BLE001 - a missing file etc.:
        return None                                     # the checks say it themselves
    return None


def _run_one(check: Check, kwargs: dict) -> Verdict:
    STATE.current = check.name
    try:
        if check.sizes and kwargs["n"] not in _requested(check.sizes):
            raise Skipped(f"this self-check runs on {STATE.nproc} ranks")
        check.fn(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:                        # noqa: BLE001 - every outcome is a verdict
        return verdict_for(check.lab, check.name, check.points, exc)
    return verdict_for(check.lab, check.name, check.points, None)
