"""Family: the capstone (issue 32). For now ``workbook plan``: a 4D split of a real model on a
real cluster predicted from the course's formulas (``plan``), with its shapes and rules
(``plan_shapes``), FLOPs (``plan_flops``), memory (``plan_memory``), communication
(``plan_comm``), the search over splits (``plan_search``) and the command (``plan_cli``).

A family imports the layers below it, never another family: the formulas of lab
``overlap_math`` are re-derived here on the link layer's cost model (``workbook.link.topology``),
which is torch-free, so ``workbook plan`` starts without importing torch.
"""
