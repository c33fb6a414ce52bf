"""Overlap Workbook: how distributed LLM training communicates, and how to hide it behind compute.

The package is deliberately light to import (no torch at import time) so that
``python -m workbook.bootstrap`` can run before torch is installed.
"""
__version__ = "0.1.0"

from workbook import _moved

_moved.install()          # an old import path gets one line naming the new place
