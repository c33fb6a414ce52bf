"""Where ranks run (a layer): launching them, the warm pool, a rank's context and device, GPUs,
the flight recorder of collectives, and several nodes under torchrun.

It imports only ``workbook.link`` and ``workbook.model`` below it (import-linter keeps it so).
"""
