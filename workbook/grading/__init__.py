"""The autograder: a pytest plugin (``plugin``), lab loading (``labs``) and reusable checks (``checks``).

Grading a learner's work means importing *their* file from ``labs/`` (or the reference from
``solutions/``, or any folder of lab files) on every rank and comparing what it does with a
reference: the numbers it returns and the communication it makes.
"""
from workbook.grading.labs import impl_dir, load_lab, repo_root

__all__ = ["impl_dir", "load_lab", "repo_root"]
