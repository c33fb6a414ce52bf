"""Autograder for lab 5, ``sp``: sequence-parallel tensor parallelism against the reference.

As for lab 4, one batched run per world size (1, 2, 3, 4) builds every part of the lab under
test on several configs and returns each rank's pieces: outputs and input gradients are
sequence shards (``x[:, s0:s1]``) or column slices, parameter gradients are compared after
``sync_sequence_parallel_grads`` (``workbook.grading.model_checks``, shared with the tp grader).
The model's test grades the embedding on its own first, so a wrong embedding is named as such at
every level, also when it is written together with the model.
The same run measures the activation memory of one block (``saved_tensors_hooks``), compared
with what a TP block would save, predicted from the single-device block: lab 5 is graded on its
own, never against the learner's lab 4. A traced run on a simulated link reads the block's
collectives per phase.

Byte convention for "the same bytes as vanilla TP": nccl-tests' bus bytes, i.e. what each rank
sends: an all-reduce of an S-byte buffer moves 2(n-1)/n * S, an all-gather or reduce-scatter of
the full S-byte buffer (n-1)/n * S (``workbook.link.bus_factor``). The trace's link spans size
an all-gather by its gathered output and a reduce-scatter by its full input, both B*S*H
elements per call here.
"""
from __future__ import annotations

import pytest
import torch

from workbook.grading.engine import graded_size, on_ranks, world_sizes
from workbook.grading.model_checks import B, STEP, build_errors, check_divisibility, check_grads, \
    check_ops, check_part, compare, configs, cut, grads, ints, raise_if_failed, randn, ranks_label, \
    run_case, run_every_part, sequence_parallel_linears, to_cpu, tolerance, traced_block_phases
from workbook.grading.threads import one_thread

TIMEOUT_S = 120.0
LAB = "sp"
MEMORY_RTOL = 0.02                       # measured SP activation bytes vs predicted


def _linears(cfg):
    return sequence_parallel_linears(cfg, "SPColumnParallelLinear", "SPRowParallelLinear")


# --------------------------------------------------------------------------- rank side
def _run_ops(lab, rank, n, dev) -> list[dict]:
    """The two sequence collectives as autograd ops, on integer-valued fp64 (exact)."""
    full, shard = (B, 4 * n, 6), (B, 4, 6)
    out = []
    for op, in_shape, out_shape in (("gather_from_sequence_parallel_region", shard, full),
                                    ("reduce_scatter_to_sequence_parallel_region", full, shard)):
        x = ints(LAB, in_shape, "x", rank).to(dev).requires_grad_()
        y = getattr(lab, op)(x)
        y.backward(ints(LAB, out_shape, "g", rank).to(dev))
        out.append({"op": op, "out": y.detach(), "grad": x.grad})
    return out


def _run_linears(lab, tag, cfg, rank, n, dev) -> list[dict]:
    cases = []
    for label, name, fin, fout, kind, lin, lout in _linears(cfg):
        cls = lab.SPColumnParallelLinear if kind == "column" else lab.SPRowParallelLinear
        layer = cls(cfg, name, fin, fout, device=dev)
        cases.append(run_case(LAB, tag, cfg, rank, n, dev, seed=name, module=layer, forward=layer,
                              label=f"{label} {name}", features=(fin, fout), layouts=(lin, lout),
                              sync=lab.sync_sequence_parallel_grads, name=name))
    return cases


def _run_module(part):
    """The runner of one sublayer or block, from sequence shards to sequence shards."""
    def run(lab, tag, cfg, rank, n, dev) -> list[dict]:
        cls = {"mlp": lab.SPMLP, "attn": lab.SPAttention, "block": lab.SPBlock}[part]
        module = cls(cfg, 1, dev)
        return [run_case(LAB, tag, cfg, rank, n, dev, seed=part, module=module,
                         forward=lambda x: module(x, **({"step": STEP} if part == "block" else {})),
                         label=cls.__name__, layouts=("seq", "seq"),
                         sync=lab.sync_sequence_parallel_grads)]
    return run


def _run_embedding(lab, tag, cfg, rank, n, dev) -> list[dict]:
    """The embedding alone: this rank's shard of its output, and its gradients after the sync."""
    from workbook.model import make_batch
    emb = lab.SPEmbedding(cfg, dev)
    tokens, _ = make_batch(cfg, B, seed=5, device=dev)
    h = emb(tokens)
    dy = randn(LAB, (B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, tag, "embed", "dy")
    h.backward(cut(dy, "seq", rank, n).to(dev))
    lab.sync_sequence_parallel_grads(emb)
    return [{"label": "SPEmbedding", "out": h.detach(), "grads": grads(emb)}]


def _run_model(lab, tag, cfg, rank, n, dev) -> list[dict]:
    from workbook.model import make_batch
    model = lab.SPModel(cfg, dev)
    tokens, targets = make_batch(cfg, B, seed=5, device=dev)
    loss = model(tokens, targets, step=STEP)
    loss.backward()
    lab.sync_sequence_parallel_grads(model)
    return [{"label": "SPModel", "out": loss.detach(), "grads": grads(model)}]


def _run_memory(lab, tag, cfg, rank, n, dev) -> list[dict]:
    """Bytes one SPBlock saves for backward, by region: the grader's own measurement
    (``workbook.model.memory``), not a helper of the lab."""
    from workbook.model.memory import saved_bytes_by_region
    block = lab.SPBlock(cfg, 0, dev)
    shape = (B, cfg.seq_len, cfg.hidden)
    x = cut(randn(LAB, shape, cfg.torch_dtype, tag, "memory", "x"), "seq", rank, n).to(dev)
    x.requires_grad_()
    return [saved_bytes_by_region(lambda: block(x, step=STEP), block, (lab.SPAttention, lab.SPMLP),
                                  outside="sequence")]


PARTS = {"linear": _run_linears, "mlp": _run_module("mlp"), "attn": _run_module("attn"),
         "block": _run_module("block"), "embed": _run_embedding, "model": _run_model,
         "memory": _run_memory}


def _run_all() -> dict:
    """On every rank: every part of the lab on every config of this world size (the memory
    run on fp64 only), on one intra-op thread (``workbook.grading.threads``: the cases are tiny)."""
    import torch.distributed as dist
    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    lab, n = load_lab(LAB), dist.get_world_size()
    with one_thread():
        res = run_every_part(lab, _run_ops, PARTS,
                             skip=lambda part, tag: part == "memory" and "fp32" in tag)
    if n > 1:                                  # a sequence length that does not split
        good = ModelConfig.odd_shapes() if n == 3 else ModelConfig()
        bad = good.replace(seq_len=10)
        res["divisibility"] = build_errors(lambda: lab.SPModel(good),
                                           {"SPModel": lambda: lab.SPModel(bad)},
                                           f"seq_len={bad.seq_len}")
    return to_cpu(res)


# --------------------------------------------------------------------------- test side
def _results(n):
    return on_ranks(n, _run_all, timeout=TIMEOUT_S, key="numerics")


def _part_test(part: str, points: int, tasks: tuple, doc: str):
    """The grading test of one part of the lab: every rank's pieces, after
    ``sync_sequence_parallel_grads``, against the reference
    (``workbook.grading.model_checks.check_part``)."""
    @pytest.mark.points(points)
    @pytest.mark.tasks(*tasks)
    def test():
        with one_thread():                     # the references: tiny cases (threads.py)
            try:
                if part == "model":            # its first sub-step on its own: names it at any level
                    _check_embedding()
                check_part(LAB, part, _results, _linears, synced=True)
            except AssertionError as exc:
                cause = _unsynced_cause(part) or _dropout_cause(part)
                if cause is None:
                    raise
                raise AssertionError(f"{exc}\nLikely cause: {cause}") from None
    test.__doc__ = doc
    return test


def _dropout_cause(part: str) -> str | None:
    """The block's output right without dropout (llama) and wrong with it (gpt, dropout 0.1),
    while its attention and MLP are right in both styles: the shards' dropout masks are not the
    reference's. (For the model: the same pattern in the block's own test.)"""
    from workbook.grading.model_checks import reference
    if part not in ("block", "model"):
        return None
    right = {(p, style): [] for p in ("attn", "mlp", "block") for style in ("gpt", "llama")}
    try:
        for n in world_sizes(1, 2, 3, 4):
            for tag, cfg in configs(n):
                for which in ("attn", "mlp", "block"):
                    ref = reference(LAB, which, tag, cfg, _linears(cfg))
                    for rank, res in enumerate(_results(n)):
                        entry = res.get((which, tag))
                        if not isinstance(entry, list):
                            return None
                        got = entry[0]["out"].to(torch.float64)
                        want = cut(ref.out, "seq", rank, n).to(torch.float64)
                        right[(which, cfg.style)].append(got.shape == want.shape and torch.allclose(
                            got, want, rtol=1e-4, atol=1e-6 * (1 + float(want.abs().max()))))
    except Exception:                              # noqa: BLE001 - a diagnosis never hides the verdict
        return None
    if all(all(right[(p, st)]) for p in ("attn", "mlp") for st in ("gpt", "llama")) and \
            all(right[("block", "llama")]) and not all(right[("block", "gpt")]):
        return ("the block is right without dropout (llama) and wrong with it (gpt), its "
                "attention and MLP right in both: each rank "
                "must drop its positions exactly as one device would, with its positions of the "
                "reference's mask of the whole sequence for the same site and step (lesson 5, "
                "\"Two new duties\").")
    return None


def _unsynced_cause(part: str) -> str | None:
    """A replicated parameter whose gradient stayed one rank's share: every rank's differs from
    the reference, their sum over the ranks equals it (it was never tagged, or never synced)."""
    from workbook.grading.model_checks import reference
    from workbook.model import shard_spec
    try:
        for n in world_sizes(2, 3, 4):
            per_rank = _results(n)
            for tag, cfg in configs(n):
                parts = ["embed", part] if part == "model" else [part]
                for which in parts:
                    entries = [res.get((which, tag)) for res in per_rank]
                    if not all(isinstance(e, list) for e in entries):
                        continue
                    for k, case in enumerate(entries[0]):
                        if which == "embed":
                            ref = _EMBED_REFERENCES.get(tag, (None, {}))[1]
                        elif which == "model":
                            ref = reference(LAB, "model", tag, cfg, _linears(cfg))[1]
                        elif which == "linear":
                            ref = reference(LAB, which, tag, cfg, _linears(cfg))[case["name"]].grads
                        else:
                            ref = reference(LAB, which, tag, cfg, _linears(cfg)).grads
                        for name, full in ref.items():
                            if shard_spec(name).kind != "replicated" or name.startswith("head"):
                                continue
                            got = [e[k]["grads"].get(name) for e in entries]
                            if any(g is None for g in got):
                                continue
                            got = [g.to(torch.float64) for g in got]
                            full = full.to(torch.float64)
                            scale = 1e-6 * (1 + full.abs().max())
                            if (got[0] - full).abs().max() > scale and \
                                    (sum(got) - full).abs().max() <= scale:
                                return (f"the gradient of {name} ({case['label']}, {tag}, tp={n}) "
                                        f"is, on each rank, the share of its own positions only, "
                                        f"and their sum over the ranks is the reference's: the "
                                        f"parameter is replicated but used on a sequence shard, so "
                                        f"it must be tagged sequence-parallel for the gradient "
                                        f"sync to add the shares (lesson 5, \"Two new duties\").")
    except Exception:                              # noqa: BLE001 - a diagnosis never hides the verdict
        return None
    return None


_EMBED_REFERENCES: dict = {}


def _check_embedding() -> None:
    """The embedding on its own, before the model: this rank's positions of the reference's
    output, and its parameters' gradients after the sync."""
    from workbook.model import grads_by_name, make_batch
    from workbook.model.reference import Embedding
    for n in world_sizes(1, 2, 3, 4):
        per_rank = _results(n)
        for tag, cfg in configs(n):
            if tag not in _EMBED_REFERENCES:
                emb = Embedding(cfg, "embed")
                h = emb(make_batch(cfg, B, seed=5)[0])
                h.backward(randn(LAB, (B, cfg.seq_len, cfg.hidden), cfg.torch_dtype, tag, "embed", "dy"))
                _EMBED_REFERENCES[tag] = (h.detach(), grads_by_name(emb))
            out, ref_grads = _EMBED_REFERENCES[tag]
            tol = tolerance(cfg)
            for rank, res in enumerate(per_rank):
                entry = res[("embed", tag)]
                raise_if_failed(entry, rank, n, f"SPEmbedding ({tag})")
                where = f"SPEmbedding ({tag}, tp={n})"
                got = entry[0]["out"]
                if n > 1 and got.shape == out.shape:
                    raise AssertionError(f"rank {rank}: {where}: output of shape {tuple(got.shape)}, "
                                         f"the whole sequence; the embedding ends in this rank's "
                                         f"positions [B, S/n, H] (lesson 5, \"The ends of the model\")")
                compare(got, cut(out, "seq", rank, n), rank=rank,
                        what=f"{where}: output (this rank's positions)", **tol)
                check_grads(entry[0]["grads"], ref_grads, rank=rank, n=n, where=where, tol=tol,
                            synced=True)


@pytest.mark.points(3)
@pytest.mark.tasks("all_gather_sequence", "reduce_scatter_sequence",
                   "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region")
def test_sequence_ops():
    """All-gather / reduce-scatter along the sequence and their conjugate backwards, exactly."""
    for n in world_sizes(1, 2, 3, 4):
        full, shard = (B, 4 * n, 6), (B, 4, 6)
        x_sum = sum(ints(LAB, full, "x", r) for r in range(n))
        g_sum = sum(ints(LAB, full, "g", r) for r in range(n))
        check_ops(n, _results(n), lambda rank: {
            "gather_from_sequence_parallel_region": (
                torch.cat([ints(LAB, shard, "x", r) for r in range(n)], dim=1),
                cut(g_sum, "seq", rank, n)),
            "reduce_scatter_to_sequence_parallel_region": (
                cut(x_sum, "seq", rank, n),
                torch.cat([ints(LAB, shard, "g", r) for r in range(n)], dim=1))})


test_sp_linears = _part_test(
    "linear", 3, ("SPColumnParallelLinear", "SPRowParallelLinear", "sync_sequence_parallel_grads"),
    "Column layer: sequence shard in, column slice out; row layer: reduce-scattered output with "
    "the bias once; bias gradients synchronised.")
test_sp_mlp = _part_test("mlp", 3, ("SPMLP",), "The MLP from sequence shards to sequence shards: "
                         "one all-gather in, one reduce-scatter out.")
test_sp_attention = _part_test("attn", 3, ("SPAttention",), "Attention over the whole gathered "
                               "sequence (RoPE on the full positions for llama).")
test_sp_block = _part_test("block", 3, ("sp_norm", "SPBlock"), "Norms and dropout on shards "
                           "(each shard its slice of the reference mask); the norm gradients "
                           "synchronised across the tensor-parallel ranks.")
test_sp_model = _part_test("model", 4, ("SPEmbedding", "SPModel"), "The embedding on its own "
                           "(this rank's positions, gradients after the sync), then the model: "
                           "blocks, head and loss, the loss and every gradient.")


@pytest.mark.points(3)
@pytest.mark.tasks("SPBlock")
def test_activation_memory():
    """Bytes saved for backward by one block: the parallel regions (attention, MLP) as in TP,
    the rest (norms, dropout, residual) divided by n. Predicted SP = TP_parallel + TP_rest / n,
    with TP's bytes predicted from the single-device block (``workbook.model.memory``)."""
    from workbook.model.memory import tensor_parallel_bytes
    for n in world_sizes(2, 3, 4):
        for tag, cfg in configs(n):
            if "fp32" in tag:
                continue
            tp = tensor_parallel_bytes(cfg, n, batch=B, step=STEP)
            tp_total, predicted = sum(tp.values()), tp["parallel"] + tp["sequence"] / n
            for rank, res in enumerate(_results(n)):
                entry = res[("memory", tag)]
                raise_if_failed(entry, rank, n, f"the activation-memory run ({tag})")
                sp = entry[0]
                sp_total = sum(sp.values())
                msg = (f"rank {rank}: one block ({tag}, tp={n}) saves {sp_total} bytes for backward "
                       f"with SP (parallel regions {sp['parallel']}, norms/dropout/residual "
                       f"{sp['sequence']}); TP saves {tp_total:.0f} ({tp['parallel']:.0f} + "
                       f"{tp['sequence']:.0f}); predicted SP = {tp['parallel']:.0f} + "
                       f"{tp['sequence']:.0f}/{n} = {predicted:.0f}")
                if sp_total >= tp_total:
                    raise AssertionError(msg + ": SP should save less than TP")
                if abs(sp_total - predicted) > MEMORY_RTOL * predicted:
                    hint = (" (a slice like mask[:, s0:s1] is a view that keeps the whole tensor "
                            "alive: copy it; a non-contiguous gathered input is copied by each "
                            "matmul that flattens it)") if sp_total > predicted else ""
                    raise AssertionError(msg + f": measured differs by more than "
                                               f"{MEMORY_RTOL:.0%}{hint}")


@pytest.mark.points(3)
@pytest.mark.tasks("SPBlock", "sync_sequence_parallel_grads")
@pytest.mark.parametrize("n", [2, 3])
def test_sp_block_pattern_from_trace(n, tmp_path):
    """From the trace of one SP block on a simulated link: forward and backward each make
    exactly 2 all-gathers and 2 reduce-scatters of B*S*H elements and no all-reduce; their bus
    bytes equal vanilla TP's 2 all-reduces of B*S*H."""
    n = graded_size(n, 2, 3)                   # under a rank cap: the largest size kept
    from workbook.link import bus_factor
    for rank, r, phase, got, where in traced_block_phases(LAB, n, tmp_path, "SPBlock", "seq",
                                                          timeout=TIMEOUT_S):
        bsh = r["elements"] * r["elsize"]
        if got.get("all_reduce", {}).get("count"):
            raise AssertionError(f"rank {rank}: {where}: {got['all_reduce']['count']} "
                                 f"all_reduce; sequence parallelism replaces each with a "
                                 f"reduce-scatter or an all-gather along the sequence")
        others = sorted(set(got) - {"all_gather", "reduce_scatter"})
        if others:
            raise AssertionError(f"rank {rank}: {where}: unexpected {', '.join(others)}")
        recorded = {"all_gather": 0, "reduce_scatter": 0}      # the flight recorder's view
        for name, size in r["recorder"][phase]:
            if name.startswith("all_gather"):
                recorded["all_gather"] += size                # sized by the gathered output
            elif name.startswith("reduce_scatter"):
                recorded["reduce_scatter"] += size * n        # sized by its output: one shard
        for name in ("all_gather", "reduce_scatter"):
            count = got.get(name, {}).get("count", 0)
            if count != 2:
                raise AssertionError(f"rank {rank}: {where}: expected exactly 2 {name}, got "
                                     f"{count}")
            if got[name]["bytes"] is None:                     # (a GPU trace may not say)
                got[name]["bytes"] = recorded[name]
            if got[name]["bytes"] != 2 * bsh:
                raise AssertionError(
                    f"rank {rank}: {where}: the {name}s moved buffers of {got[name]['bytes']} "
                    f"bytes in all, expected 2 of B*S*H = {r['elements']} elements "
                    f"({2 * bsh} bytes)")
        bus = sum(c["bytes"] * bus_factor(k, n) for k, c in got.items())
        tp_bus = 2 * bsh * bus_factor("all_reduce", n)
        if abs(bus - tp_bus) > 1e-6 * tp_bus:
            raise AssertionError(f"rank {rank}: {where}: {bus:.0f} bus bytes, vanilla TP "
                                 f"moves {tp_bus:.0f}")
        if phase == "backward" and n > 1 and not r["recorder"]["grad_sync"]:
            raise AssertionError(f"rank {rank}: sync_sequence_parallel_grads on {ranks_label(n)} "
                                 f"made no collective: the norm gradients are partial sums")


@pytest.mark.points(1)
@pytest.mark.tasks("SPModel")
def test_sp_divisibility_error():
    """A sequence length that does not split over tp is a one-line ValueError naming it."""
    check_divisibility(_results, (3, 4), model="SPModel", names="seq_len",
                       why="{config} does not divide",
                       fix="cfg.validate(tp, sequence_parallel=True)")
