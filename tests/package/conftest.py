"""Shared set-up for the package's own tests.

The link calibration is pinned (WORKBOOK_LOCAL_FLOPS) so that modelled times do not depend on how
busy this machine is while the tests run; rank pools inherit it when they start.
"""
import os

os.environ.setdefault("WORKBOOK_LOCAL_FLOPS", "5e10")
