"""Where the self-check looks for a report's traces: the trace folder itself, and each subfolder
of it that holds rank traces (a report that traces every variant apart, as dp_overlap's)."""
from workbook.selfcheck import trace_folders


def test_trace_folders(tmp_path):
    assert trace_folders(tmp_path / "missing") == []
    assert trace_folders(tmp_path) == []
    for folder in ("zero3", "naive", "empty"):
        (tmp_path / folder).mkdir()
    (tmp_path / "naive" / "rank0.trace.json").write_text("{}")
    (tmp_path / "zero3" / "rank1.trace.json.gz").write_bytes(b"")
    assert trace_folders(tmp_path) == [tmp_path / "naive", tmp_path / "zero3"]
    (tmp_path / "rank0.trace.json").write_text("{}")
    assert trace_folders(tmp_path)[0] == tmp_path
