"""DELIBERATELY WRONG (autograder self-test, tests/package/test_tp_sp_wrong_caught.py): the
vocab-parallel embedding never sums the ranks' partial lookups, so each rank keeps only the
tokens of its own vocabulary rows."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "tp")


class VocabParallelEmbedding(VocabParallelEmbedding):  # noqa: F821 (from the reference)
    def forward(self, tokens):
        start, stop = vocab_range(self.cfg.vocab_size)  # noqa: F821
        mine = (tokens >= start) & (tokens < stop)
        local_ids = (tokens - start).clamp(0, stop - start - 1)
        h = self.tok.weight[local_ids] * mine.unsqueeze(-1).to(self.tok.weight.dtype)  # WRONG: no g
        if self.cfg.style == "gpt":
            h = h + self.pos.weight[: tokens.shape[1]]
        return h
