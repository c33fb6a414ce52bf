"""The ``workbook`` command: one entry point for learners, instructors and CI.

    workbook doctor                       what this machine can run (backends, GPUs, link presets)
    workbook demo                         4 CPU ranks, every collective, traced (the README's demo)
    workbook run LAB [LAB ...] --nproc N  run a lab's self-check (labs/ by default)
    workbook grade [--lab LAB] [--impl]   grade labs/ (or solutions/, or a folder) with points
    workbook assign [--check]             make labs/ from solutions/ (or check they agree)
    workbook release --level L -o DIR     the course a class is handed, without its answers
    workbook release --check DIR          scan a release for anything of the answer key
    workbook trace summary|report|merge   read, show and combine profiler traces
    workbook site build [-o DIR]          the course site (README, docs/, lessons) with MkDocs
    workbook bench COLLECTIVE             nccl-tests-style bandwidth table
    workbook bench domino                 Domino vs vanilla TP vs no communication
    workbook bench tp_overlap             SP's comm inside the GEMMs vs plain SP vs Domino
    workbook bench dp_overlap             bucketed DP and ZeRO-1/2/3 vs naive DP vs no communication
    workbook bench pp_overlap             GPipe and 1F1B, blocking and overlapped p2p, vs no communication
    workbook bench cp_ring                ring attention's K/V exchange hidden, contiguous vs zig-zag, S sweep
    workbook bench pp_schedules           1F1B, interleaved, ZB-H1, ZBV vs no communication, beside the formulas
    workbook bench ep_overlap             MoE all-to-all hidden (shared expert, two micro-batches, deferred wgrad), 1 and 2 nodes
    workbook bench capstone               TP x DP and PP x DP steps, overlaps off and on, vs no communication
    workbook plan --model M --seq S ...   predict a TP/CP/PP/DP split's step, TFLOP/s, MFU (--search ranks)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from workbook.grading.labs import LABS, RELEASE_MANIFEST, impl_dir, repo_root   # stdlib only
from workbook.runtime.child_process import course_env
from workbook.runtime.options import OneLineErrors, positive_count, positive_seconds


def cmd_doctor(args) -> int:
    import torch
    import torch.distributed as dist
    from workbook import link
    from workbook.runtime import launch
    print(f"python      {sys.version.split()[0]}")
    print(f"torch       {torch.__version__}")
    print(f"cpu cores   {os.cpu_count()}")
    from workbook.runtime import gpu
    gpus = launch.gpu_count()
    print(f"gloo        {'yes' if dist.is_gloo_available() else 'no'}")
    names = gpu.gpu_names() if gpus else []
    version = gpu.nccl_version() if gpus and dist.is_nccl_available() else None
    for line in gpu.doctor_lines(names, version, os.environ):      # GPUs, NCCL, 2 and 4 ranks
        print(line)
    torch.set_num_threads(launch.threads_per_rank(2))
    flops = link.measure_local_flops()
    print(f"matmul      {flops / 1e9:.1f} GFLOP/s fp32 on {torch.get_num_threads()} thread(s), "
          "as one of 2 ranks computes (calibrates the link)")
    print("link presets (simulated on CPU; bandwidth and latency as a CPU rank sees them):")
    for name in link.PRESETS:
        lk = link.make_link(name, flops)
        print(f"  {name:<12} {lk.bandwidth_Bps / 1e6:9.1f} MB/s  {lk.latency_s * 1e3:7.2f} ms   "
              f"{link.PRESETS[name].description}")
    for line in topology_lines(flops, os.environ):
        print(line)
    cores = os.cpu_count() or 1
    if gpus:
        print(f"ranks       up to {gpus} NCCL ranks here (one per GPU); more: see the lines for "
              f"2 and 4 ranks above")
    else:
        print(f"ranks       up to {max(2, cores)} ranks run at full speed here ({cores} cores, "
              f"{launch.threads_per_rank(max(2, cores))} torch thread(s) each); 4 ranks (what the "
              f"labs check) share cores: correct, only slower")
    print("next        workbook run collectives    self-check the first lab (edit labs/collectives.py)")
    print("            jupyter lab lessons/        the lessons, one per lab")
    print("            workbook grade --lab LAB    points, the way the course grades")
    return 0


def topology_lines(flops: float, env) -> list[str]:
    """``workbook doctor``'s nodes: each preset's node and network (hardware, then as a CPU rank
    sees them), and the nodes this process is part of when torchrun started it."""
    from workbook import link
    lines = ["nodes       with --nnodes N (or torchrun --nnodes N) a preset's ranks form nodes: "
             "NVLink inside, one network card per rank between (simulated on CPU)"]
    for name, p in link.PRESETS.items():
        if p.nic_GBps is None:
            lines.append(f"  {name:<12} flat: every pair of ranks at {p.bandwidth_GBps:g} GB/s, "
                         f"nodes change nothing")
            continue
        lk = link.make_link(name, flops, ranks_per_node=2)
        lines.append(f"  {name:<12} {p.gpus_per_node} GPUs/node at {p.bandwidth_GBps:g} GB/s; "
                     f"network {p.network_GBps:g} GB/s/node = {p.nic_GBps:g} GB/s/GPU, "
                     f"{p.network_latency_us:g} us -> {lk.network_Bps / 1e6:.1f} MB/s, "
                     f"{lk.network_latency_s * 1e3:.2f} ms per rank here")
    if "GROUP_RANK" in env and "LOCAL_WORLD_SIZE" in env and "WORLD_SIZE" in env:
        per_node, world = int(env["LOCAL_WORLD_SIZE"]), int(env["WORLD_SIZE"])
        lines.append(f"this job  node {env['GROUP_RANK']} of {world // max(per_node, 1)}, "
                     f"{per_node} ranks per node, {world} ranks in all (torchrun)")
    return lines


def cmd_run(args) -> int:
    from workbook.selfcheck import EXIT_MEANING, self_check
    labs = list(dict.fromkeys(args.lab))
    unknown = [lab for lab in labs if lab not in LABS]
    if unknown:
        raise ValueError(f"unknown lab {unknown[0]!r}; the labs are {', '.join(LABS)}")
    if args.nnodes is None and args.nproc_per_node is None:
        codes = {}
        for k, lab in enumerate(labs):              # one process: the rank pools stay warm
            if k:
                print()
            traces = args.trace_dir and (str(Path(args.trace_dir) / lab) if len(labs) > 1
                                         else args.trace_dir)         # several: DIR/LAB each
            codes[lab] = self_check(lab, impl=args.impl, nproc=args.nproc, timeout=args.timeout,
                                    link=args.link, trace_dir=traces)
        worst = max(codes.values())                 # 2 (a hang) > 1 (a failure) > 0
        if len(labs) > 1:
            print(f"\n{len(labs)} labs: " + ", ".join(f"{lab} exit {c}" for lab, c in codes.items())
                  + f"; exit {worst} ({EXIT_MEANING[worst]})")
        return worst
    if len(labs) > 1:
        raise ValueError("--nnodes runs one lab as a torchrun job: name one LAB")
    from workbook.runtime import multinode                      # one torchrun agent per node
    nnodes, per_node = multinode.node_split(args.nnodes, args.nproc_per_node, args.nproc)
    lab_file = impl_dir(args.impl) / f"{labs[0]}.py"
    if not lab_file.is_file():
        raise FileNotFoundError(f"no lab file {lab_file}")
    return multinode.run_lab(lab_file, nnodes, per_node, timeout=args.timeout, link=args.link,
                             trace_dir=args.trace_dir)


def cmd_grade(args) -> int:
    if args.max_ranks is not None and args.max_ranks < 1:
        raise ValueError(f"--max-ranks must be at least 1, got {args.max_ranks}")
    for lab in args.lab or []:
        if lab not in LABS:
            raise ValueError(f"unknown lab {lab!r}; the labs are {', '.join(LABS)}")
    if args.class_dir:
        from workbook.instructor.classroom import grade_class
        if args.impl != "labs" or args.gradescope:
            raise ValueError("--class-dir grades each student's folder: leave out --impl and "
                             "--gradescope (the scores go to --csv)")
        grade_class(args.class_dir, args.csv or "scores.csv", args.lab, timeout=args.student_timeout,
                    max_ranks=args.max_ranks, jobs=args.jobs)
        return 0
    if args.csv:
        raise ValueError("--csv is the class table: use it with --class-dir")
    if args.jobs != 1:
        raise ValueError("--jobs grades several students at once: use it with --class-dir")
    # -p no:nbmake: the dev extra's notebook plugin costs 2-3 s of CPU to import (jsonschema
    # compiles a URI grammar) in every grading process, and grading runs no notebook
    cmd = [sys.executable, "-m", "pytest", "-q",
           "--impl", args.impl, "-p", "no:cacheprovider", "-p", "no:nbmake"]
    tests = repo_root() / "tests" / "grading"
    cmd += [str(tests / f"test_{lab}.py") for lab in args.lab] if args.lab else [str(tests)]
    if args.gradescope:
        cmd += ["--gradescope", args.gradescope]
    impl_dir(args.impl)
    env = course_env(repo_root())
    if args.max_ranks is not None:
        env["WORKBOOK_MAX_RANKS"] = str(args.max_ranks)
    # a warm rank keeps the weights it drew (workbook.model.init.full_weight), the same values:
    # the checks build the same small models again and again (28 MB of them a rank)
    env.setdefault("WORKBOOK_WEIGHT_CACHE_MB", "64")
    return subprocess.call(cmd + args.pytest_args, cwd=repo_root(), env=env)


def cmd_assign(args) -> int:
    from workbook.instructor import assign
    root = repo_root()
    if not (root / "solutions").is_dir():          # a student release: never over the learner's
        raise ValueError(f"no solutions/ in {root}: `workbook assign` makes the labs from the "
                         f"solutions, in the course repository")
    labs = Path(args.out).resolve() if args.out else root / "labs"
    if args.out and labs == root.resolve():
        raise ValueError(f"-o {args.out} is the course itself: name a folder for the labs")
    try:
        if args.check:
            drift = assign.check(root / "solutions", labs, args.level)
            for rel in drift:
                print(f"{labs.name}/{rel} differs from what `workbook assign` makes from solutions/")
            if drift:
                print("regenerate with `workbook assign` (labs/ is never edited by hand here)")
                return 1
            print(f"{labs.name}/ matches solutions/")
            return 0
        changed = assign.generate(root / "solutions", labs, args.level or assign.DEFAULT_LEVEL,
                                  force=args.force)
    except assign.AssignError as exc:
        raise ValueError(str(exc)) from None
    print("\n".join(f"wrote {labs.name}/{c}" for c in changed) or f"{labs.name}/ already up to date")
    return 0


def cmd_release(args) -> int:
    from workbook.instructor import release, release_check
    chosen = [flag for flag, value in (("-o", args.out), ("--check", args.check),
                                       ("--update", args.update)) if value]
    if len(chosen) != 1:
        raise ValueError("give one of -o DIR (make a release), --check DIR (scan one) or "
                         "--update DIR (bring one up to date)"
                         + (f", not {' and '.join(chosen)}" if chosen else ""))
    if args.check and args.level:
        raise ValueError("--check reads the release's level from its release.json: leave out "
                         "--level")
    root = repo_root()
    if args.update:
        for line in release.update_release(root, Path(args.update), args.level):
            print(line)
        print(f"{args.update} is up to date with the course; run "
              f"`workbook release --check {args.update}`")
        return 0
    folder = Path(args.check or args.out)
    if args.out:
        level = args.level or "standard"
        files = release.make_release(root, folder, level)
        manifest = json.loads(files[RELEASE_MANIFEST])
        tests = sum(1 for rel in files if rel.startswith("tests/grading/test_"))
        print(f"wrote a {level}-level release to {folder}: {len(files)} files, the labs at "
              f"{level}, {tests} grading test files ({manifest['left_out'][-1]} left out)")
        print(f"left out: {', '.join(manifest['left_out'][:-1])}")
        stand_in = [Path(s["lesson"]).stem for s in manifest["lessons_needing_reference_outputs"]]
        recorded = manifest.get("recorded_lessons") or {}
        if stand_in:
            print(f"lessons that run the reference where a lab is unfinished: {', '.join(stand_in)}"
                  f"; their reference outputs were recorded into lessons/recorded/ "
                  f"({recorded.get('seconds', 0):.0f} s) and are shown, labelled, until the "
                  f"learner's lab runs")
    findings, looked_for = release_check.check_release(root, folder)
    for finding in findings:
        print(f"{folder}/{finding}")
    if findings:
        print(f"{len(findings)} piece(s) of the answer key in {folder}: take them out (or make "
              f"the release again) before handing it out")
        return 1
    print(f"{folder} holds nothing of the answer key: looked for {looked_for}")
    return 0


def cmd_hint(args) -> int:
    from workbook.learner.hints import hint
    print(hint(args.lab, args.task, show_all=args.all, impl=args.impl))
    return 0


def cmd_progress(args) -> int:
    from workbook.learner.progress import progress_lines
    print("\n".join(progress_lines(args.impl)))
    return 0


def cmd_watch(args) -> int:
    from workbook.learner.watch import watch
    extra = ["--timeout", str(args.timeout)] + (["--nproc", str(args.nproc)] if args.nproc else [])
    return watch(args.lab, impl=args.impl, extra=extra)


def cmd_demo(args) -> int:
    from workbook.demo import run_demo
    return run_demo(args.nproc, args.link, args.out)


def cmd_plan(args) -> int:
    from workbook.capstone.plan_cli import run
    return run(args)


def _check_link(name: str | None) -> None:
    """--link: a preset name, else the one-line error every bad input gets."""
    from workbook.link import presets as link                # torch-free: the CLI starts fast
    if name is not None and name not in link.preset_names():
        raise ValueError(f"unknown link preset {name!r}: choose one of "
                         f"{', '.join(link.preset_names())}")


def build_parser() -> argparse.ArgumentParser:
    from workbook.link import presets as link                # torch-free: the CLI starts fast
    from workbook.selfcheck import DEFAULT_TIMEOUT_S         # the grading engine: not for `trace`
    parser = OneLineErrors(prog="workbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="what this machine can run")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("demo", help="4 CPU ranks run every collective, traced")
    p.add_argument("--nproc", type=positive_count, default=4)
    p.add_argument("--link", default="dgx-h100",
                   help=f"simulated link: {', '.join(link.preset_names())}")
    p.add_argument("--out", default="runs/demo", help="run directory for traces and report")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "run", help="self-check a lab: the grader's checks, with its messages",
        description="Run the grader's checks of LAB on your lab file and print a verdict per "
                    "check, then the lab's figures. Exit status: 0 every check passed; 1 a check "
                    "failed or is not implemented yet; 2 a hang (each rank's last collective is "
                    "reported) or a usage error.")
    p.add_argument("lab", nargs="+", metavar="LAB",
                   help=f"{', '.join(LABS)}; several are checked in turn, in one process "
                        f"(the exit status is the worst of theirs)")
    p.add_argument("--nproc", type=positive_count, default=None,
                   help="check on N ranks only (default: every world size the grader uses)")
    p.add_argument("--link", default="none",
                   help=f"simulated link for the figures: {', '.join(link.preset_names())}")
    p.add_argument("--impl", default="labs", help="labs (default), solutions, or a folder")
    p.add_argument("--trace-dir", default=None,
                   help="write the figures' per-rank traces here (several labs: in DIR/LAB)")
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds with no progress on any rank (no collective entered or left, "
                        f"no computing) before a run counts as a hang and each rank's last call "
                        f"is reported (default {DEFAULT_TIMEOUT_S:g}); a run that keeps "
                        f"progressing is stopped only after max(600, 10 x this) s")
    p.add_argument("--nnodes", type=positive_count, default=None, metavar="N",
                   help="run as a torchrun job of N nodes on this machine (one torchrun agent "
                        "each, c10d rendezvous on 127.0.0.1); with --nproc-per-node")
    p.add_argument("--nproc-per-node", type=positive_count, default=None, metavar="P",
                   help="ranks on each node (with --nnodes; --nproc, if given, must be N x P)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("hint", help="the next hint for a task of a lab, one rung at a time",
                       description="Show the next hint rung for TASK (its number in the lab's task "
                                   "list, or its name): 1 the idea and the lesson section, 2 the "
                                   "steps in words, 3 near-code. Without TASK: the next task the "
                                   "last self-check found unfinished. What you opened is shown by "
                                   "`workbook progress`.")
    p.add_argument("lab", help=", ".join(LABS))
    p.add_argument("task", nargs="?", default=None, help="task number or name")
    p.add_argument("--all", action="store_true", help="show every rung of the task")
    p.add_argument("--impl", default="labs", help="labs (default) or a folder of lab files")
    p.set_defaults(func=cmd_hint)

    p = sub.add_parser("progress", help="every lab: last self-check score, next task, hints")
    p.add_argument("--impl", default="labs", help="labs (default) or a folder of lab files")
    p.set_defaults(func=cmd_progress)

    p = sub.add_parser("watch", help="self-check a lab again on every save (Ctrl-C leaves)")
    p.add_argument("lab", help=", ".join(LABS))
    p.add_argument("--impl", default="labs", help="labs (default) or a folder of lab files")
    p.add_argument("--nproc", type=positive_count, default=None, help="check on N ranks only")
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds with no progress on any rank before a run counts as a hang "
                        f"(default {DEFAULT_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("grade", help="grade the labs with points",
                       description="Grade with points: one line per test, each failure once with "
                                   "its full message (-- -v for pytest's details). Exit status 0 "
                                   "when every test passes, 1 otherwise. With --class-dir: grade "
                                   "every student's folder, one CSV row each (exit status 0 once "
                                   "the CSV is written).")
    p.add_argument("--impl", default="labs", help="labs (default), solutions, or a folder")
    p.add_argument("--lab", action="append", default=None,
                   help=f"{', '.join(LABS)} (repeat for several; default: all)")
    p.add_argument("--gradescope", default=None, metavar="PATH", help="write results.json here")
    p.add_argument("--max-ranks", type=positive_count, default=None, metavar="N",
                   help="grade on at most N ranks (processes): world sizes above N are left "
                        "out, a check needing more runs on its smallest size (default: "
                        "$WORKBOOK_MAX_RANKS, else no cap)")
    p.add_argument("--class-dir", default=None, metavar="DIR",
                   help="grade a class: DIR holds one folder of lab files per student")
    p.add_argument("--csv", default=None, metavar="PATH",
                   help="with --class-dir: the scores table (default scores.csv)")
    p.add_argument("--student-timeout", type=positive_seconds, default=600.0, metavar="S",
                   help="with --class-dir: seconds one student's grading may take (default 600)")
    p.add_argument("--jobs", type=positive_count, default=1, metavar="N",
                   help="with --class-dir: grade N students at once (default 1)")
    p.add_argument("--strict", action="store_true",
                   help="(the default now: exit 1 unless every test passes; kept for old scripts)")
    p.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("site", help="build the course site (README, docs/, lessons) with MkDocs",
                       add_help=False)
    p.add_argument("site_args", nargs=argparse.REMAINDER, help="build [-o DIR] [--executed DIR]")
    p.set_defaults(func=lambda a: _site_main(a.site_args))

    p = sub.add_parser("assign", help="generate labs/ from solutions/, at a level",
                       description="Write the labs from solutions/. --level picks how much of each "
                                   "task is given: guided (the idea and a near-code TODO per "
                                   "task), standard (the spec; hints on request with `workbook "
                                   "hint`), challenge (whole components from their spec). A lab "
                                   "you edited is never overwritten by a level switch without "
                                   "--force.")
    p.add_argument("--check", action="store_true", help="fail if labs/ drifted from solutions/")
    p.add_argument("--level", choices=("guided", "standard", "challenge"), default=None,
                   help="guided, standard (the default) or challenge")
    p.add_argument("--force", action="store_true",
                   help="switch level even over lab files you edited (they are lost)")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="write the labs into DIR instead of labs/")
    p.set_defaults(func=cmd_assign)

    p = sub.add_parser("release", help="the course a class is handed, without its answers",
                       description="Write a student release of the course into DIR (new or empty, "
                                   "outside the course): the package, the lessons, the labs at "
                                   "--level, the public grading tests, the README and the "
                                   "learner's docs; no solutions/, no wrong labs, no hidden "
                                   "tests, no git history. It is checked once written. --check "
                                   "DIR scans a release for anything of the answer key (exit 1 "
                                   "naming each file and line); --update DIR brings one up to "
                                   "date without overwriting a file edited since.")
    p.add_argument("-o", "--out", default=None, metavar="DIR", help="make a release in DIR")
    p.add_argument("--check", default=None, metavar="DIR", help="scan the release in DIR")
    p.add_argument("--update", default=None, metavar="DIR",
                   help="bring the release in DIR up to date (edited files are kept; the "
                        "course's version goes beside each as NAME.new)")
    p.add_argument("--level", choices=("guided", "standard", "challenge"), default=None,
                   help="the labs' level: guided, standard (the default) or challenge")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("plan", help="predict step time, TFLOP/s and MFU of a TP/CP/PP/DP split",
                       description="Predict one training step of a model on a cluster from the "
                                   "course's formulas (docs/plan-llama3.md); --search ranks every "
                                   "split that fits in memory. Exit status 0 it fits, 1 it does "
                                   "not, 2 a usage error or a broken rule.")
    from workbook.capstone.plan_cli import add_arguments as add_plan_arguments
    add_plan_arguments(p)
    p.set_defaults(func=cmd_plan)

    for extra in ("workbook.trace.cli", "workbook.communication.bandwidth_bench", "workbook.instructor.autograder"):
        try:
            __import__(extra, fromlist=["register"]).register(sub)
        except ImportError as exc:
            if exc.name not in (extra, extra.rsplit(".", 1)[0]):
                raise
    return parser


# the model benchmarks, each with its own options: workbook bench LAB [options]
MODEL_BENCHES = {
    "domino": ("domino", "Domino vs vanilla TP vs the no-communication optimum."),
    "tp_overlap": ("tp_overlap", "SP's all-gather/reduce-scatter inside the GEMMs vs plain "
                   "SP, Domino and the no-communication optimum."),
    "dp_overlap": ("dp_overlap", "bucketed DP and ZeRO-1/2/3 with their traffic hidden vs "
                   "naive DP and the no-communication optimum, beside the overlap arithmetic's "
                   "predictions."),
    "pp_overlap": ("pp_overlap", "GPipe and 1F1B with blocking and overlapped p2p vs the "
                   "no-communication step, beside the textbook bubble and "
                   "workbook.pipeline_parallel.simulate."),
    "cp_ring": ("cp_ring", "ring attention's K/V exchange hidden behind each ring step's "
                "attention, contiguous vs zig-zag split, over a sweep of sequence lengths."),
    "pp_schedules": ("pp_schedules", "1F1B, interleaved 1F1B (v = 2, 4), ZB-H1 and ZBV vs the "
                     "no-communication step, each bubble beside its formula and "
                     "simulate_chunked with the measured costs."),
    "ep_overlap": ("ep_overlap", "an MoE layer's all-to-all hidden behind the shared expert, a "
                   "second micro-batch and deferred weight gradients vs no overlap and the "
                   "no-communication step, on one node and across two."),
    "capstone": ("capstone", "the capstone's TP x DP and PP x DP training steps on a 2 x 2 "
                 "mesh with their overlaps off and on vs the no-communication optimum."),
}


def model_bench_parser(name: str) -> argparse.ArgumentParser:
    """``workbook bench NAME``: the parser of one model benchmark (``MODEL_BENCHES``), its options
    from its module's ``add_arguments``, run by its ``run_bench``."""
    import importlib
    from workbook.grading.labs import lab_module
    lab, description = MODEL_BENCHES[name]
    module = importlib.import_module(lab_module(lab, "bench"))
    parser = argparse.ArgumentParser(prog=f"workbook bench {name}",
                                     description=f"workbook bench {name}: {description}")
    module.add_arguments(parser)
    parser.set_defaults(func=lambda a: module.run_bench(a) and 0, command=f"bench {name}")
    return parser


BENCH_PARSERS = {name: (lambda name=name: model_bench_parser(name)) for name in MODEL_BENCHES}


def _site_main(argv) -> int:
    from workbook.site import main as site_main
    return site_main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["trace"]:         # reading traces needs no torch, no pytest, no grader
        from workbook.trace.cli import main as trace_main
        return trace_main(argv, prog="workbook")
    if argv[:1] == ["site"]:          # its own parser (MkDocs options), like trace
        return _site_main(argv[1:])
    from workbook.runtime.launch import RanksTimedOut
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in BENCH_PARSERS:
        args = BENCH_PARSERS[argv[1]]().parse_args(argv[2:])
    else:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:              # a usage error, said in one line: exit status 2
            if exc.code != 2:                  # (--help leaves as argparse has it leave)
                raise
            return 2
    try:
        _check_link(getattr(args, "link", None))
        if getattr(args, "impl", None) == "solutions":   # in a student release: one line,
            impl_dir("solutions")                         # before any rank starts
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, RanksTimedOut) as exc:
        print(f"workbook {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        _stop_ranks()


def _stop_ranks() -> None:
    """Nothing this command started outlives it: the rank pools and the fork server are
    stopped and waited for before ``workbook`` returns (where it started any)."""
    pool = sys.modules.get("workbook.runtime.pool")
    if pool is not None:
        pool.stop_fork_server()


if __name__ == "__main__":
    sys.exit(main())
