"""`write_export_dir`: a new export replaces the old one whole, or not at all."""

import os

import pytest

from tfx_transformer.training.workdir import TMP_PREFIX, remove_leftovers, write_export_dir


def _snapshot(directory):
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, directory)] = f.read()
    return files


def _old_export(tmp_path):
    target = tmp_path / "export"
    (target / "variables").mkdir(parents=True)
    (target / "saved_model.pb").write_bytes(b"old model")
    (target / "variables" / "variables.index").write_bytes(b"old index")
    return target


def _writer(files):
    def write(directory):
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)

    return write


def test_a_new_export_replaces_the_old_one_whole(tmp_path):
    target = _old_export(tmp_path)
    new = {"saved_model.pb": b"new model", "info.json": b"{}"}
    assert write_export_dir(target, _writer(new)) == str(target)
    assert _snapshot(target) == new  # variables/ of the old export is gone, not merged
    assert sorted(os.listdir(tmp_path)) == ["export"]
    fresh = tmp_path / "a" / "b" / "export"  # missing parents are created
    assert write_export_dir(fresh, _writer(new)) == str(fresh)
    assert _snapshot(fresh) == new


def test_a_failing_writer_leaves_the_earlier_export_intact(tmp_path):
    target = _old_export(tmp_path)
    before = _snapshot(target)
    seen = []

    def write_half_and_fail(directory):
        seen.append(directory)
        assert os.listdir(directory) == []  # an empty directory beside the target
        assert os.path.dirname(directory) == str(tmp_path)
        _writer({"saved_model.pb": b"half"})(directory)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_export_dir(target, write_half_and_fail)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]  # no temporary directory left behind
    assert not os.path.exists(seen[0])
    with pytest.raises(KeyboardInterrupt):  # an interrupted writer, too
        write_export_dir(target, lambda directory: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _snapshot(target) == before
    with pytest.raises(OSError, match="disk full"):
        write_export_dir(tmp_path / "new", write_half_and_fail)
    assert sorted(os.listdir(tmp_path)) == ["export"]  # nothing half-written at a new path


def test_a_failed_swap_puts_the_earlier_export_back(tmp_path, monkeypatch):
    target = _old_export(tmp_path)
    before = _snapshot(target)
    replace = os.replace

    def replace_but_not_into_target(src, dst):
        if os.fspath(dst) == os.fspath(target) and os.path.basename(src) != target.name:
            raise OSError("device busy")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_but_not_into_target)
    with pytest.raises(OSError, match="device busy"):
        write_export_dir(target, _writer({"saved_model.pb": b"new model"}))
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_an_export_that_cannot_be_moved_aside_stays_in_place(tmp_path, monkeypatch):
    target = _old_export(tmp_path)
    before = _snapshot(target)
    replace = os.replace

    def refuse_moving_the_target(src, dst):
        if os.fspath(src) == os.fspath(target):
            raise PermissionError("read-only")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse_moving_the_target)
    with pytest.raises(PermissionError, match="read-only"):
        write_export_dir(target, _writer({"saved_model.pb": b"new model"}))
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_leftovers_of_a_killed_swap_are_cleared_and_the_earlier_export_goes_back(tmp_path):
    # A kill between the two renames of a swap: the earlier export is in a temporary folder,
    # the new one in another, and DIR/export is missing.
    aside = tmp_path / f"{TMP_PREFIX}previous-x"
    aside.mkdir()
    before = _snapshot(_old_export(aside))
    half = tmp_path / f"{TMP_PREFIX}new"
    _writer({"saved_model.pb": b"half"})(half)
    (tmp_path / f"{TMP_PREFIX}x-metrics.json").write_text("{")
    removed = remove_leftovers(tmp_path)
    assert len(removed) == 3 and sorted(os.listdir(tmp_path)) == ["export"]
    assert _snapshot(tmp_path / "export") == before
