"""Figures of the overlap_math lab: your predictions, as a table, and one of them measured.

* **predictions**: for two layer shapes (a GPT-3 13B layer, a Llama-2 70B layer; bf16, one
  sequence) on the real hardware behind two link presets (``hardware``: H100s on NVLink inside
  a DGX-H100, and on PCIe without NVLink), your ``tp_layer`` (TP = 8), ``dp_layer`` and
  ``zero3_layer`` (64 ranks) and ``pp_stage`` (4 layers per stage): communication time,
  compute time, and their ratio. Below 1 the communication *can* hide behind compute (if the
  schedule lets it); above 1 no schedule can.
* **measured**: on 2 ranks over the simulated dgx-h100 link, one TP-like MLP forward with its
  all-reduce (``measure_tp_like_step``, shared with the grader): what the link charged for the all-reduce
  against your ``collective_time`` on ``simulated_hardware`` (the calibrated CPU link).
"""
from __future__ import annotations

WORLD_SIZE = 2
LINK = "dgx-h100"
PRESETS = ("dgx-h100", "pcie-h100")


def measure_tp_like_step(hidden: int = 256, tokens: int = 512) -> dict:
    """On a rank: one forward of a column->row MLP pair with its all-reduce, on the current link.
    Returns what the link charged and what the matmuls took, to compare with predictions."""
    import time

    import torch
    import torch.distributed as dist
    from workbook import link
    from workbook.runtime.ranks import device
    n = dist.get_world_size()
    dev = device()                                         # the rank's: NCCL takes no CPU tensor
    x = torch.randn(tokens, hidden, device=dev)
    w1 = torch.randn(4 * hidden // n, hidden, device=dev) / hidden ** 0.5
    w2 = torch.randn(hidden, 4 * hidden // n, device=dev) / hidden ** 0.5
    t0 = time.perf_counter()
    y = (x @ w1.T).relu() @ w2.T                        # [tokens, hidden], partial sums
    compute = time.perf_counter() - t0
    dist.all_reduce(y)
    record = link.op_log()[-1] if link.op_log() else None
    return {"compute_s": compute, "flops": 2.0 * tokens * hidden * 8 * hidden / n,
            "modelled_s": record.modelled_ns / 1e9 if record else 0.0,
            "bytes": y.numel() * y.element_size(), "world": n}


def run(trace_dir=None, impl=None) -> dict:
    from workbook import link
    from workbook.grading.labs import load_lab
    lab = load_lab("overlap_math", impl)
    layers = {"GPT-3 13B (h 5120, s 2048)": lab.Layer(5120, 4 * 5120, 1, 2048),
              "Llama-2 70B (h 8192, s 4096)": lab.Layer(8192, 28672, 1, 4096, style="llama")}
    rows = []
    for preset in PRESETS:
        hw = lab.hardware(preset)
        for name, layer in layers.items():
            for kind, p in (("TP=8 fwd", lab.tp_layer(layer, 8, hw)),
                            ("DP=64 bwd", lab.dp_layer(layer, 64, hw)),
                            ("ZeRO-3=64", lab.zero3_layer(layer, 64, hw)),
                            ("PP 4 layers", lab.pp_stage(layer, 4, hw))):
                rows.append({"hardware": preset, "layer": name, "kind": kind,
                             "comm_ms": p.comm_s * 1e3, "compute_ms": p.compute_s * 1e3})
    out = {"rows": rows}
    sim = link.current_link()
    if sim is not None:
        step = measure_tp_like_step()
        out["measured"] = {"bytes": step["bytes"], "charged_ms": step["modelled_s"] * 1e3,
                           "predicted_ms": lab.collective_time(
                               "all_reduce", step["bytes"], step["world"],
                               lab.simulated_hardware(sim)) * 1e3, "link": sim.label}
    return out


def describe(results: list[dict]) -> str:
    first = results[0]
    lines = ["overlap_math figures: your predictions on the real hardware of each preset "
             "(bf16, batch 1)",
             f"{'hardware':<13}{'layer':<30}{'parallelism':<13}{'comm ms':>9}{'compute ms':>11}"
             f"{'ratio':>7}  hides?"]
    last = None
    for r in first["rows"]:
        ratio = r["comm_ms"] / r["compute_ms"] if r["compute_ms"] else float("inf")
        head = (r["hardware"], r["layer"]) != last
        last = (r["hardware"], r["layer"])
        lines.append(f"{r['hardware'] if head else '':<13}{r['layer'] if head else '':<30}"
                     f"{r['kind']:<13}{r['comm_ms']:>9.3f}{r['compute_ms']:>11.3f}{ratio:>7.2f}"
                     f"  {'can hide' if ratio < 1 else 'cannot'}")
    m = first.get("measured")
    if m:
        lines.append(f"measured on the {m['link'].replace('simulated', 'SIMULATED', 1)}: "
                     f"all-reduce of {m['bytes']:,} B on {len(results)} ranks, predicted "
                     f"{m['predicted_ms']:.2f} ms, the link charged {m['charged_ms']:.2f} ms")
    return "\n".join(lines)
