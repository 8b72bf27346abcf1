"""reports/projection-as-written.md is made again from its committed record alone, byte for
byte, and the record is the benchmark's current cases (no case run with other arguments)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "projection_as_written.py"
REPORT = ROOT / "reports" / "projection-as-written.md"
RECORD = ROOT / "reports" / "projection-as-written.json"


def _render(record: Path, output: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--from", str(record), "-o", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_report_is_made_again_from_its_record_byte_for_byte(tmp_path):
    done = _render(RECORD, tmp_path / "again.md")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "again.md").read_text() == REPORT.read_text()


def test_the_record_holds_every_case_with_the_benchmarks_own_commands():
    sys.path.insert(0, str(SCRIPT.parent))
    import projection_as_written as benchmark
    record = json.loads(RECORD.read_text())
    folder = Path(record["argv"][record["argv"].index("--run-dir") + 1])
    expected = benchmark.cases(folder)
    assert [row["name"] for row in record["rows"]] == list(expected)
    for row in record["rows"]:
        slug = row["command"][row["command"].index("--run-dir") + 1]
        assert row["command"] == ["auditor", "validate-projection", "--run-dir", slug, *expected[row["name"]]["args"]]
        assert row["scale_up"] >= 8


def test_a_file_that_is_not_its_record_is_refused_in_one_line(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    done = _render(tmp_path / "other.json", tmp_path / "out.md")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.md").exists()
