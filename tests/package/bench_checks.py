"""What the tests of the model benchmarks (``test_bench_*.py``) share: a benchmark's options read
as its command line reads them, one run on tiny shapes with every output file written and read
back, the route from ``workbook bench LAB``, and the step a TP benchmark's variants must compute.
"""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager, nullcontext

import pytest


def parse(bench, *argv):
    """``argv`` read by the benchmark module ``bench``'s own options (``add_arguments``)."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def flags(options: dict) -> list[str]:
    """``{"micro_batches": 4}`` -> ``["--micro-batches=4"]``."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]


def run_tiny(bench, tmp_path, lab: str, *argv, warm: bool = False) -> tuple[dict, dict]:
    """``bench.run_bench`` on ``argv`` with its traces, ``--json`` and ``--figure`` under
    ``tmp_path``: the result, and the JSON file read back. The figure must have been written.
    ``warm``: the bench's ranks are the package's warm pool (``on_warm_ranks``), not fresh ones."""
    path = tmp_path / f"{lab}.json"
    with on_warm_ranks() if warm else nullcontext():
        result = bench.run_bench(parse(bench, *argv, "--trace-dir", str(tmp_path / "traces"),
                                       "--json", str(path), "--figure", str(tmp_path / "f.html")))
    assert (tmp_path / "f.html").stat().st_size > 1000
    return result, json.loads(path.read_text())


@contextmanager
def on_warm_ranks():
    """Inside: ``workbook.runtime.launch.run`` (which a benchmark's ``measure`` calls to start its
    ranks) runs on the shared warm pool of that size instead of starting fresh ranks (2-4
    processes importing torch: 3-9 s here). What the bench computes on them is the same; the
    command line still starts its own."""
    from workbook.runtime import launch
    fresh = launch.run

    def run(fn, world_size=2, *args, **kwargs):
        kwargs.pop("master_port", None)
        return fresh(fn, world_size, *args, **{**kwargs, "pool": True})
    launch.run = run
    try:
        yield
    finally:
        launch.run = fresh


def assert_cli_routes(capsys, lab: str, bad: list, says: str, options=(), usage_error=True) -> None:
    """``workbook bench LAB``: the options ``bad`` fail with a message that says ``says`` (a
    ``usage_error``: exit status 2, the message on stderr); ``--help`` shows the benchmark's own
    options (``options``); an option of ``workbook bench`` itself before LAB is a usage error
    (2); and ``workbook bench --help`` lists LAB."""
    from workbook.cli import main
    with pytest.raises(SystemExit) as err:
        main(["bench", lab, *bad])
    assert says in str(err.value), str(err.value)
    if usage_error:
        assert err.value.code == 2
        assert capsys.readouterr().err.startswith(f"workbook bench {lab}: {says}")
    with pytest.raises(SystemExit):
        main(["bench", lab, "--help"])
    out = capsys.readouterr().out
    assert f"workbook bench {lab}" in out and all(option in out for option in options)
    assert main(["bench", "--nproc", "2", lab]) == 2
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert lab in capsys.readouterr().out


def vanilla_tp_step():
    """On every rank (2): a small fp64 ``TPStack`` (dropout on) and its batch, after one vanilla
    TP step of the domino solution (``train_step``, step 3) with its gradients cleared:
    ``(stack, cfg, x, targets, vanilla loss, vanilla gradients by name)``, the step a
    benchmark's own variant must compute."""
    import torch
    import torch.distributed as dist

    from workbook.grading.labs import load_lab
    from workbook.model import ModelConfig
    from workbook.tensor_parallel.layer_stack import TPStack
    cfg = ModelConfig(hidden=64, heads=4, ffn_hidden=256, n_layers=2, seq_len=16, vocab_size=128,
                      dtype="float64", dropout=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 64, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 128, (4, 16), generator=g)
    m = TPStack(cfg, dist.get_rank(), dist.get_world_size())
    loss = load_lab("domino", "solutions").train_step(m, x, targets, variant="vanilla_tp",
                                                      step=3).item()
    grads = {k: t.grad.clone() for k, t in m.params.items()}
    m.zero_grad()
    return m, cfg, x, targets, loss, grads
