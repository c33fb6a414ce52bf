"""WRONG ON PURPOSE (domino_wrong_chunk_order): the hidden states are joined last chunk first."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "domino")
_reference_domino_forward = domino_forward  # noqa: F821 (from the reference)


def domino_forward(m, x, targets, p, registry, **kwargs):
    loss, hidden = _reference_domino_forward(m, x, targets, p, registry, **kwargs)
    chunks = [hidden[rows] for rows in even_slices(x.shape[0], p)]  # noqa: F821
    return loss, torch.cat(chunks[::-1], dim=0)  # noqa: F821 wrong: chunks joined in reverse order
