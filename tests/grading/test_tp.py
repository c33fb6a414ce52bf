"""Autograder for lab 4, ``tp``: Megatron tensor parallelism against the single-device reference.

One batched run per world size (1, 2, 3, 4) on a warm rank pool builds every part of the lab
under test (the conjugate ops, the parallel linears, MLP, attention, block, model) for several
configs (gpt with dropout and llama, fp64 and fp32, shapes that are not powers of two on 3
ranks) and returns each rank's outputs and gradient pieces. The reference runs once per config
in this process; each rank's piece is compared with the matching slice of the reference
(``workbook.grading.model_checks``, shared with the sp grader). A second, traced run on a
simulated link reads the block's collectives per phase from the PyTorch-profiler trace.

Checks that teach at every level: the model's test first grades its sub-steps on their own (the
vocab-parallel embedding, the vocab-parallel loss), so a wrong answer is named by the sub-step
that went wrong even when the learner wrote them as one component (``--level challenge``); and a
failure is followed by a likely cause when the ranks' pieces match a classic mistake (a gradient
that is one rank's share of the sum, a bias counted n times, lookups never summed, a maximum
taken per rank, a target logit not masked), said in terms of the spec and the lesson.
"""
from __future__ import annotations

import pytest
import torch

from workbook.grading.engine import graded_size, on_ranks, world_sizes
from workbook.grading.model_checks import B, STEP, build_errors, check_divisibility, check_grads, \
    check_ops, check_part, compare, configs, cut, grads, ints, raise_if_failed, randn, reference, \
    run_case, run_every_part, to_cpu, tolerance, traced_block_phases
from workbook.grading.threads import one_thread

TIMEOUT_S = 120.0
LAB = "tp"


def _linears(cfg):
    """The parallel linears graded: (label, reference name, in, out, kind, options, input
    layout, output layout)."""
    H, F = cfg.hidden, cfg.ffn_hidden
    up, down = ("fc1", "fc2") if cfg.style == "gpt" else ("w_up", "w_down")
    return [("ColumnParallelLinear", f"blocks.1.mlp.{up}", H, F, "column", {}, None, "last"),
            ("ColumnParallelLinear(gather_output=True)", "blocks.0.attn.wq", H, H, "column",
             {"gather_output": True}, None, None),
            ("RowParallelLinear", f"blocks.1.mlp.{down}", F, H, "row", {}, "last", None),
            ("RowParallelLinear(input_is_parallel=False)", "blocks.0.attn.wo", H, H, "row",
             {"input_is_parallel": False}, None, None)]


# --------------------------------------------------------------------------- rank side
def _run_ops(lab, rank, n, dev) -> list[dict]:
    """The four conjugate ops on integer-valued fp64 tensors (exact in any summation order)."""
    full, piece = (B, 4, 6 * n), (B, 4, 6)
    cases = [("copy_to_tensor_parallel_region", full, ("x",), full, ("g", rank)),
             ("reduce_from_tensor_parallel_region", full, ("x", rank), full, ("g",)),
             ("scatter_to_tensor_parallel_region", full, ("x",), piece, ("g", rank)),
             ("gather_from_tensor_parallel_region", piece, ("x", rank), full, ("g",))]
    out = []
    for op, in_shape, in_seed, out_shape, grad_seed in cases:
        x = ints(LAB, in_shape, *in_seed).to(dev).requires_grad_()
        y = getattr(lab, op)(x)
        y.backward(ints(LAB, out_shape, *grad_seed).to(dev))
        out.append({"op": op, "out": y.detach(), "grad": x.grad})
    return out


def _run_linears(lab, tag, cfg, rank, n, dev) -> list[dict]:
    cases = []
    for label, name, fin, fout, kind, opts, lin, lout in _linears(cfg):
        cls = lab.ColumnParallelLinear if kind == "column" else lab.RowParallelLinear
        layer = cls(cfg, name, fin, fout, device=dev, **opts)
        cases.append(run_case(LAB, tag, cfg, rank, n, dev, seed=name, module=layer, forward=layer,
                              label=label, features=(fin, fout), layouts=(lin, lout), name=name))
    return cases


def _run_module(part):
    """The runner of one sublayer or block: output, input gradient, gradients, and the
    collectives of each phase (flight recorder)."""
    def run(lab, tag, cfg, rank, n, dev) -> list[dict]:
        from workbook.runtime.flight import RECORDER
        cls = {"mlp": lab.TPMLP, "attn": lab.TPAttention, "block": lab.TPBlock}[part]
        module = cls(cfg, 1, dev)
        shape, dt = (B, cfg.seq_len, cfg.hidden), cfg.torch_dtype
        x = randn(LAB, shape, dt, tag, part, "x").to(dev).requires_grad_()
        RECORDER.reset()
        y = module(x, **({"step": STEP} if part == "block" else {}))
        fwd = RECORDER.counts()
        RECORDER.reset()
        y.backward(randn(LAB, shape, dt, tag, part, "dy").to(dev))
        return [{"label": cls.__name__, "out": y.detach(), "grad_in": x.grad, "grads": grads(module),
                 "in": None, "out_layout": None,
                 "calls": {"forward": fwd, "backward": RECORDER.counts()}}]
    return run


def _run_model(lab, tag, cfg, rank, n, dev) -> list[dict]:
    """The loss and gradients, each phase's collectives, and any saved tensor as wide as the
    vocabulary (full logits)."""
    from workbook.runtime.flight import RECORDER
    from workbook.model import make_batch
    model = lab.TPModel(cfg, dev)
    tokens, targets = make_batch(cfg, B, seed=5, device=dev)
    big = []

    def pack(t):
        if t.dim() >= 2 and t.shape[-1] == cfg.vocab_size and t.numel() >= B * cfg.seq_len * cfg.vocab_size:
            big.append(tuple(t.shape))
        return t

    RECORDER.reset()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(tokens, targets, step=STEP)
    fwd = [(c.name, c.size_bytes) for c in RECORDER.calls]
    RECORDER.reset()
    loss.backward()
    bwd = [(c.name, c.size_bytes) for c in RECORDER.calls]
    return [{"label": "TPModel", "out": loss.detach(), "grads": grads(model),
             "calls": {"forward": fwd, "backward": bwd}, "full_logits": big}]


def _run_embedding(lab, tag, cfg, rank, n, dev) -> list[dict]:
    """The vocab-parallel embedding alone: its output and its parameters' gradients."""
    from workbook.model import make_batch
    emb = lab.VocabParallelEmbedding(cfg, dev)
    tokens, _ = make_batch(cfg, B, seed=5, device=dev)
    h = emb(tokens)
    h.backward(randn(LAB, (B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, tag, "embed", "dy").to(dev))
    return [{"label": "VocabParallelEmbedding", "out": h.detach(), "grads": grads(emb)}]


def _run_loss(lab, tag, cfg, rank, n, dev) -> list[dict]:
    """The vocab-parallel loss alone, on this rank's slice of large logits."""
    from workbook.model import make_batch
    logits = cut(_loss_logits(tag, cfg), "last", rank, n).to(dev).requires_grad_()
    _, targets = make_batch(cfg, B, seed=5, device=dev)
    loss = lab.vocab_parallel_cross_entropy(logits, targets, cfg.vocab_size)
    loss.backward()
    return [{"label": "vocab_parallel_cross_entropy", "out": loss.detach(), "grad_in": logits.grad}]


def _loss_logits(tag, cfg):
    """Logits [B, S, V] large enough that a loss without the shift by the maximum overflows."""
    return 40.0 * randn(LAB, (B, cfg.seq_len, cfg.vocab_size), cfg.torch_dtype, tag, "loss", "z")


PARTS = {"linear": _run_linears, "mlp": _run_module("mlp"), "attn": _run_module("attn"),
         "block": _run_module("block"), "embed": _run_embedding, "loss": _run_loss,
         "model": _run_model}


def _run_all() -> dict:
    """On every rank: every part of the lab on every config of this world size, on one intra-op
    thread (``workbook.grading.threads``: the cases are tiny)."""
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    lab, n = load_lab(LAB), dist.get_world_size()
    with one_thread():
        res = run_every_part(lab, _run_ops, PARTS)
    if n > 1:                                  # the divisibility error: shapes that do not split
        good = ModelConfig() if n == 4 else ModelConfig.odd_shapes()
        bad = ModelConfig.odd_shapes() if n == 4 else ModelConfig()
        res["divisibility"] = build_errors(lambda: lab.TPModel(good), {
            "TPModel": lambda: lab.TPModel(bad), "TPAttention": lambda: lab.TPAttention(bad, 0),
            "TPMLP": lambda: lab.TPMLP(bad, 0)}, repr(bad))
    return to_cpu(res)


# --------------------------------------------------------------------------- test side
def _results(n):
    return on_ranks(n, _run_all, timeout=TIMEOUT_S, key="numerics")


def _part_test(part: str, points: int, tasks: tuple, doc: str):
    """The grading test of one part of the lab: every rank's outputs and gradient pieces on
    every world size and config, against the reference
    (``workbook.grading.model_checks.check_part``)."""
    @pytest.mark.points(points)
    @pytest.mark.tasks(*tasks)
    def test():
        with one_thread():                      # the references: tiny cases (threads.py)
            if part == "model":
                _with_likely_cause(_check_vocab_steps, _vocab_causes)
            _with_likely_cause(lambda: check_part(LAB, part, _results, _linears),
                               lambda: _part_causes(part))
    test.__doc__ = doc
    return test


# --------------------------------------------------------------------------- checks that teach
def _with_likely_cause(check, causes) -> None:
    """Run ``check``; on a failure, add the first classic mistake that ``causes()`` recognises
    in the ranks' results (a sentence), if any."""
    try:
        check()
    except AssertionError as exc:
        try:
            cause = causes()
        except Exception:                          # noqa: BLE001 - a diagnosis never hides the verdict
            cause = None
        if cause is None:
            raise
        raise AssertionError(f"{exc}\nLikely cause: {cause}") from None


def _close(a, b, cfg) -> bool:
    a, b = a.to(torch.float64), b.to(torch.float64)
    tol = tolerance(cfg)
    return a.shape == b.shape and torch.allclose(a, b, rtol=max(tol["rtol"], 1e-6),
                                                 atol=max(tol["atol"], 1e-6) * (1 + b.abs().max()))


def _entries(part, sizes=(2, 3, 4)):
    """``(n, tag, cfg, [every rank's cases])`` for each graded world size of ``sizes`` and
    config where every rank ran ``part`` to the end."""
    for n in world_sizes(*sizes):
        per_rank = _results(n)
        for tag, cfg in configs(n):
            entries = [res.get((part, tag)) for res in per_rank]
            if all(isinstance(e, list) for e in entries):
                yield n, tag, cfg, entries


def _part_causes(part: str) -> str | None:
    """A classic mistake of the linears, the MLP or the attention, read from every rank's
    pieces: the input gradient left as one rank's share (f's backward), the row bias counted
    once per rank (added before the sum)."""
    from workbook.model import local_weight
    from workbook.tensor_parallel.mappings import row_parallel_name
    if part not in ("linear", "mlp", "attn"):
        return None
    for n, tag, cfg, entries in _entries(part):
        for k, case in enumerate(entries[0]):
            ref = reference(LAB, part, tag, cfg, _linears(cfg))
            r = ref[case["name"]] if part == "linear" else ref
            if case["in"] is None and case["grad_in"] is not None:
                pieces = [e[k]["grad_in"] for e in entries]
                if not _close(pieces[0], r.grad_input, cfg) and \
                        _close(sum(p.to(torch.float64) for p in pieces), r.grad_input, cfg):
                    return (f"in {case['label']} ({tag}, tp={n}) each rank's gradient of the "
                            f"replicated input is its own share, and only their sum over the ranks "
                            f"is the reference's: the operator that enters a parallel region (f) "
                            f"must make every rank's input gradient the whole one in backward "
                            f"(lesson 4, \"The conjugate pair f and g\").")
            row = case["name"] if part == "linear" and "Row" in case["label"] else \
                f"blocks.1.{row_parallel_name(cfg, part)}" if part != "linear" else None
            if row is not None and case["out_layout"] is None and cfg.style == "gpt":
                bias = local_weight(cfg, f"{row}.bias", 0, 1)
                if _close(case["out"], r.out + (n - 1) * bias, cfg):
                    copies = "1 extra copy" if n == 2 else f"{n - 1} extra copies"
                    return (f"{case['label']} ({tag}, tp={n}) outputs the reference plus {copies} "
                            f"of the bias of {row}: that bias is replicated, so adding it on "
                            f"every rank before the sum over the ranks counts it {n} times; it "
                            f"belongs after the sum, once (lesson 4, \"Splitting a linear layer\", "
                            f"the bias rule).")
    return None


def _reference_embedding(tag, cfg):
    """The single-device embedding's output, parameter gradients and the batch's tokens."""
    from workbook.model import grads_by_name, make_batch
    from workbook.model.reference import Embedding
    key = ("tp-embed", tag)
    if key not in _VOCAB_REFERENCES:
        emb = Embedding(cfg, "embed")
        tokens, targets = make_batch(cfg, B, seed=5)
        h = emb(tokens)
        h.backward(randn(LAB, (B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, tag, "embed", "dy"))
        _VOCAB_REFERENCES[key] = (h.detach(), grads_by_name(emb), tokens, targets, emb)
    return _VOCAB_REFERENCES[key]


def _reference_loss(tag, cfg):
    """The single-device cross-entropy of the graded logits, and its gradient."""
    from workbook.model import ops
    key = ("tp-loss", tag)
    if key not in _VOCAB_REFERENCES:
        _, _, _, targets, _ = _reference_embedding(tag, cfg)
        z = _loss_logits(tag, cfg).requires_grad_()
        loss = ops.cross_entropy(z, targets)
        loss.backward()
        _VOCAB_REFERENCES[key] = (loss.detach(), z.grad)
    return _VOCAB_REFERENCES[key]


_VOCAB_REFERENCES: dict = {}


def _check_vocab_steps() -> None:
    """The model's sub-steps on their own, before the model: the embedding (output and
    gradients of the rank's rows) and the loss (value and the gradient of the rank's logits)."""
    for n in world_sizes(1, 2, 3, 4):
        per_rank = _results(n)
        for tag, cfg in configs(n):
            tol = tolerance(cfg)
            out, emb_grads, *_ = _reference_embedding(tag, cfg)
            loss, dz = _reference_loss(tag, cfg)
            for rank, res in enumerate(per_rank):
                entry = res[("embed", tag)]
                raise_if_failed(entry, rank, n, f"VocabParallelEmbedding ({tag})")
                where = f"VocabParallelEmbedding ({tag}, tp={n})"
                compare(entry[0]["out"], out, rank=rank, what=f"{where}: output", **tol)
                check_grads(entry[0]["grads"], emb_grads, rank=rank, n=n, where=where, tol=tol)
                entry = res[("loss", tag)]
                raise_if_failed(entry, rank, n, f"vocab_parallel_cross_entropy ({tag})")
                where = f"vocab_parallel_cross_entropy ({tag}, tp={n}, large logits)"
                compare(entry[0]["out"], loss, rank=rank, what=f"{where}: loss", **tol)
                compare(entry[0]["grad_in"], cut(dz, "last", rank, n), rank=rank,
                        what=f"{where}: gradient of this rank's logits", **tol)


def _vocab_causes() -> str | None:
    """A classic mistake of the vocab-parallel sub-steps, recognised from every rank's
    results: lookups never summed, ids of other ranks looked up, a maximum taken per rank, a
    target logit not masked, no shift by the maximum."""
    for n, tag, cfg, entries in _entries("embed"):
        out, _, tokens, _, emb = _reference_embedding(tag, cfg)
        got = [e[0]["out"].to(torch.float64) for e in entries]
        if _close(got[0], out, cfg):
            continue
        S, V = cfg.seq_len, cfg.vocab_size
        pos = emb.pos.weight[:S].detach().to(torch.float64) if cfg.style == "gpt" else 0.0
        if _close(sum(got), out + (n - 1) * pos, cfg) or _close(sum(got) - (n - 1) * pos, out, cfg):
            return (f"VocabParallelEmbedding ({tag}, tp={n}): each rank's output holds only the "
                    f"tokens of its own vocabulary rows; the n partial embeddings must be summed "
                    f"over the ranks so that every rank holds the whole one (lesson 4, \"Attention "
                    f"and the vocabulary\").")
        table = emb.tok.weight.detach().to(torch.float64)
        rows = V // n
        unmasked = [table[(tokens - r * rows).clamp(0, rows - 1) + r * rows] for r in range(n)]
        if _close(got[0], sum(unmasked) + pos, cfg):
            return (f"VocabParallelEmbedding ({tag}, tp={n}): every rank looked up a row for every "
                    f"token, its own or not; a token another rank holds must contribute zeros here "
                    f"(lesson 4, \"Attention and the vocabulary\").")
    for n, tag, cfg, entries in _entries("loss", (1, 2, 3, 4)):
        loss, _ = _reference_loss(tag, cfg)
        got = entries[0][0]["out"].to(torch.float64)
        if _close(got, loss, cfg):
            continue
        if not torch.isfinite(got):
            return (f"vocab_parallel_cross_entropy ({tag}, tp={n}) is not finite for large logits "
                    f"(40 times a standard normal): the exponentials overflow; shift the logits by their maximum over "
                    f"the whole vocabulary first (lesson 4, \"Attention and the vocabulary\").")
        _, _, _, targets, _ = _reference_embedding(tag, cfg)
        z = _loss_logits(tag, cfg).to(torch.float64)
        pieces, V = z.chunk(n, dim=-1), cfg.vocab_size
        rows = V // n
        local_max = sum((p - p.amax(-1, keepdim=True)).exp().sum(-1) for p in pieces).log()
        owner_max = torch.stack([p.amax(-1) for p in pieces]).gather(
            0, (targets // rows).unsqueeze(0)).squeeze(0)
        per_rank_max = (local_max - (z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - owner_max)).mean()
        if _close(got, per_rank_max, cfg):
            return (f"vocab_parallel_cross_entropy ({tag}, tp={n}) matches a loss whose maximum "
                    f"was taken on each rank's slice only: the ranks' sums of exponentials are then "
                    f"on different scales; the shift must be the maximum over the whole "
                    f"vocabulary, the same on every rank (lesson 4, \"Attention and the "
                    f"vocabulary\").")
        m = z.amax(-1, keepdim=True)
        lse = (z - m).exp().sum(-1).log()
        every = sum((p - m).gather(-1, (targets - r * rows).clamp(0, rows - 1).unsqueeze(-1)).squeeze(-1)
                    for r, p in enumerate(pieces))
        if _close(got, (lse - every).mean(), cfg):
            return (f"vocab_parallel_cross_entropy ({tag}, tp={n}): every rank contributed a "
                    f"target logit, its own or not; only the rank holding the target id may "
                    f"contribute it, the others zero (lesson 4, \"Attention and the vocabulary\").")
    return None


@pytest.mark.points(3)
@pytest.mark.tasks("_CopyToTensorParallelRegion", "_ReduceFromTensorParallelRegion",
                   "scatter_to_tensor_parallel_region", "gather_from_tensor_parallel_region")
def test_conjugate_ops():
    """f, g, scatter and gather: forward values and backward gradients, exactly."""
    _with_likely_cause(_check_conjugate_ops, _conjugate_causes)


def _conjugate_causes() -> str | None:
    """f or g that returns this rank's own tensor where the sum over the ranks is due."""
    for n in world_sizes(2, 3, 4):
        for rank, res in enumerate(_results(n)):
            if not isinstance(res["ops"], list):
                continue
            full = (B, 4, 6 * n)
            for case in res["ops"]:
                if case["op"] == "copy_to_tensor_parallel_region" and \
                        torch.equal(case["grad"], ints(LAB, full, "g", rank)):
                    return ("f's backward returned this rank's own gradient: the input fed every "
                            "rank's slice, so its gradient is the sum of every rank's (lesson 4, "
                            "\"The conjugate pair f and g\").")
                if case["op"] == "reduce_from_tensor_parallel_region" and \
                        torch.equal(case["out"], ints(LAB, full, "x", rank)):
                    return ("g's forward returned this rank's own partial result: leaving the "
                            "region, every rank must hold the sum of every rank's (lesson 4, "
                            "\"Splitting a linear layer\").")
    return None


def _check_conjugate_ops() -> None:
    for n in world_sizes(1, 2, 3, 4):
        full, piece = (B, 4, 6 * n), (B, 4, 6)
        g_sum = sum(ints(LAB, full, "g", r) for r in range(n))
        x_sum = sum(ints(LAB, full, "x", r) for r in range(n))
        check_ops(n, _results(n), lambda rank: {
            "copy_to_tensor_parallel_region": (ints(LAB, full, "x"), g_sum),
            "reduce_from_tensor_parallel_region": (x_sum, ints(LAB, full, "g")),
            "scatter_to_tensor_parallel_region": (
                cut(ints(LAB, full, "x"), "last", rank, n),
                torch.cat([ints(LAB, piece, "g", r) for r in range(n)], dim=-1)),
            "gather_from_tensor_parallel_region": (
                torch.cat([ints(LAB, piece, "x", r) for r in range(n)], dim=-1),
                cut(ints(LAB, full, "g"), "last", rank, n))})


test_parallel_linears = _part_test(
    "linear", 3, ("ColumnParallelLinear", "RowParallelLinear"),
    "Column- and row-parallel linears: outputs, input gradients and weight/bias gradient pieces; "
    "the row bias is added once, after the reduction.")
test_tp_mlp = _part_test("mlp", 3, ("TPMLP",), "The MLP on F/n features per rank: one f at its "
                         "input, one g at its output.")
test_tp_attention = _part_test("attn", 3, ("TPAttention",), "Attention on heads/n heads per "
                               "rank (RoPE for llama), wo row-parallel.")
test_tp_block = _part_test("block", 3, ("TPBlock",), "The whole pre-norm block with dropout "
                           "(gpt) and without (llama).")
test_tp_model = _part_test("model", 4, ("VocabParallelEmbedding", "vocab_parallel_cross_entropy",
                                        "TPModel"), "Vocab-parallel embedding, blocks, head and "
                           "cross-entropy: the loss and every gradient.")


def _ar_sizes(calls, name="all_reduce"):
    return [size for n, size, *_ in calls if n == name]


@pytest.mark.points(2)
@pytest.mark.tasks("vocab_parallel_cross_entropy", "TPModel")
def test_tp_model_collectives():
    """From the flight recorder: forward = 2 all-reduces of B*S*H per block + 1 (embedding)
    + a few small ones of B*S numbers (the cross-entropy); backward = 2 per block + 1 (the
    head's f); nothing else, and no rank holds logits as wide as the vocabulary."""
    for n in world_sizes(2, 3, 4):
        for tag, cfg in configs(n):
            bsh = B * cfg.seq_len * cfg.hidden * cfg.torch_dtype.itemsize
            bs = B * cfg.seq_len * cfg.torch_dtype.itemsize
            L = cfg.n_layers
            for rank, res in enumerate(_results(n)):
                entry = res[("model", tag)]
                raise_if_failed(entry, rank, n, f"model ({tag})")
                case = entry[0]
                where = f"TPModel ({tag}, tp={n})"
                for phase, want in (("forward", 2 * L + 1), ("backward", 2 * L + 1)):
                    calls = case["calls"][phase]
                    others = sorted({c[0] for c in calls} - {"all_reduce"})
                    if others:
                        raise AssertionError(f"rank {rank}: {where} {phase} called "
                                             f"{', '.join('dist.' + o for o in others)}; tensor "
                                             f"parallelism needs only all-reduces")
                    sizes = _ar_sizes(calls)
                    big = [s for s in sizes if s == bsh]
                    small = [s for s in sizes if s != bsh]
                    if len(big) != want:
                        raise AssertionError(
                            f"rank {rank}: {where} {phase}: expected {want} all-reduces of B*S*H = "
                            f"{bsh // cfg.torch_dtype.itemsize} elements (2 per block for "
                            f"{L} blocks + 1 for the "
                            f"{'embedding' if phase == 'forward' else 'head'}), got {len(big)}; "
                            f"all-reduce sizes in bytes: {sizes}")
                    limit = 0 if phase == "backward" else 3
                    if len(small) > limit or any(s > 2 * bs for s in small):
                        raise AssertionError(
                            f"rank {rank}: {where} {phase}: unexpected all-reduces of {small} bytes "
                            f"(the cross-entropy needs at most 3 of B*S = {bs // cfg.torch_dtype.itemsize} "
                            f"numbers in forward, none in backward)")
                if n > 1 and case["full_logits"]:
                    raise AssertionError(f"rank {rank}: {where} saved a tensor of shape "
                                         f"{case['full_logits'][0]} for backward: full logits; "
                                         f"keep the logits vocab-parallel ([B, S, V/n])")


@pytest.mark.points(3)
@pytest.mark.tasks("TPBlock")
@pytest.mark.parametrize("n", [2, 3])
def test_tp_block_pattern_from_trace(n, tmp_path):
    """From the profiler trace of one block on a simulated link: exactly 2 all-reduces in
    forward and 2 in backward, each of B*S*H elements, and no other collective."""
    n = graded_size(n, 2, 3)                   # under a rank cap: the largest size kept
    for rank, r, phase, got, where in traced_block_phases(LAB, n, tmp_path, "TPBlock",
                                                          timeout=TIMEOUT_S):
        bsh_bytes = r["elements"] * r["elsize"]
        others = sorted(set(got) - {"all_reduce"})
        if others:
            listed = ", ".join(f"{got[o]['count']}x {o} ({got[o]['bytes']} bytes)" for o in others)
            raise AssertionError(f"rank {rank}: {where}: found {listed}; a TP block "
                                 f"communicates with all-reduces of activations only (2 of "
                                 f"B*S*H = {r['elements']} elements per phase), never weights")
        count = got.get("all_reduce", {}).get("count", 0)
        if count != 2:
            which = "g after attention and after the MLP" if phase == "forward" else \
                "f before attention and before the MLP"
            raise AssertionError(f"rank {rank}: {where}: expected exactly 2 all_reduce, got "
                                 f"{count} ({which})")
        nbytes = got["all_reduce"]["bytes"]
        sizes = [s for name, s in r["recorder"][phase] if name == "all_reduce"]
        if (nbytes is not None and nbytes != 2 * bsh_bytes) or sizes != [bsh_bytes, bsh_bytes]:
            raise AssertionError(f"rank {rank}: {where}: all-reduces of {sizes} bytes "
                                 f"({nbytes} in all), expected 2 of B*S*H = {r['elements']} "
                                 f"elements = {bsh_bytes} bytes")


@pytest.mark.points(1)
@pytest.mark.tasks("TPModel")
def test_divisibility_error():
    """Shapes that do not split over tp give a one-line ValueError naming the field."""
    check_divisibility(_results, (3, 4), model="TPModel", names="tp={n}",
                       why="the shapes do not divide", fix="use cfg.validate(tp)")
