#!/usr/bin/env bash
# The owed GPU commands in one run, each under its own time limit, each logged to a file of its own.
#
#   bash tests/gpu/device_check.sh [LOGDIR]        (LOGDIR: $OUT if set, else runs/gpu-check)
#
# For a GPU machine whose python3 already holds a CUDA build of torch and that may have no network
# (a lent cloud GPU, a cluster node): nothing is installed; the package is used in place
# (PYTHONPATH) and the grader's pytest plugin named by PYTEST_PLUGINS, as `pip install -e .` would
# register it. Wheels found in .whl/ (e.g. plotly, which such images often lack) are installed
# into a private folder first. On a machine with network, `python3 -m workbook.bootstrap install`
# and the README's commands do the same.
#
# Logs: env.txt (GPU, driver, torch, NCCL), doctor.txt, gpu_suite.txt (pytest tests/gpu -rs -s),
# bench_all_reduce.txt, bench_domino.txt, and summary.txt (each step's exit code and seconds).
# BUDGET=S caps the whole run (default 3000 s); GRADING_LIMIT=S the grading of every lab;
# LABS="tp_overlap cp_ring" grades only those labs (one after another: gradings run side by side
# load the machine, and the simulated link's calibration then fails correct answers; docs/gpu.md).
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
LOG="${1:-${OUT:-$ROOT/runs/gpu-check}}"
mkdir -p "$LOG"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(not m.entry_points(group='pytest11', name='workbook'))" 2>/dev/null; then
    export PYTEST_PLUGINS=workbook.grading.plugin      # not installed: name the grader's plugin
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/workbook-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/workbook-site"
fi

BUDGET="${BUDGET:-3000}"   # seconds for the whole run: a step gets at most what is left of it
step() {   # step NAME SECONDS COMMAND...: run it, its output to NAME.txt, its exit code to summary
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((BUDGET - SECONDS - 5))
    if [ "$left" -lt 10 ]; then echo "== $name: skipped, the budget is spent" | tee -a "$LOG/summary.txt"; return; fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name: $*" | tee -a "$LOG/summary.txt"
    timeout --kill-after=10 "$limit" "$@" >"$LOG/$name.txt" 2>&1
    local rc=$?
    echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG/summary.txt"
    tail -n 25 "$LOG/$name.txt"
}

step env 60 bash -c "nvidia-smi; nproc; $PY -c 'import torch, sys; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'"
step doctor 90 "$PY" -m workbook.cli doctor
step gpu_backend 180 "$PY" -m pytest -p no:cacheprovider tests/gpu/test_backend.py tests/gpu/test_overlap_kernels.py -rs -s -q
step bench_all_reduce 100 "$PY" -m workbook.cli bench all_reduce --nproc 2 --sizes 1M..1G --backend cuda --no-progress
step bench_domino 120 "$PY" -m workbook.cli bench domino --backend cuda --nproc 2
GRADED=(tests/gpu/test_grading.py)
if [ -n "${LABS:-}" ]; then
    GRADED=(); for lab in $LABS; do GRADED+=("tests/gpu/test_grading.py::test_solutions_score_full_marks_on_the_gpus[$lab]"); done
fi
step gpu_grading "${GRADING_LIMIT:-1800}" "$PY" -m pytest -p no:cacheprovider "${GRADED[@]}" -rs -s -q
cat "$LOG/summary.txt"
