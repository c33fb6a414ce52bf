"""Ranks on GPUs: which backend, which GPU each rank uses, and why -- one pure decision.

The facts the decision rests on (each one decides a branch of ``plan``):

* NCCL, the GPUs' collective library, wants **one GPU per rank**: two ranks on one GPU stop
  with "Duplicate GPU detected". NCCL 2.30 added an experimental switch,
  ``NCCL_MULTI_RANK_GPU_ENABLE=1``, that lets several ranks share a GPU. PyTorch loads the NCCL
  it was built with (the ``nvidia-nccl-cu12``/``-cu13`` wheel it depends on) unless told
  otherwise, so the version that counts is the one torch reports: ``torch.cuda.nccl.version()``.
* gloo, the CPU library, also takes **CUDA tensors** for some collectives (it copies them
  through host memory): several ranks' tensors can share one GPU with any NCCL, at the price of
  the copies, and not every operation is there.
* the simulated link (``workbook.link``) wraps gloo on **CPU** tensors: with it, ranks run on CPU.

What a learner (or ``$WORKBOOK_BACKEND``) may ask for, and what each request becomes:

=============  ============================================================================
request        layout
=============  ============================================================================
(nothing)      NCCL when every rank gets its own GPU (or the learner already set
               ``NCCL_MULTI_RANK_GPU_ENABLE=1`` on NCCL 2.30+), else CPU ranks over gloo:
               the path every check of the course is proven on
``gloo``       CPU ranks over gloo (the simulated link is available)
``nccl``       NCCL, one GPU per rank; fewer GPUs than ranks only on NCCL 2.30+ (the switch
               is then set for the ranks), else an error that says what to do
``gloo-cuda``  gloo with each rank's tensors on a GPU (``cuda:rank % gpus``)
``cuda``       "on the GPUs, whatever works here": ``nccl`` where it can, else ``gloo-cuda``
=============  ============================================================================

``plan`` takes the machine as arguments (GPU count, NCCL version, environment), so every branch is
tested on a CPU machine; ``machine_plan`` asks torch for them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

REQUESTS = ("gloo", "nccl", "gloo-cuda", "cuda")
ENV_BACKEND = "WORKBOOK_BACKEND"                 # a default request for every launch in this shell
MULTI_RANK_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"    # NCCL 2.30+: several ranks on one GPU
MULTI_RANK_NCCL = (2, 30, 0)


@dataclass(frozen=True)
class Layout:
    """Where ``world_size`` ranks run: ``backend`` (gloo, nccl or gloo-cuda), the GPUs they share,
    the environment each rank sets before its process group starts, and the reason in words."""
    backend: str
    world_size: int
    gpus: int
    reason: str
    env: dict = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.backend != "gloo"

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks one GPU holds (0 for CPU ranks)."""
        return -(-self.world_size // self.gpus) if self.on_gpu else 0

    def device(self, local_rank: int) -> str:
        """The torch device of a rank: ``cpu``, or ``cuda:local_rank % gpus``."""
        return f"cuda:{local_rank % self.gpus}" if self.on_gpu else "cpu"

    def summary(self) -> str:
        """One line: ``nccl, one GPU per rank (cuda:0..cuda:3)``, ``gloo on CPU ranks``..."""
        if not self.on_gpu:
            return "gloo on CPU ranks"
        used = min(self.world_size, self.gpus)
        gpus = "cuda:0" if used == 1 else f"cuda:0..cuda:{used - 1}"
        if self.ranks_per_gpu == 1:
            return f"{self.backend}, one GPU per rank ({gpus})"
        share = f"up to {self.ranks_per_gpu} ranks per GPU on {gpus}"
        if self.backend == "nccl":
            return f"nccl, {share} ({MULTI_RANK_ENV}=1, experimental)"
        return f"gloo-cuda (gloo, tensors on the GPU), {share}"


def add_backend_argument(parser) -> None:
    """The ``--backend`` option every command that starts ranks takes (one wording, one list)."""
    parser.add_argument("--backend", choices=list(REQUESTS), default=None,
                        help="gloo (CPU), nccl, gloo-cuda, or cuda (the GPUs, whatever works); "
                             f"default: ${ENV_BACKEND}, else what works here (workbook doctor)")


def version_text(version) -> str:
    return ".".join(map(str, version)) if version else "none"


def multi_rank_nccl(version, env) -> bool:
    """Does this NCCL let several ranks share a GPU (2.30+, and the learner did not turn it off)?"""
    return bool(version) and tuple(version) >= MULTI_RANK_NCCL and env.get(MULTI_RANK_ENV) != "0"


def plan(world_size: int, gpus: int, nccl_version=None, env=None, backend: str | None = None,
         simulated_link: bool = False) -> Layout:
    """The layout of ``world_size`` ranks on a machine with ``gpus`` GPUs and ``nccl_version``
    (a tuple such as ``(2, 21, 5)``, or None without NCCL); ``env`` is the environment
    (``$WORKBOOK_BACKEND`` when ``backend`` is None and no simulated link is asked for,
    ``$NCCL_MULTI_RANK_GPU_ENABLE``).
    Raises ``ValueError`` with what to do instead when the request cannot be met here."""
    env = os.environ if env is None else env
    if world_size < 1:
        raise ValueError(f"--nproc must be at least 1 (got {world_size})")
    if backend is None and not simulated_link:        # an explicit --link outranks the default
        backend = env.get(ENV_BACKEND) or None
    if backend not in (None, *REQUESTS):
        raise ValueError(f"unknown backend {backend!r}: use gloo (CPU), nccl (one GPU per rank), "
                         f"gloo-cuda (gloo, tensors on the GPU) or cuda (the GPUs, whatever works)")
    if simulated_link and backend not in (None, "gloo"):
        raise ValueError("the simulated link runs on gloo (CPU); on GPUs the real interconnect "
                         "is measured: drop --link or use --backend gloo")
    n, ver = world_size, version_text(nccl_version)

    def cpu(reason):
        return Layout("gloo", n, gpus, reason)

    def nccl(reason):
        shared = n > gpus
        return Layout("nccl", n, gpus, reason, {MULTI_RANK_ENV: "1"} if shared else {})

    if backend == "gloo":
        return cpu("asked for gloo: CPU ranks")
    if backend is None:
        if simulated_link:
            return cpu("the simulated link runs on CPU ranks over gloo")
        if gpus == 0:
            return cpu("no GPU: CPU ranks over gloo")
        if gpus >= n:
            return nccl(f"{_gpus(gpus)} for {n} rank(s): one GPU per rank")
        if multi_rank_nccl(nccl_version, env) and env.get(MULTI_RANK_ENV) == "1":
            return nccl(f"{n} ranks on {_gpus(gpus)}: NCCL {ver}, {MULTI_RANK_ENV}=1 in the "
                        f"environment")
        return cpu(f"{n} ranks on {_gpus(gpus)}: NCCL wants one GPU per rank, so the ranks run on "
                   f"CPU over gloo, the path every check is proven on; {ENV_BACKEND}=cuda puts "
                   f"them on the GPU ({_cuda_choice(nccl_version, env)} here)")
    if gpus == 0:
        if backend == "nccl":
            raise ValueError(f"backend nccl needs one GPU per rank: {n} rank(s) but no GPU "
                             f"visible (no CUDA device); use --backend gloo")
        raise ValueError(f"backend {backend} puts the ranks on GPUs, and no GPU is visible (no "
                         f"CUDA device); use --backend gloo (CPU ranks)")
    if gpus >= n and backend in ("nccl", "cuda"):
        return nccl(f"{_gpus(gpus)} for {n} rank(s): one GPU per rank")
    if backend in ("nccl", "cuda") and multi_rank_nccl(nccl_version, env):
        return nccl(f"{n} ranks on {_gpus(gpus)}: NCCL {ver} lets ranks share a GPU "
                    f"({MULTI_RANK_ENV}=1, experimental)")
    if backend == "nccl":
        raise ValueError(
            f"backend nccl needs one GPU per rank: {n} ranks but {_gpus(gpus)} visible, and NCCL "
            f"{ver} refuses two ranks on one GPU (\"Duplicate GPU detected\"); NCCL 2.30+ lets "
            f"them share ({MULTI_RANK_ENV}=1; pip install -U nvidia-nccl-cu12, or -cu13 to match "
            f"torch's CUDA), or use --backend "
            f"gloo-cuda (gloo, tensors on the GPU), gloo (CPU ranks) or fewer ranks")
    why = "asked for gloo-cuda" if backend == "gloo-cuda" else \
        f"NCCL {ver} cannot put {n} ranks on {_gpus(gpus)} (2.30+ can)"
    return Layout("gloo-cuda", n, gpus, f"{why}: gloo with the tensors on the GPU(s), copied "
                                        f"through host memory for each collective")


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _cuda_choice(nccl_version, env) -> str:
    return "nccl, ranks sharing the GPU" if multi_rank_nccl(nccl_version, env) else "gloo-cuda"


# --------------------------------------------------------------------------- this machine
def nccl_version() -> tuple | None:
    """The NCCL torch has loaded, as ``(major, minor, patch)``; None without CUDA or NCCL."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        v = torch.cuda.nccl.version()
    except Exception:                           # noqa: BLE001 - a CPU build has no NCCL
        return None
    if isinstance(v, int):                      # old torch: NCCL_VERSION_CODE
        major = v // 10000 if v >= 10000 else v // 1000
        minor = (v % 10000) // 100 if v >= 10000 else (v % 1000) // 100
        return (major, minor, v % 100)
    return tuple(v)


def gpu_names() -> list[str]:
    """The name of every visible GPU (``[]`` without CUDA)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:                           # noqa: BLE001
        return []


def machine_plan(world_size: int, backend: str | None = None,
                 simulated_link: bool = False) -> Layout:
    """``plan`` for this machine: its GPUs, the NCCL torch loaded, this process's environment."""
    gpus = gpu_count()
    return plan(world_size, gpus, nccl_version() if gpus else None, os.environ, backend,
                simulated_link)


def doctor_lines(names: list[str], nccl_version, env, sizes=(2, 4)) -> list[str]:
    """What ``workbook doctor`` says about GPUs: the models, the NCCL version, and the layout
    of 2 and 4 ranks by default (and with ``WORKBOOK_BACKEND=cuda`` where that differs)."""
    gpus = len(names)
    if gpus:
        models = sorted(set(names))
        counted = ", ".join(f"{m} x{names.count(m)}" if names.count(m) > 1 else m for m in models)
        shared = "yes (2.30+, experimental)" if multi_rank_nccl(nccl_version, env) else \
            "no (needs NCCL 2.30+)"
        lines = [f"gpus        {gpus} ({counted})",
                 f"nccl        {version_text(nccl_version)} (the NCCL torch loaded); several "
                 f"ranks per GPU: {shared}"]
    else:
        lines = ["gpus        0 (none)", "nccl        no (needs a GPU)"]
    for n in sizes:
        try:
            layout = plan(n, gpus, nccl_version, env)
        except ValueError as exc:               # an impossible $WORKBOOK_BACKEND: say so
            lines.append(f"{n} ranks     will not start ({ENV_BACKEND}={env.get(ENV_BACKEND)}): {exc}")
            continue
        why = "" if layout.on_gpu else " (no GPU)" if not gpus else \
            " (more ranks than GPUs, and NCCL wants one GPU per rank: the proven path)"
        lines.append(f"{n} ranks     {layout.summary()}{why}")
        if gpus and not layout.on_gpu:
            gpu = plan(n, gpus, nccl_version, env, backend="cuda")
            lines.append(f"            {ENV_BACKEND}=cuda: {gpu.summary()}")
    if gpus:
        lines.append(f"gpu tests   pytest tests/gpu -rs   (every lab graded on the GPU(s), "
                     f"{ENV_BACKEND}=cuda; overlap read from NCCL and compute kernels)")
    return lines

def gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0
