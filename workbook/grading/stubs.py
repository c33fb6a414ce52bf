"""An unfinished task told in the grading process, before any rank starts.

A generated stub (``workbook assign``) is a function whose body is its docstring and one line,
``raise NotImplementedError("not implemented yet: LAB.NAME")``. A check whose rank side runs
given code first (a model built, an optimizer made, a schedule read from PyTorch) and reaches
the learner's code only then would spend seconds on every rank before the stub raises: building
``torch.optim.Adam`` the first time imports ``torch._dynamo`` (2-5 s a process here), and
reading PyTorch's pipeline orders imports ``torch.distributed.pipelining``. When the first
learner function that given code calls is still the stub, the ranks can only raise its message,
so the check raises it here instead, in well under a second (the same verdict, "not implemented
yet: LAB.NAME", the same words).

* ``stub_message(fn)``: the message of ``fn`` when it is an untouched stub, else None (read from
  its source, never called);
* ``raise_if_stub(*fns)``: raise ``NotImplementedError`` with the first stub's message.

Only for a function that given code calls unconditionally before any other learner code of the
check: once the learner has written it (anything but the stub's one line), the check runs on the
ranks as before.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

STUB_WORDS = "not implemented yet"


def stub_message(fn) -> str | None:
    """``"not implemented yet: LAB.NAME"`` when ``fn``'s body is the generated stub (a docstring
    at most, then ``raise NotImplementedError("not implemented yet: ...")``), else None (also
    when its source cannot be read)."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]                                  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return None
    exc = body[0].exc
    if not (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name)
            and exc.func.id == "NotImplementedError" and len(exc.args) == 1 and not exc.keywords
            and isinstance(exc.args[0], ast.Constant) and isinstance(exc.args[0].value, str)):
        return None
    text = exc.args[0].value
    return text if text.startswith(STUB_WORDS) else None


def raise_if_stub(*fns) -> None:
    """Raise ``NotImplementedError(stub_message(fn))`` for the first of ``fns`` that is an
    untouched stub; nothing when none is."""
    for fn in fns:
        message = stub_message(fn)
        if message:
            raise NotImplementedError(message)
