"""The markup of a solution file: the learner's blocks, their hint rungs, the challenge regions.

A *block* is the part of a task the learner writes; its first lines are three hint rungs, the
steps a learner can ask for one at a time (``workbook hint``)::

        ### BEGIN SOLUTION
        ### hint 1: the idea, and the lesson section that explains it
        ### hint 2: the steps, in words
        ### hint 3: near-code
        ...the reference code...
        ### END SOLUTION

A rung goes on over the lines below it that start with ``###`` and at least four spaces. A
*challenge region* wraps whole components: at the ``challenge`` level every function whose
``def`` lies inside it is the learner's, given code included (``workbook.instructor.assign``)::

    ### BEGIN CHALLENGE: BucketedDP, the whole class
    class BucketedDP(Trainer): ...
    ### END CHALLENGE

A generated lab names its level on its first line (``level_of``). Reading is all this module
does: no torch, no pytest.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
RUNG = re.compile(r"^\s*### hint (?P<k>\d):\s*(?P<text>.*)$")
MORE = re.compile(r"^\s*###\s{4,}(?P<text>\S.*)$")
CHALLENGE = re.compile(r"^(?P<indent>\s*)### BEGIN CHALLENGE:?\s*(?P<title>.*)$")
CHALLENGE_END = re.compile(r"^\s*### END CHALLENGE\s*$")
LEVEL_OF = re.compile(r"^# Generated from solutions/\S+ by `workbook assign` \(level: (\w+)\)")
DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")
RUNGS = 3


class AssignError(ValueError):
    """A solution file whose markup `workbook assign` cannot read; the message names the line."""


@dataclass
class Block:
    """One ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block (line numbers from 0)."""
    begin: int                   # the BEGIN line
    end: int                     # the END line
    indent: str
    where: str                   # the dotted function that holds it: ``BucketedDP.grad_ready``
    rungs: list[str]             # hint 1..3 (the legacy one-line hint, if any, as rung 3)
    code: list[str] = field(default_factory=list)     # the reference lines, rungs left out


@dataclass
class Region:
    """One ``### BEGIN CHALLENGE`` ... ``### END CHALLENGE`` region (line numbers from 0)."""
    begin: int
    end: int
    indent: str
    title: str


def level_of(lab_text: str) -> str | None:
    """The level a generated lab says it was made at, on its first line (None: not a generated
    lab, or one older than the levels)."""
    m = LEVEL_OF.match(lab_text)
    return m[1] if m else None


def enclosing(lines: list[str], index: int, indent: int) -> str:
    """The dotted name of the function/class that holds line ``index``."""
    names, limit = [], indent
    for line in reversed(lines[:index]):
        m = DEF.match(line)
        if m and len(m["indent"]) < limit:
            names.append(m["name"])
            limit = len(m["indent"])
            if limit == 0:
                break
    return ".".join(reversed(names)) or "<module>"


def _rungs(src: list[str], i: int, filename: str, legacy: str) -> tuple[list[str], int]:
    """The hint rungs that open a block at line ``i`` (just after BEGIN); the first code line."""
    rungs: dict[int, str] = {}
    last = None
    while i < len(src):
        m, more = RUNG.match(src[i]), MORE.match(src[i])
        if m:
            k = int(m["k"])
            if not 1 <= k <= RUNGS or k in rungs:
                raise AssignError(f"{filename}:{i + 1}: hint {k}: a block has hints 1 to "
                                  f"{RUNGS}, each once")
            rungs[k], last = m["text"].strip(), k
        elif more and last is not None:
            rungs[last] += " " + more["text"].strip()
        else:
            break
        i += 1
    if legacy and rungs:
        raise AssignError(f"{filename}: a block has both `### BEGIN SOLUTION hint:` and "
                          f"`### hint N:` lines; keep the rungs")
    if legacy:
        rungs[RUNGS] = legacy
    return [rungs.get(k, "") for k in range(1, RUNGS + 1)], i


def parse(text: str, filename: str) -> tuple[list[Block], list[Region]]:
    """Every block and challenge region of a solution file, in order; ``AssignError`` for
    markup that does not nest (a block outside its BEGIN/END, a region never closed, ...)."""
    src = text.splitlines()
    blocks: list[Block] = []
    regions: list[Region] = []
    open_region: tuple[int, str, str] | None = None
    i = 0
    while i < len(src):
        line = src[i]
        if END.match(line):
            raise AssignError(f"{filename}:{i + 1}: ### END SOLUTION without a BEGIN")
        if (m := CHALLENGE.match(line)):
            if open_region is not None:
                raise AssignError(f"{filename}:{i + 1}: a challenge region inside another")
            open_region = (i, m["indent"], m["title"].strip())
            i += 1
            continue
        if CHALLENGE_END.match(line):
            if open_region is None:
                raise AssignError(f"{filename}:{i + 1}: ### END CHALLENGE without a BEGIN")
            regions.append(Region(open_region[0], i, open_region[1], open_region[2]))
            open_region = None
            i += 1
            continue
        if RUNG.match(line):
            raise AssignError(f"{filename}:{i + 1}: a hint line outside the top of a block")
        m = BEGIN.match(line)
        if not m:
            i += 1
            continue
        start = i
        legacy = m["hint"].strip().removeprefix("hint:").strip()
        rungs, i = _rungs(src, i + 1, filename, legacy)
        code_from = i
        while i < len(src) and not END.match(src[i]):
            if BEGIN.match(src[i]) or CHALLENGE.match(src[i]) or CHALLENGE_END.match(src[i]):
                raise AssignError(f"{filename}:{i + 1}: a marker inside a block (blocks do "
                                  f"not nest)")
            i += 1
        if i == len(src):
            raise AssignError(f"{filename}:{start + 1}: ### BEGIN SOLUTION is never closed")
        blocks.append(Block(start, i, m["indent"], enclosing(src, start, len(m["indent"])),
                            rungs, src[code_from:i]))
        i += 1
    if open_region is not None:
        raise AssignError(f"{filename}:{open_region[0] + 1}: ### BEGIN CHALLENGE is never closed")
    return blocks, regions
