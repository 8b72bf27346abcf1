"""`auditor compare` with generic sides: real child processes (small Python scripts), exact
peaks, result agreement, verdicts, exit statuses, alternation, re-rendering, bad input."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import one_error_line

from auditor.cli import main
from auditor.comparison import Comparison, Side, Tolerance, run_comparison
from auditor.renderers import comparison_markdown
from auditor.report_models.comparison import comparison_report

MiB = 1 << 20

# One configurable child: allocates EXTRA MiB (touched) once "loaded", reports through the
# AUDITOR_RESULT protocol by hand (as a program in any language would), optionally logs its name.
CHILD = '''
import argparse, json, os
import numpy as np
import psutil

parser = argparse.ArgumentParser()
parser.add_argument("--extra", type=int, default=0)
parser.add_argument("--digest")
parser.add_argument("--tensors", choices=["reference", "changed"])
parser.add_argument("--log")
parser.add_argument("--name", default="?")
args = parser.parse_args()
if args.log:
    with open(args.log, "a") as log:
        log.write(args.name + "\\n")
report = {"loaded_rss": psutil.Process().memory_info().rss}
held = np.ones(args.extra * 2**20 // 8) if args.extra else None
if args.digest:
    report["result_digest"] = args.digest
if args.tensors:
    from safetensors.numpy import save_file
    a, b = np.zeros(1000, dtype=np.uint8), np.ones((10, 10), dtype=np.float32)
    if args.tensors == "changed":  # 7 + 3 = 10 differing elements
        a[[1, 5, 9, 100, 200, 300, 999]] = 1
        b[0, :3] = 2.0
    path = os.path.join(os.path.dirname(os.environ["AUDITOR_RESULT"]), "result.safetensors")
    save_file({"a": a, "b": b}, path)
    report["result_file"] = path
if os.environ.get("AUDITOR_RESULT"):
    with open(os.environ["AUDITOR_RESULT"], "w") as file:
        json.dump(report, file)
'''


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "child.py").write_text(CHILD)
    return tmp_path


def cmd(*args: str) -> str:
    return " ".join([sys.executable, "child.py", *args])


def record_of(path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())




def test_measures_a_200_mib_difference_and_agrees(workdir, capsys):
    out = workdir / "reports" / "big-vs-small.md"
    out.parent.mkdir()
    status = main(["compare", "--baseline-cmd", "big", cmd("--extra", "200", "--digest", "d1"),
                   "--variant-cmd", "small", cmd("--digest", "d1"), "--repeats", "2", "-o", str(out)])
    assert status == 0, capsys.readouterr().err
    record = record_of(out)
    summary = Comparison(record).summary
    big, small = summary["sides"]["big"], summary["sides"]["small"]
    saving = big["peak_rss"]["median"] - small["peak_rss"]["median"]
    assert abs(saving - 200 * MiB) < 0.03 * 200 * MiB, saving / MiB
    assert abs(big["overhead"]["median"] - 200 * MiB) < 0.03 * 200 * MiB, big["overhead"]
    assert abs(small["overhead"]["median"]) < 5 * MiB  # loaded then nothing more
    assert small["peak_rss"]["median"] < 80 * MiB  # python + numpy, not the test runner's size
    variant = summary["variants"][0]
    assert variant["claims_saving"] and variant["verdict"] == "ok"
    assert variant["noise"]["status"] == "saves" and variant["noise"]["margin"] == 16 * MiB  # the floor
    assert variant["noise"]["measured"] < 5 * MiB  # two runs a side: their spread is measured
    assert variant["agreement"]["status"] == "identical" and variant["agreement"]["same_digest"]
    assert variant["peak_ratio"] == pytest.approx(small["peak_rss"]["median"] / big["peak_rss"]["median"])
    assert variant["wall_ratio"] == pytest.approx(small["wall_s"]["median"] / big["wall_s"]["median"])
    assert variant["cpu_ratio"] == pytest.approx(small["cpu_s"]["median"] / big["cpu_s"]["median"])
    markdown = out.read_text()
    assert "**Verdict: pass.**" in markdown and "](big-vs-small.png)" in markdown
    assert f"How a saving is counted: {summary['rule']}" in markdown and "| yes " in markdown
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Load average" in markdown and cmd("--digest", "d1") in markdown
    assert re.search(rf"\| +{variant['wall_ratio']:.3f} \|", markdown)  # time, from the same round
    assert re.search(r"ok small: .*saves (19[4-9]|20[0-6])\.\d MiB", capsys.readouterr().err)


def test_saving_with_a_different_result_fails_with_the_count(workdir, capsys):
    out = workdir / "differs.md"
    status = main(["compare", "--baseline-cmd", "base", cmd("--extra", "100", "--tensors", "reference"),
                   "--variant-cmd", "lean", cmd("--tensors", "changed"), "--repeats", "1", "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 1, err
    assert "FAIL" in err and "10 of 1,100 elements differ" in err
    record = record_of(out)
    lean_run = next(run for run in record["runs"] if run["side"] == "lean")
    assert lean_run["result"]["differing_elements"] == 10 and lean_run["result"]["elements"] == 1100
    verdict = Comparison(record).summary["variants"][0]
    assert verdict["verdict"] == "fail" and verdict["agreement"]["status"] == "differs"
    assert "**Verdict: FAIL.**" in out.read_text()


@pytest.mark.parametrize("tolerance, expected", [("10", 0), ("9", 1), ("0.01", 0), ("0.5%", 1)])
def test_declared_tolerance_decides(workdir, capsys, tolerance, expected):
    # 10 of 1,100 elements differ: 10 elements and 1% (11) allow it; 9 and 0.5% (5) do not.
    status = main(["compare", "--baseline-cmd", "base", cmd("--extra", "50", "--tensors", "reference"),
                   "--variant-cmd", "lean", cmd("--tensors", "changed"), "--repeats", "1",
                   "--tolerance", f"lean={tolerance}", "-o", str(workdir / "t.md")])
    assert status == expected, capsys.readouterr().err
    agreement = Comparison(record_of(workdir / "t.md")).summary["variants"][0]["agreement"]
    assert agreement["status"] == ("within tolerance" if expected == 0 else "differs")


def test_tolerance_declared_by_the_run_counts_unless_overridden(workdir):
    # A run may declare its own tolerance through the protocol; the user's --tolerance wins.
    (workdir / "declares.py").write_text(CHILD.replace(
        'report = {"loaded_rss"', 'report = {"tolerance": {"elements": 10}, "loaded_rss"'))
    declares = " ".join([sys.executable, "declares.py", "--tensors", "changed"])
    args = ["compare", "--baseline-cmd", "base", cmd("--extra", "50", "--tensors", "reference"),
            "--variant-cmd", "lean", declares, "--repeats", "1", "-o", str(workdir / "d.md")]
    assert main(args) == 0
    variant = Comparison(record_of(workdir / "d.md")).summary["variants"][0]
    assert variant["tolerance_source"] == "declared by the run" and variant["agreement"]["allowance"] == 10
    assert main([*args, "--tolerance", "lean=0"]) == 1


def test_a_variant_that_saves_nothing_may_differ(workdir, capsys):
    status = main(["compare", "--baseline-cmd", "base", cmd("--digest", "one"),
                   "--variant-cmd", "fat", cmd("--extra", "100", "--digest", "two"),
                   "--repeats", "1", "-o", str(workdir / "n.md")])
    assert status == 0, capsys.readouterr().err
    variant = Comparison(record_of(workdir / "n.md")).summary["variants"][0]
    assert not variant["claims_saving"] and variant["agreement"]["status"] == "differs"
    assert variant["verdict"] == "ok" and "no saving: uses more" in variant["why"]
    assert variant["noise"]["status"] == "uses more"


def test_identical_sides_save_nothing_beyond_the_noise(workdir, capsys):
    # The same program on both sides: whichever median is lower, no saving is counted.
    out = workdir / "same.md"
    status = main(["compare", "--baseline-cmd", "a", cmd("--name", "a"), "--variant-cmd", "b", cmd("--name", "b"),
                   "--repeats", "3", "-o", str(out)])
    assert status == 0, capsys.readouterr().err
    summary = Comparison(record_of(out)).summary
    variant = summary["variants"][0]
    assert variant["noise"]["status"] == "within noise" and not variant["claims_saving"]
    assert variant["noise"]["measured"] is not None and variant["noise"]["margin"] == 16 * MiB
    assert "no saving beyond the noise" in variant["why"] and "saves" not in variant["why"]
    markdown = out.read_text()
    assert "no: within noise" in markdown and f"How a saving is counted: {summary['rule']}" in markdown
    assert "no saving beyond the noise" in capsys.readouterr().err


@pytest.mark.parametrize("repeats, status_words", [("1", ("cannot tell", "cannot tell whether it saves memory")),
                                                    ("2", ("within noise", "no saving beyond the noise"))])
def test_a_saving_within_the_noise_floor_is_not_claimed(workdir, capsys, repeats, status_words):
    # 8 MiB less with another result: below the 16 MiB floor, so no saving is claimed and a
    # changed result is no failure (counting any lower median made this exit 1).
    status = main(["compare", "--baseline-cmd", "base", cmd("--extra", "8", "--digest", "one"),
                   "--variant-cmd", "lean", cmd("--digest", "two"), "--repeats", repeats, "-o", str(workdir / "w.md")])
    err = capsys.readouterr().err
    assert status == 0, err
    variant = Comparison(record_of(workdir / "w.md")).summary["variants"][0]
    assert variant["noise"]["status"] == status_words[0] and variant["verdict"] == "ok"
    assert status_words[1] in variant["why"] and "result differs" in variant["why"]
    assert "ok lean: " in err and status_words[1] in err


def test_no_result_is_unknown_and_fails_only_when_required(workdir, capsys):
    args = ["compare", "--baseline-cmd", "base", cmd("--extra", "50"), "--variant-cmd", "lean", cmd(),
            "--repeats", "1", "-o", str(workdir / "u.md")]
    assert main(args) == 0
    assert Comparison(record_of(workdir / "u.md")).summary["variants"][0]["agreement"]["status"] == "unknown"
    assert main([*args, "--require-result"]) == 1
    assert "a result is required" in capsys.readouterr().err


def test_sides_alternate(workdir):
    log = workdir / "order.log"
    sides = [Side(name, [sys.executable, "child.py", "--log", str(log), "--name", name])
             for name in ("base", "v1", "v2")]
    comparison = run_comparison(sides[0], sides[1:], repeats=3)
    expected = ["base", "v1", "v2"] * 3
    assert log.read_text().split() == expected  # the order the processes really ran in
    runs = comparison.record["runs"]
    assert [run["side"] for run in runs] == expected
    assert [run["order"] for run in runs] == list(range(1, 10))
    assert [run["repeat"] for run in runs] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert "base -> v1 -> v2" in comparison_markdown.render(comparison_report(comparison.record, comparison.summary))


def test_peak_is_the_childs_own_not_the_parents(workdir):
    # A child forked from a big parent starts from the parent's high-water mark; the launcher
    # in between keeps a 400 MiB parent out of the child's peak.
    held = bytearray(400 * MiB)
    held[::4096] = b"\x01" * len(held[::4096])
    tiny = Side("tiny", [sys.executable, "-c", "pass"])
    comparison = run_comparison(tiny, [Side("tiny2", [sys.executable, "-c", "pass"])], repeats=1)
    for run in comparison.record["runs"]:
        assert run["peak_rss"] < 60 * MiB, run["peak_rss"] / MiB
    del held


CALLABLES = '''
import numpy as np
from auditor.comparison import protocol

def masks():
    protocol.loaded()
    return {"m": np.arange(10, dtype=np.int64) % 2}

def masks_off_by_one():
    m = np.arange(10, dtype=np.int64) % 2
    m[3] = 7
    return {"m": m}
'''


def test_callables_as_sides(workdir):
    (workdir / "cmp_callables.py").write_text(CALLABLES)
    baseline = Side.call("masks", "cmp_callables:masks")
    variant = Side.call("off", "cmp_callables:masks_off_by_one", tolerance=Tolerance(elements=1))
    comparison = run_comparison(baseline, [variant], repeats=1)
    runs = comparison.record["runs"]
    assert runs[0]["loaded_rss"] is not None and runs[1]["loaded_rss"] is None
    assert runs[1]["result"]["differing_elements"] == 1
    assert comparison.summary["variants"][0]["agreement"]["status"] == "within tolerance"


def test_a_report_renders_again_from_its_record(workdir, capsys):
    out = workdir / "first.md"
    assert main(["compare", "--baseline-cmd", "base", cmd("--extra", "50", "--tensors", "reference"),
                 "--variant-cmd", "lean", cmd("--tensors", "changed"), "--repeats", "1", "-o", str(out)]) == 1
    again = workdir / "again" / "second copy.md"
    again.parent.mkdir()
    assert main(["compare", "--from", str(out.with_suffix(".json")), "-o", str(again)]) == 1
    assert again.read_text() == out.read_text().replace("](first.png)", "](second%20copy.png)")
    assert again.with_suffix(".png").exists()
    # the record keeps the interpreter's path; the report names it without the machine's folders
    assert sys.executable in out.with_suffix(".json").read_text()
    text, python = out.read_text(), os.path.basename(sys.executable)
    assert f"\nbase  {python} child.py --extra 50" in text and f"\nlean  {python} child.py" in text
    assert f"- Python {sys.version.split()[0]} ({python})," in text
    record, stat = out.with_suffix(".json"), out.with_suffix(".json").stat()
    assert main(["compare", "--from", str(record)]) == 1  # beside its record: the record stays untouched
    assert record.stat().st_mtime_ns == stat.st_mtime_ns and out.read_text().count("](first.png)") == 1


@pytest.fixture
def small_disk(tmp_path):
    """A 16 KiB tmpfs: room for a comparison record, not for its chart."""
    folder = tmp_path / "small"
    folder.mkdir()
    yield from mounted_tmpfs(folder, "size=16k", "cannot mount a small tmpfs here")


def mounted_tmpfs(folder, options: str, unable: str):
    """A tmpfs mounted on `folder` for the fixture's life; the test is skipped where not allowed."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"{unable}: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_keeps_the_record_and_says_so(workdir, small_disk, capsys):
    out = small_disk / "full.md"
    status = main(["compare", *LOGGED, "--repeats", "1", "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("compare: cannot write ") and "No space left on device" in last, err
    assert f"{out.with_suffix('.json')} is complete: `auditor compare --from" in last
    assert "ok v: " in err  # the results were shown before any write
    assert Comparison.load(out.with_suffix(".json")).record["runs"][1]["side"] == "v"


def test_a_failing_run_stops_the_comparison(workdir, capsys):
    status = main(["compare", "--baseline-cmd", "base", cmd(),
                   "--variant-cmd", "broken", f"{sys.executable} -c 'import sys; sys.exit(\"boom\")'",
                   "--repeats", "1", "-o", str(workdir / "f.md")])
    err = capsys.readouterr().err
    assert status == 1 and "broken run 1: exited with status 1" in err and "boom" in err
    assert not (workdir / "f.md").exists()


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


@pytest.fixture
def scene(workdir):
    """What a careless -o could destroy: a real run record, a user's JSON file, a file where a
    folder is expected, a folder where the chart would go."""
    import auditor
    with auditor.Audit(workdir / "run", name="kept"), auditor.stage("work"):
        pass
    (workdir / "data.json").write_text('{"mine": 1}\n')
    (workdir / "afile").write_text("not a folder\n")
    (workdir / "busy.png").mkdir()
    (workdir / "kept").mkdir()
    (workdir / "kept" / "old.txt").write_text("kept\n")
    return workdir


LOGGED = ["--baseline-cmd", "b", cmd("--log", "ran.log"), "--variant-cmd", "v", cmd("--log", "ran.log", "--extra", "1")]


@pytest.mark.parametrize("args, says", [
    (["--variant", "no-such-variant"], "unknown variant 'no-such-variant'; known variants: baseline"),
    (["--variant", "lean", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--baseline-cmd", "b", "true", "--variant-cmd", "v", ""], "--variant-cmd v: the command is empty"),
    (["--baseline-cmd", "b", "true", "--variant-cmd", "v", "no-such-program-x"], "not an executable"),
    (["--baseline-cmd", "b", "true", "--variant-cmd", "v", "'unclosed"], "cannot split the command"),
    (["--baseline-cmd", "b", "true"], "nothing to compare"),
    ([*LOGGED, "--tolerance", "w=1"], "one of the variants (v)"),
    ([*LOGGED, "--tolerance", "v=lots"], "is not a number"),
    ([*LOGGED, "-o", "x.txt"], "markdown file"),
    ([*LOGGED, "--", "--arch", "x"], "GradProbe sides"),
    (["--from", "missing.json"], "cannot read comparison record"),
    # the same side twice measures only noise
    (["--variant", "lean", "--variant", "lean"], "variant 'lean' is given twice; give each variant once"),
    (["--variant", "baseline"], "variant 'baseline' runs the baseline's own command"),
    (["--baseline", "lean", "--variant", "lean"], "variant 'lean' runs the baseline's own command"),
    (["--baseline-cmd", "b", cmd("--log", "ran.log"), "--variant-cmd", "v", cmd("--log", "ran.log")],
     "variant 'v' runs the baseline's own command"),
    ([*LOGGED, "--variant-cmd", "w", cmd("--log", "ran.log", "--extra", "1")],
     "variant 'w' is given twice (the same command as 'v')"),
    ([*LOGGED, "--variant-cmd", "v", cmd("--log", "ran.log", "--extra", "2")], "two sides are named 'v'"),
    # outputs that would land on a record, or cannot be written, found before any run
    ([*LOGGED, "-o", "run/run.md"], "'run' is a run folder (it holds run.json)"),
    ([*LOGGED, "-o", "run/report.md"], "'run' is a run folder"),
    ([*LOGGED, "-o", "run.md"], "would write its record to 'run.json', a run record's name"),
    ([*LOGGED, "-o", "data.md"], "would replace 'data.json', which is not a comparison record"),
    ([*LOGGED, "-o", "busy.md"], "'busy.png' is a folder"),
    ([*LOGGED, "-o", "afile/report.md"], "'afile' is a file, not a folder"),
    ([*LOGGED, "-o", "afile/deeper/report.md"], "folder 'afile/deeper' does not exist"),
    ([*LOGGED, "-o", "missing/report.md"], "folder 'missing' does not exist"),
    ([*LOGGED, "-o", "kept"], "-o 'kept' is a folder"),
    ([*LOGGED, "--run-dir", "kept"], "--run-dir folder 'kept' is not empty"),
    ([*LOGGED, "--keep-runs", "afile"], "--run-dir 'afile' is a file"),  # the old spelling
    (["--from", "run/run.json"], "is not a comparison record"),
])
def test_bad_input_is_one_line_and_status_2(scene, capsys, args, says):
    before = snapshot(scene)
    assert main(["compare", *args]) == 2
    assert says in one_error_line(capsys)
    assert snapshot(scene) == before  # nothing ran, nothing written, nothing existing changed


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nobody may write: mode 0500, or for root (who writes through modes) a read-only
    tmpfs where the machine allows mounting one."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)
        return
    yield from mounted_tmpfs(folder, "ro,size=1m", "root writes through file modes and no read-only tmpfs")


def test_an_unwritable_report_folder_is_refused_before_any_run(workdir, read_only_folder, capsys):
    assert main(["compare", *LOGGED, "--repeats", "3", "-o", str(read_only_folder / "r.md")]) == 2
    assert "permission denied" in one_error_line(capsys)
    assert main(["compare", *LOGGED, "--keep-runs", str(read_only_folder / "runs"), "-o", "r.md"]) == 2
    assert "is not writable" in one_error_line(capsys)
    assert not (workdir / "ran.log").exists() and list(read_only_folder.iterdir()) == []
    # a writable folder runs; an earlier comparison's record is the one JSON file -o may replace
    args = ["compare", *LOGGED, "--repeats", "1", "-o", str(workdir / "again.md")]
    assert main(args) == 0 and main(args) == 0, capsys.readouterr().err
    assert (workdir / "ran.log").read_text().split() == ["?"] * 4


def test_unknown_variant_from_the_command_line(workdir):
    done = subprocess.run([sys.executable, "-m", "auditor", "compare", "--variant", "fastest"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown variant 'fastest'; known variants: " in lines[0], done.stderr
    assert "lean" in lines[0]


@pytest.mark.parametrize("args, says", [
    (["--variant", "lean", "--variant", "lean"], "given twice"),
    (["--variant", "lean", "--", "--seq-len", "100000000"], "gradprobe: error: --seq-len 100000000 exceeds"),
    (["--variant", "lean", "--", "--threads", "-3"], "gradprobe: error: --threads must be at least 1"),
    (["--variant", "lean", "-o", "run.md"], "a run record's name"),
])
def test_mistakes_are_answered_before_torch_loads(tmp_path, args, says):
    # No run starts and torch stays out, so the answer comes at once.
    script = ("import sys; from auditor.cli import main; status = main(sys.argv[1:]); "
              "print(status, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, "compare", *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.stdout.split() == ["2", "False"], done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_result_files_compare_bit_for_bit(tmp_path):
    import torch
    from safetensors.torch import save_file

    from auditor.comparison.result_files import differing_elements, digest
    a = {"w": torch.tensor([0.0, 1.0, float("nan")], dtype=torch.bfloat16), "m": torch.zeros(4, dtype=torch.bool),
         "only_a": torch.zeros(5)}
    b = {"w": torch.tensor([-0.0, 1.0, float("nan")], dtype=torch.bfloat16),  # -0.0 differs bitwise
         "m": torch.tensor([True, False, False, True]), "only_b": torch.zeros(2, 3)}
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    assert differing_elements(tmp_path / "a.safetensors", tmp_path / "b.safetensors") == 1 + 2 + 5 + 6
    assert differing_elements(tmp_path / "a.safetensors", tmp_path / "a.safetensors") == 0
    (digest_a, total), (digest_b, _) = digest(tmp_path / "a.safetensors"), digest(tmp_path / "b.safetensors")
    assert total == 12 and digest_a != digest_b
    save_file({"w": torch.zeros(2, 2)}, tmp_path / "c.safetensors")
    save_file({"w": torch.zeros(4)}, tmp_path / "d.safetensors")  # another shape: all differ
    assert differing_elements(tmp_path / "c.safetensors", tmp_path / "d.safetensors") == 4


def test_tolerance_parsing():
    assert Tolerance.parse("10") == Tolerance(elements=10)
    assert Tolerance.parse("0.001") == Tolerance(fraction=0.001)
    assert Tolerance.parse("0.1%") == Tolerance(fraction=0.001)
    assert Tolerance(fraction=0.001).allowance(10_000) == 10
    for bad in ("-1", "1.5", "x"):
        with pytest.raises(ValueError):
            Tolerance.parse(bad)
