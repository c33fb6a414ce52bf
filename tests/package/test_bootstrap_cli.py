"""The one-command set-up's console output, and ``workbook bench --help``.

* ``python3 -m workbook.bootstrap test`` ends with one overall line (all stages passed, or which
  failed), says up front that the stub-grading stage expects every test to fail, and keeps its
  exit code (1 on any failure, 0 when all pass);
* pip's output is captured: shown only when pip fails;
* ``workbook bench --help`` lists ``domino`` (routed by ``workbook.cli.main`` to its own parser)
  beside the collectives, without breaking ``workbook bench domino --help``.
"""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbook import bootstrap
from workbook.communication import bandwidth_bench as bench

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "[workbook setup] "


# --------------------------------------------------------------------------- run_tests
def _run(monkeypatch, capsys, failing=()):
    """run_tests with every stage's command faked: the stages titled in ``failing`` exit 1."""
    titles = [title for title, _, _ in bootstrap.stages()]
    by_cmd = {tuple(map(str, cmd)): title for title, _, cmd in bootstrap.stages()}
    ran = []

    def fake_sh(*cmd, check=True, quiet=False, **kw):
        title = by_cmd[tuple(map(str, cmd))]
        ran.append(title)
        return 1 if title in failing else 0

    monkeypatch.setattr(bootstrap, "sh", fake_sh)
    code = bootstrap.run_tests()
    lines = capsys.readouterr().out.splitlines()
    assert sorted(ran) == sorted(titles), "every stage runs, even after a failure"
    headers = [next(i for i, line in enumerate(lines) if line.startswith(f"{PREFIX}--- {t}"))
               for t in titles]
    assert headers == sorted(headers), "each stage's output is shown in stage order"
    return code, lines, titles


def test_all_pass_ends_with_one_line(monkeypatch, capsys):
    code, lines, titles = _run(monkeypatch, capsys)
    assert code == 0
    assert lines[-1] == f"{PREFIX}all {len(titles)} stages passed"
    assert not any("FAILED" in line or "failed:" in line for line in lines)


def test_one_failure_names_it_last(monkeypatch, capsys):
    code, lines, titles = _run(monkeypatch, capsys, failing={"package tests"})
    assert code == 1
    assert lines[-1] == f'{PREFIX}FAILED: stage "package tests"'
    assert sum("FAILED: stage" in line for line in lines) == 1, "one overall line, not one per stage"


def test_several_failures_first_then_the_rest(monkeypatch, capsys):
    titles = [title for title, _, _ in bootstrap.stages()]
    code, lines, _ = _run(monkeypatch, capsys, failing={titles[0], titles[-1]})
    assert code == 1
    assert lines[-1] == f'{PREFIX}FAILED: stage "{titles[0]}" (and "{titles[-1]}")'


def test_stub_stage_says_failures_are_expected(monkeypatch, capsys):
    _, lines, _ = _run(monkeypatch, capsys)
    first = next(i for i, line in enumerate(lines) if "generated stubs" in line)
    assert "expected to fail" in lines[first] and "not implemented yet" in lines[first]
    assert "passes when they all do" in lines[first]
    # its result line repeats it, right after pytest's "N failed" closing line would be
    done = [line for line in lines[first + 1:] if "generated stubs" in line]
    assert done and "ok" in done[0] and "as expected" in done[0]


def test_stub_stage_failing_still_fails_the_run(monkeypatch, capsys):
    code, lines, _ = _run(monkeypatch, capsys, failing={bootstrap.STUB_TITLE})
    assert code == 1
    assert lines[-1] == f'{PREFIX}FAILED: stage "{bootstrap.STUB_TITLE}"'


def test_summary_formats():
    assert bootstrap.summary(["a", "b"], []) == "all 2 stages passed"
    assert bootstrap.summary(["a", "b", "c"], ["b"]) == 'FAILED: stage "b"'
    assert bootstrap.summary(["a", "b", "c"], ["a", "b", "c"]) == 'FAILED: stage "a" (and "b", "c")'


# --------------------------------------------------------------------------- quiet pip
NOISE = "WARNING: Location 'file:///opt/pypi/simple' is ignored: it is either a non-existing path\n"


def _fake_pip(monkeypatch, returncode):
    calls = []

    def fake_run(cmd, **kw):
        calls.append((cmd, kw))
        assert kw.get("stdout") == subprocess.PIPE and kw.get("stderr") == subprocess.STDOUT
        return SimpleNamespace(returncode=returncode, stdout=NOISE * 5)

    monkeypatch.setattr(bootstrap.subprocess, "run", fake_run)
    return calls


def test_pip_is_silent_when_it_succeeds(monkeypatch, capfd):
    calls = _fake_pip(monkeypatch, 0)
    assert bootstrap.pip("install", "-q", "x")[0] == 0
    out, err = capfd.readouterr()
    assert out == err == ""
    assert calls[0][0][1:3] == ["-m", "pip"]


def test_pip_shows_its_output_when_it_fails(monkeypatch, capfd):
    _fake_pip(monkeypatch, 1)
    with pytest.raises(SystemExit, match=r"failed \(1\)"):
        bootstrap.pip("install", "-q", "x")
    assert "is ignored" in capfd.readouterr().err


def test_package_step_is_one_line_and_idempotent(monkeypatch, capfd, tmp_path):
    _fake_pip(monkeypatch, 0)
    monkeypatch.setattr(bootstrap, "STAMP", tmp_path / "stamp")
    bootstrap.ensure_package()
    out, err = capfd.readouterr()
    assert out.splitlines() == [f"{PREFIX}installing the workbook and its extras"] and err == ""
    calls = _fake_pip(monkeypatch, 0)
    bootstrap.ensure_package()                      # pyproject.toml unchanged: nothing to do
    assert calls == [] and capfd.readouterr() == ("", "")


def test_extras_go_in_by_uv_and_by_pip_where_uv_fails(monkeypatch, capfd, tmp_path):
    """uv installs the extras (the install's longest step, a third of pip's time), with pip's
    configuration as its flags; where uv cannot be had or fails, one line says so and pip
    installs them as before."""
    monkeypatch.setattr(bootstrap, "STAMP", tmp_path / "stamp")
    calls = _fake_pip(monkeypatch, 0)
    bootstrap.ensure_package()
    assert [c[0][1:4] for c in calls] == [["-m", "pip", "install"], ["-m", "pip", "config"],
                                          ["-m", "uv", "pip"]]
    assert calls[-1][0][-2:] == ["-e", f"{bootstrap.ROOT}[dev,notebooks]"]
    capfd.readouterr()
    (tmp_path / "stamp").unlink()
    calls = _fake_pip(monkeypatch, 1)               # no uv here: pip, whose failure stops set-up
    with pytest.raises(SystemExit, match=r"failed \(1\)"):
        bootstrap.ensure_package()
    assert [c[0][1:3] for c in calls] == [["-m", "pip"], ["-m", "pip"]]
    assert calls[1][0][-2:] == ["-e", f"{bootstrap.ROOT}[dev,notebooks]"]
    out = capfd.readouterr().out
    assert f"{PREFIX}uv could not install the extras (" in out and "pip will" in out, out


PIP_CONFIG = """global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://global.example/simple'
user.index-url='https://user.example/simple'
:env:.find-links='/opt/wheels /srv/more-wheels'
:env:.default-timeout='180'
"""


def test_pip_config_becomes_uv_flags(monkeypatch):
    """uv reads no pip configuration: the wheel folder that holds this machine's CPU torch, the
    extra indexes and the constraints must reach it as flags, each option from the scope pip
    itself would take (environment over user over global), and pip's best-match rule."""
    monkeypatch.setattr(bootstrap.subprocess, "run",
                        lambda cmd, **kw: SimpleNamespace(returncode=0, stdout=PIP_CONFIG))
    flags = bootstrap.uv_flags_from_pip_config()
    pairs = list(zip(flags[::2], flags[1::2]))
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")
    assert sorted(pairs[1:]) == sorted([
        ("--constraint", "/etc/xdg/pip/constraints.txt"),
        ("--extra-index-url", "file:///opt/pypi/simple"),
        ("--extra-index-url", "file:///opt/pypi-more/simple"),
        ("--find-links", "/opt/wheels"), ("--find-links", "/srv/more-wheels"),
        ("--index-url", "https://user.example/simple")])
    monkeypatch.setattr(bootstrap.subprocess, "run",          # pip config fails: no flags
                        lambda cmd, **kw: SimpleNamespace(returncode=1, stdout=NOISE))
    assert bootstrap.uv_flags_from_pip_config() == ["--index-strategy", "unsafe-best-match"]


def test_cpu_torch_by_uv_then_pip_quiet_unless_all_fail(monkeypatch, capfd):
    monkeypatch.setattr(bootstrap, "sh", lambda *a, **k: 1)          # "import torch" fails
    monkeypatch.setattr(bootstrap, "has_nvidia_gpu", lambda: False)

    def runs(*codes):
        calls, it = [], iter(codes)

        def fake_run(cmd, **kw):
            calls.append(cmd)
            return SimpleNamespace(returncode=next(it), stdout=NOISE)
        monkeypatch.setattr(bootstrap.subprocess, "run", fake_run)
        return calls

    calls = runs(0, 0, 0)                                # uv installed, pip config, uv: done
    bootstrap.ensure_torch()
    assert calls[-1][1:4] == ["-m", "uv", "pip"] and calls[-1][-1] == bootstrap.CPU_TORCH
    out, err = capfd.readouterr()
    assert len(out.splitlines()) == 1 and "installing torch" in out and err == ""

    calls = runs(1, 1, 0)                  # no uv; the on-disk build missing; the CPU index
    bootstrap.ensure_torch()
    assert calls[-1][-2:] == ["--index-url", bootstrap.CPU_INDEX]
    out, err = capfd.readouterr()
    assert len(out.splitlines()) == 1 and "installing torch" in out and err == ""

    runs(1, 1, 1)
    with pytest.raises(SystemExit, match="could not install torch"):
        bootstrap.ensure_torch()
    assert "is ignored" in capfd.readouterr().err


# --------------------------------------------------------------------------- bench --help
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbook.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_bench_help_lists_domino():
    proc = _cli("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "domino" in proc.stdout
    described = [line for line in proc.stdout.splitlines() if line.strip().startswith("domino ")]
    assert described and "Domino vs vanilla TP" in described[0]
    for collective in bench.COLLECTIVES:
        assert collective in proc.stdout


def test_bench_positional_choices_include_domino():
    import argparse
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command"))
    bench_parser = parser._subparsers._group_actions[0].choices["bench"]
    positional = next(a for a in bench_parser._actions if a.dest == "collective")
    assert "domino" in positional.choices and "domino" in positional.help
    assert set(bench.COLLECTIVES) <= set(positional.choices)
    args = parser.parse_args(["bench", "all_reduce", "--nproc", "2", "--sizes", "1K"])
    assert (args.collective, args.nproc, args.sizes) == ("all_reduce", 2, "1K")


def test_bench_domino_help_still_routed_to_its_own_parser():
    proc = _cli("bench", "domino", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "workbook bench domino" in proc.stdout and "--lookahead" in proc.stdout


def test_domino_after_an_option_says_how_to_run_it():
    proc = _cli("bench", "--nproc", "2", "domino")
    assert proc.returncode == 2
    assert "workbook bench domino --help" in proc.stderr


def test_test_workers_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("WORKBOOK_TEST_WORKERS", raising=False)
    assert bootstrap.test_workers() == 2
    package = next(cmd for title, _, cmd in bootstrap.stages() if title == bootstrap.PACKAGE_TITLE)
    assert ["-n", "2"] == package[package.index("-n"):package.index("-n") + 2]
    monkeypatch.setenv("WORKBOOK_TEST_WORKERS", "1")
    package = next(cmd for title, _, cmd in bootstrap.stages() if title == bootstrap.PACKAGE_TITLE)
    assert "-n" not in package
    monkeypatch.setenv("WORKBOOK_TEST_WORKERS", "two")
    with pytest.raises(SystemExit, match="WORKBOOK_TEST_WORKERS='two': give a whole number"):
        bootstrap.stages()

