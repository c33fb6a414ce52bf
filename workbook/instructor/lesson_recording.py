"""Recorded reference outputs: what a lesson shows of the reference, for a release that has none.

Lessons 4 to 11 show figures, traces and tables of a lab; where the learner's lab does not run
yet, they run the reference ``solutions/LAB.py`` in its place. A student release has no
``solutions/``, so ``workbook release`` runs each such lesson once, on the instructor's machine,
with the release's own stub labs (so every lesson takes its reference path), and keeps what the
cells that depend on the reference printed and drew: ``lessons/recorded/LAB.json.gz``. In the
release, ``workbook.lessons.yours_reference_or_recorded`` shows those outputs in place of the
cells, labelled as the reference's, until the learner's lab is finished.

Which cells depend on the reference is read from the lesson's code (``dependent_cells``): a cell
whose code names the reference (``STANDS_IN``: the string ``"solutions"``, or
``reference_lab(``) is one, and so is every later cell that reads a name such a cell set (or
changed in place: ``x[k] = ...``, ``x.append(...)``); a cell that sets the name again from
clean values makes it clean. The other cells run live in the release, as they do here.

A recording holds outputs only, never code: no cell may fail while recording (a traceback
would show the reference's lines), and ``release_check`` reads the text a recording shows
(``output_lines``) for lines of the answer key, as it reads every other file of a release.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path

RECORDED_DIR = "lessons/recorded"
STANDS_IN = re.compile(r"""(["'])solutions\1|\breference_lab\(""")  # code that runs the reference
KEEP = ("application/vnd.plotly.v1+json", "image/png", "image/svg+xml", "text/markdown",
        "text/html", "text/plain")           # what a recorded output keeps (no widget views)
MUTATORS = {"append", "extend", "update", "setdefault", "insert", "add", "pop", "clear"}
CELL_TIMEOUT_S = 240
CACHE_DIR = "runs/recorded-lessons"          # the instructor's cache (git ignores runs/)


class RecordingError(ValueError):
    """A lesson that could not be recorded; the message names the lesson and the cell."""


def recording_file(lab: str) -> str:
    """Where a release keeps the recording of ``lab``'s lesson (gzip'd JSON: a lesson's full
    trace timeline is megabytes of text, a tenth of that compressed)."""
    return f"{RECORDED_DIR}/{lab}.json.gz"


def dump(recording: dict) -> bytes:
    """A recording as the release stores it: the same bytes for the same recording."""
    return gzip.compress(json.dumps(recording, separators=(",", ":")).encode(), mtime=0)


def load(path: Path) -> dict:
    """A recording ``dump`` wrote."""
    return json.loads(gzip.decompress(Path(path).read_bytes()))


def cell_key(source: str) -> str:
    """The key of a code cell: a hash of its code, stripped (the same in ``.py`` and ``.ipynb``)."""
    return hashlib.sha256(source.strip().encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- which cells
def _names(tree: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """``(read, set, changed in place)``: the names a cell's code reads, binds, and mutates."""
    read, bound, changed = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and \
                isinstance(node.ctx, (ast.Store, ast.Del)):
            root = node.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name):
                changed.add(root.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
            changed.add(node.func.value.id)
    return read, bound, changed


def dependent_cells(sources: list[str]) -> list[int]:
    """The indices of the code cells (``sources``, in order) whose outputs depend on the
    reference: those naming it (``STANDS_IN``), then, in order, those reading a name it left."""
    tainted: set[str] = set()
    out = []
    for k, source in enumerate(sources):
        try:
            tree = ast.parse(source)
        except SyntaxError:                # a cell with IPython syntax: judged by its text alone
            tree = ast.parse("")
        read, bound, changed = _names(tree)
        code = [ln for ln in source.splitlines() if not ln.lstrip().startswith("#")]
        if any(STANDS_IN.search(ln) for ln in code) or (read | changed) & tainted:
            out.append(k)
            tainted |= bound | changed
        else:
            tainted -= bound
    return out


# --------------------------------------------------------------------------- recording
def machine() -> dict:
    """The machine a recording was made on, in words a learner can read."""
    import torch
    return {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "device": "CPU ranks over gloo, simulated link"}


def _rounded(value):
    """``value`` with every float to 6 significant digits: a figure's numbers, a third the text."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _kept(output: dict) -> dict | None:
    """An output as a recording keeps it (None: nothing worth keeping, such as a widget view)."""
    kind = output.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": output["name"], "text": output["text"]}
    if kind in ("display_data", "execute_result"):
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
            return None                          # a widget's view: its text is only its repr
        data = {m: output["data"][m] for m in KEEP if m in output.get("data", {})}
        if "application/vnd.plotly.v1+json" in data:
            data.pop("text/html", None)                 # the figure itself is enough
            plotly = "application/vnd.plotly.v1+json"
            data[plotly] = _rounded(data[plotly])
        if not data:
            return None
        return {"output_type": "display_data", "data": data}
    return None


def _execute(script: Path, course: Path, timeout: float):
    """The lesson ``script`` executed in a fresh kernel with ``course`` as the course folder."""
    import jupytext
    from nbclient import NotebookClient
    nb = jupytext.read(script)
    saved = {k: os.environ.get(k) for k in ("WORKBOOK_ROOT", "WORKBOOK_LESSONS_NO_GRADE",
                                             "PYTHONPATH")}
    package = str(script.parents[1])            # the kernel imports the course's own package
    os.environ.update(WORKBOOK_ROOT=str(course), WORKBOOK_LESSONS_NO_GRADE="1",
                      PYTHONPATH=os.pathsep.join(filter(None, [package, saved["PYTHONPATH"]])))
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(script.parent)}})
        client.widget_registry = {}     # as workbook.lessons.run_headless: nbclient#312
        client.execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return nb


def record_lesson(script: Path, lab: str, course: Path, timeout: float = CELL_TIMEOUT_S) -> dict:
    """Run the lesson ``script`` with ``course`` as the course folder (stub labs, the reference
    beside them) and return its recording: the outputs of the cells that depend on the
    reference, by ``cell_key``."""
    t0 = time.perf_counter()
    nb = _execute(script, course, timeout)
    code = [c for c in nb.cells if c.cell_type == "code"]
    cells = []
    for k in dependent_cells([c.source for c in code]):
        outputs = [o for o in map(_kept, code[k].get("outputs", [])) if o]
        cells.append({"key": cell_key(code[k].source), "cell": k,
                      "starts": (code[k].source.strip().splitlines() or [""])[0][:80],
                      "outputs": outputs})
    return {"lesson": f"lessons/{script.name}", "lab": lab, "reference": f"solutions/{lab}.py",
            "seconds": round(time.perf_counter() - t0, 1), "cells": cells}


def _fingerprint(root: Path, script: Path, lab: str) -> str:
    """What a recording depends on: the lesson, the reference and the package's code that
    lessons run (all of it but ``workbook/instructor``, which makes releases)."""
    h = hashlib.sha256()
    package = [p for p in sorted((root / "workbook").rglob("*.py"))
               if "instructor" not in p.relative_to(root / "workbook").parts]
    for path in [script, root / "solutions" / f"{lab}.py", *package]:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def record_lessons(root: Path, lessons: list[dict], labs: dict[str, bytes],
                   made_from: dict) -> tuple[dict[str, bytes], dict]:
    """Record every lesson of ``lessons`` (``[{lesson, lab}]``, as ``release.lessons_standing_in``
    finds them) with the stub labs ``labs`` (``{"tp.py": bytes, "hints.json": ...}``): the
    release's files ``lessons/recorded/LAB.json.gz``, and the manifest's entry for them. A recording
    whose lesson, reference and package are unchanged is taken from ``CACHE_DIR``."""
    course = Path(tempfile.mkdtemp(prefix="workbook-recording-"))
    files, timings, t0, first = {}, {}, time.perf_counter(), {}
    try:
        (course / "labs").mkdir()
        for name, data in labs.items():
            (course / "labs" / name).write_bytes(data)
        (course / "solutions").symlink_to(root / "solutions", target_is_directory=True)
        for item in lessons:
            script, lab = root / item["lesson"], item["lab"]
            cache = root / CACHE_DIR / f"{lab}-{_fingerprint(root, script, lab)}.json"
            if cache.is_file():
                recording = json.loads(cache.read_text())
                timings[lab] = "cached"
            else:
                try:
                    recording = record_lesson(script, lab, course)
                except Exception as exc:        # noqa: BLE001 - one line, never the traceback
                    what = str(exc).strip().splitlines()
                    raise RecordingError(
                        f"recording {item['lesson']} with the reference failed "
                        f"({type(exc).__name__}: {what[-1] if what else ''}): run the lesson "
                        f"in the course (stub labs) to see where, fix it, and make the release "
                        f"again") from None
                recording |= {"made_from": made_from, "machine": machine(),
                              "recorded_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
                cache.parent.mkdir(parents=True, exist_ok=True)
                partial = cache.with_suffix(f".{os.getpid()}.part")
                partial.write_text(json.dumps(recording))
                partial.replace(cache)                  # whole, even with two releases at once
                for old in cache.parent.glob(f"{lab}-*.json"):
                    if old != cache:
                        old.unlink(missing_ok=True)     # a recording of an older course
                timings[lab] = recording["seconds"]
            files[recording_file(lab)] = dump(recording)
            first = first or recording
    finally:
        shutil.rmtree(course, ignore_errors=True)
    entry = {"what": "outputs of the reference, recorded for the lessons that show it "
                     "(workbook.lessons.yours_reference_or_recorded shows them)",
             "made_from": first.get("made_from"), "machine": first.get("machine"),
             "seconds": round(time.perf_counter() - t0, 1), "per_lesson_seconds": timings,
             "bytes": {rel: len(data) for rel, data in files.items()}}
    return files, entry


# --------------------------------------------------------------------------- reading one
def output_lines(recording: dict) -> list[tuple[str, str]]:
    """``(where, line)`` of every line of text a recording shows (printed text, text parts of
    figures): what ``release --check`` reads."""
    out = []

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    for cell in recording.get("cells", []):
        where = f" (recorded cell {cell.get('cell')})"
        for output in cell.get("outputs", []):
            for text in strings(output.get("text", output.get("data", {}))):
                out += [(where, line) for line in text.splitlines()]
    return out
