"""The GPU suite: every lab graded on CUDA, overlap read from CUDA kernels, the backend chosen.

Run it on a machine with an NVIDIA GPU: ``pytest tests/gpu -rs``. The ranks go where
``WORKBOOK_BACKEND=cuda`` puts them (``workbook.runtime.gpu``): NCCL with one GPU per rank where there
are enough GPUs; on fewer GPUs, NCCL with several ranks per GPU where the installed NCCL allows it
(2.30+, ``NCCL_MULTI_RANK_GPU_ENABLE=1``), else gloo with the tensors on the GPU. The header of
the run says which, for every world size the labs use.

Without CUDA every test here is skipped, with one reason (``NO_CUDA``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NO_CUDA = "no CUDA device: the GPU suite runs on a machine with an NVIDIA GPU (see README, GPUs)"
REQUEST = "cuda"                      # $WORKBOOK_BACKEND for the whole suite: the GPUs, whatever works
WORLD_SIZES = (1, 2, 3, 4)            # what the graders use


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:                 # noqa: BLE001
        return False


def layouts() -> dict:
    """``{world size: workbook.runtime.gpu.Layout}`` for this machine under the suite's request."""
    from workbook.runtime import gpu
    return {n: gpu.machine_plan(n, REQUEST) for n in WORLD_SIZES}


def pytest_report_header(config, start_path):
    if not cuda_available():
        return [f"GPU suite: {NO_CUDA}"]
    from workbook.runtime import gpu
    names = gpu.gpu_names()
    lines = [f"GPU suite: {len(names)} GPU(s): {', '.join(names)}; NCCL "
             f"{gpu.version_text(gpu.nccl_version())}; WORKBOOK_BACKEND={REQUEST}"]
    lines += [f"  {n} rank(s): {layout.summary()} -- {layout.reason}"
              for n, layout in layouts().items()]
    return lines


def pytest_collection_modifyitems(config, items):
    """Without CUDA: skip every test of this folder, with the one reason (other folders' tests,
    collected in the same run, are left alone)."""
    if cuda_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture
def on_gpus(monkeypatch):
    """The suite's environment for launches from this process: ranks on the GPUs, and
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` so that each rank's GPU starts kernels in the order the
    host issued them (an all-reduce issued before a GEMM starts before it, and can hide under
    it). Rank pools copy ``WORKBOOK_*``/``CUDA*``/``NCCL*`` variables when they start."""
    from workbook.runtime.launch import close_shared_pools
    close_shared_pools()                              # pools started under another environment
    monkeypatch.setenv("WORKBOOK_BACKEND", REQUEST)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    yield layouts()
    close_shared_pools()
