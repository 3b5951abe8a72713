"""Atomic writes: a failed write leaves the old file and no temporary file behind."""

import pytest

from learntok import atomic


def test_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomic.write_text(path, "old\n")
    atomic.write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]


def test_failed_write_keeps_old_file_and_cleans_up(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic.atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
