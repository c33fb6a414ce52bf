"""What a lesson's kernel imports before its first figure: ``workbook.lessons`` defers
``rfc3987_syntax`` (jsonschema's ``iri`` checker, which builds some 35 lark parsers when it is
imported: 2 s of CPU per kernel) until it is used, and jsonschema checks ``iri`` as before."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import workbook.lessons
import plotly.graph_objects as go
go.Figure(go.Scatter(x=[1], y=[2]))._repr_mimebundle_()   # a figure shown: nbformat, jsonschema
stand_in = sys.modules["rfc3987_syntax"]
assert "rfc3987_syntax.syntax_helpers" not in sys.modules, "the parsers were built at import"
import jsonschema
check = jsonschema.Draft7Validator.FORMAT_CHECKER
assert "iri" in check.checkers, "jsonschema registered no iri checker"
assert check.conforms("http://example.com/\\u00e4", "iri")
assert not check.conforms("not an iri ::", "iri")
assert sys.modules["rfc3987_syntax"] is not stand_in, "the real module did not replace it"
print("ok")
"""


def test_first_figure_builds_no_iri_parsers_and_iri_is_still_checked():
    pytest.importorskip("rfc3987_syntax")
    pytest.importorskip("plotly")
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
