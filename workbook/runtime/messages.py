"""Cutting a message to one line without cutting it off.

A verdict, a note in the class table or a "figures skipped" line shows only the first line of
a longer message. A first line that ends in a colon announces what follows (``The last call of
each rank:``) and, cut there, reads as a sentence that stops mid-way. ``first_line`` keeps the
lines it announces, joined, so that whatever is shown ends in a complete statement.
"""
from __future__ import annotations


def first_line(text: str, limit: int | None = None) -> str:
    """The first line of ``text``; one that ends in a colon is continued with the lines it
    announces, joined by ``; ``; a colon with nothing after it becomes a full stop. ``limit``: at most
    that many characters, cut at a word and marked with an ellipsis."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    out = lines[0]
    if out.endswith(":") and len(lines) > 1:        # the list the colon opens, every item of it
        out = f"{out} " + "; ".join(ln.rstrip(".;") for ln in lines[1:]) + "."
    if out.endswith(":"):
        out = out[:-1].rstrip() + "."
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)].rsplit(" ", 1)[0].rstrip(" ,;:") + "…"
    return out
