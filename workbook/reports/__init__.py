"""The labs' figures: what a finished lab measures, printed after its self-check.

The self-check's verdicts (``workbook.grading.engine``) say whether a lab is right; a report
says what it does: bandwidths, hidden communication, activation memory, predictions. A report
is one module per lab, ``workbook.reports.<lab>``, with

* ``run(trace_dir=None)``: runs on every rank (``trace_dir``: a folder for the profiler traces,
  or ``None``); imports the implementation being checked with
  ``workbook.grading.labs.load_lab("<lab>")`` and returns this rank's figures (plain data);
* ``describe(results) -> str``: the figures of every rank (``results[r]`` is rank r's), as text;
* optionally ``WORLD_SIZE`` (default 2) and ``LINK`` (default ``"none"``): the ranks and the
  simulated link preset the figures are taken on, unless ``--nproc`` / ``--link`` say otherwise
  (under torchrun, the job's ranks).

``workbook.selfcheck`` runs it after the checks; a notebook runs it with
``workbook.lessons.on_ranks(report.run, n, trace_dir, link=PRESET)``. A lab that is not finished
raises ``NotImplementedError`` from ``run``, and the figures are skipped. Figures on a simulated
link are labelled so: they are a CPU in slow motion, not measured hardware.
"""
