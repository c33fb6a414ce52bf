"""Measuring a step (a layer): the link's calibration, a profiled step, the figures and tables a
benchmark or a report prints, and a benchmark's command-line helpers.

What every family's benches and reports share lives here, written once; what is one lab's own
lives in that lab's family, named after the lab (``workbook.data_parallel.dp_overlap_bench``,
``workbook.data_parallel.dp_overlap_report``; ``workbook.grading.labs.lab_module`` finds them).

A lab's *report* (``workbook.<family>.<lab>_report``) says what a finished lab does: bandwidths,
hidden communication, activation memory, predictions. It has

* ``run(trace_dir=None)``: runs on every rank (``trace_dir``: a folder for the profiler traces,
  or ``None``: then a report that reads traces keeps them in a temporary folder it removes,
  ``profiled_step.trace_folder``; several builds in one file are steps, ``traced_step``);
  imports the implementation being checked with
  ``workbook.grading.labs.load_lab("<lab>")`` and returns this rank's figures (plain data);
* ``describe(results) -> str``: the figures of every rank (``results[r]`` is rank r's), as text;
* optionally ``WORLD_SIZE`` (default 2) and ``LINK`` (default ``"none"``): the ranks and the
  simulated link preset the figures are taken on, unless ``--nproc`` / ``--link`` say otherwise.

``workbook.selfcheck`` runs it after the checks; a notebook runs it with
``workbook.lessons.on_ranks(report.run, n, trace_dir, link=PRESET)``. A lab that is not finished
raises ``NotImplementedError`` from ``run``, and the figures are skipped. Figures on a simulated
link are labelled so (``output.where_measured``): a CPU in slow motion, not measured hardware.
"""
