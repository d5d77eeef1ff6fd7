"""Outputs are written whole or not at all, and never at the cost of an input or a user's files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pretrain.atomic import atomic_dir, atomic_files, check_output, claimed_output
from pretrain.errors import UserError

OWNER = ("metrics.json",)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "runs" / "model").mkdir(parents=True)
    (tmp_path / "runs" / "model" / "weights.bin").write_bytes(b"w")
    (tmp_path / "data.csv").write_text("text,label\n")
    return tmp_path


@pytest.mark.parametrize("out, message", [
    ("runs/model", "is the input"),                          # the input itself
    ("runs", "holds the input"),                             # a dir holding it: replacing it deletes the input
    ("runs/model/export", "lies inside the input"),          # inside it: the input would change
    ("data.csv", "is the input"),                            # a data file the command reads
])
def test_an_output_touching_an_input_is_refused(tree: Path, out: str, message: str):
    with pytest.raises(UserError, match=message):
        check_output(tree / out, [tree / "runs" / "model", tree / "data.csv"], owner_files=OWNER)
    assert (tree / "runs" / "model" / "weights.bin").read_bytes() == b"w"


@pytest.mark.parametrize("out", [".", "..", "/", "runs/.."])
def test_an_output_named_by_a_relative_step_is_refused(tree: Path, out: str):
    with pytest.raises(UserError, match="not by its name"):
        check_output(Path(out), [], owner_files=OWNER)


def test_a_link_to_an_input_is_the_input(tree: Path):
    (tree / "alias").symlink_to(tree / "runs")
    with pytest.raises(UserError, match="would replace the input"):
        check_output(tree / "alias" / "model", [tree / "runs" / "model"], owner_files=None)


def test_inputs_that_are_names_not_paths_are_skipped(tree: Path):
    check_output(tree / "wordnet", ["wordnet", "minilm", None], owner_files=OWNER)   # nothing there to lose


def test_a_dir_is_replaced_only_when_new_empty_or_an_earlier_output(tree: Path):
    inputs = [tree / "runs" / "model"]
    check_output(tree / "new", inputs, owner_files=OWNER)                  # absent
    (tree / "empty").mkdir()
    check_output(tree / "empty", inputs, owner_files=OWNER)                # empty
    (tree / "earlier").mkdir()
    (tree / "earlier" / "metrics.json").write_text("{}")
    (tree / "earlier" / "model.bin").write_bytes(b"")
    check_output(tree / "earlier", inputs, owner_files=OWNER)              # this command's own output
    (tree / "mine").mkdir()
    (tree / "mine" / "thesis.tex").write_text("years of work")
    with pytest.raises(UserError, match=r"did not write \(it lacks metrics.json\)"):
        check_output(tree / "mine", inputs, owner_files=OWNER)
    with pytest.raises(UserError, match="is a file; expected a directory"):
        check_output(tree / "data.csv", [], owner_files=OWNER)
    check_output(tree / "mine", inputs, owner_files=None)                  # the caller owns the contents


def test_atomic_dir_replaces_an_earlier_output_whole(tree: Path):
    target = tree / "earlier"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert not [p for p in tree.iterdir() if p.name.startswith(".earlier")]


def test_what_a_killed_writer_left_beside_its_output_goes_and_a_live_writers_temporary_stays(tmp_path: Path):
    """A killed `finetune` or `export` left its temporary (a model copy) beside its output for
    good: only `run` and `search` cleared their own dir's."""
    import fcntl
    killed, live = tmp_path / ".out.tmp-k1ll3d", tmp_path / ".out.tmp-l1ve"
    another_outputs = tmp_path / ".other.tmp-k1ll3d"        # its own writer clears it
    for path in (killed, live, another_outputs):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"w")
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)                        # as its writer holds it
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "model.safetensors").write_bytes(b"new")
        assert not killed.exists() and live.exists() and another_outputs.exists()
        set_aside = tmp_path / ".out.old-12345"             # by a writer killed before it deleted it
        set_aside.mkdir()
        with atomic_dir(tmp_path / "out"):
            pass
        assert not set_aside.exists() and live.exists()
    finally:
        os.close(held)


def test_files_written_private_are_shared_like_every_other_output(tmp_path: Path):
    """safetensors writes its file 0600: an output dir gives it the umask's ordinary mode."""
    import os
    mask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "model") as tmp:
            (tmp / "model.safetensors").write_bytes(b"w")
            os.chmod(tmp / "model.safetensors", 0o600)
            (tmp / "script.sh").write_text("#!/bin/sh\n")
            os.chmod(tmp / "script.sh", 0o755)
    finally:
        os.umask(mask)
    assert (tmp_path / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "model" / "script.sh").stat().st_mode & 0o777 == 0o755     # other modes kept



def test_an_output_the_disk_would_refuse_is_refused_before_any_work(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match=r"afile is a file; expected a directory there"):
        check_output(tmp_path / "afile" / "out", [], owner_files=())
    with pytest.raises(UserError, match=r"has 216 bytes; expected at most 215"):
        check_output(tmp_path / ("v" * 216), [], owner_files=())
    check_output(tmp_path / ("v" * 215) / "deeper", [], owner_files=())     # a new dir under a new dir: fine
    (tmp_path / ("p" * 230)).mkdir()
    check_output(tmp_path / ("p" * 230) / "out.json", [], owner_files=None)   # an existing long dir: no temp names
    with pytest.raises(UserError, match=r"has 256 bytes; expected at most 255$"):
        check_output(tmp_path / ("n" * 256) / "out", [], owner_files=())
    check_output(tmp_path / os.fsdecode(b"\xe9.json"), [], owner_files=None)   # not UTF-8: bytes all the same


def test_write_failure_reads_safetensors_and_torch_save_errors():
    from safetensors import SafetensorError

    from pretrain.atomic import write_failure
    assert write_failure(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")) \
        == "No space left on device"
    assert write_failure(SafetensorError("Error while deserializing header: InvalidHeaderDeserialization")) is None
    assert write_failure(OSError(2, "No such file or directory")) is None      # a missing input, not a refused write
    assert write_failure(ValueError("unexpected pos")) is None


def test_scratch_left_by_a_killed_process_goes_and_a_live_ones_stays(tmp_path: Path, monkeypatch):
    """A hard-killed export left a model copy (91 MB) in the temp dir at every kill."""
    import subprocess
    import sys
    import tempfile

    from pretrain.atomic import scratch_dir
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    orphan, live = tmp_path / f"compressor-export-{gone}-abc", tmp_path / f"compressor-export-{os.getpid()}-def"
    for path in (orphan, live):
        path.mkdir()
        (path / "fp32.onnx").write_bytes(b"graph")
    with scratch_dir("export") as work:
        assert Path(work).name.startswith(f"compressor-export-{os.getpid()}-")
        assert not orphan.exists() and live.exists()
    assert not Path(work).exists()


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_torch_save_stopped_mid_write_raises_what_stopped_it(tmp_path: Path, raised):
    """torch.save wraps an exception of the file's write() in its own RuntimeError: a SIGTERM
    mid-checkpoint read as a full disk (exit 2) instead of a stop (143)."""
    import torch

    from pretrain.atomic import atomic_write

    def save(f):
        class Failing:
            def write(self, data):
                raise raised
        torch.save({"x": torch.zeros(10)}, Failing())
    with pytest.raises(type(raised)):
        atomic_write(tmp_path / "checkpoint.pt", save)
    assert list(tmp_path.iterdir()) == []


def test_a_dir_written_atomically_inside_another_does_not_wait_on_the_outer_writers_lock(tmp_path):
    """The outer writer holds its temporary; the inner one's cleanup of its parent (that
    temporary) must not wait for a lock its own process holds, which would never come."""
    done = threading.Event()

    def nested():
        with atomic_dir(tmp_path / "outer") as outer:
            with atomic_dir(outer / "inner") as inner:
                (inner / "weights.bin").write_bytes(b"w")
        done.set()
    threading.Thread(target=nested, daemon=True).start()
    assert done.wait(timeout=20), "the nested atomic_dir hung on its parent's lock"
    assert (tmp_path / "outer" / "inner" / "weights.bin").read_bytes() == b"w"


def test_a_second_writer_of_a_claimed_output_is_refused(tmp_path):
    """Two exports into one --out both ran, and the last rename silently replaced the other's
    output. The claim is a locked temporary beside the output, gone when the command ends; a
    killed command's (unlocked) is cleared, and dirs made on the way to a refused output go."""
    import fcntl
    out = tmp_path / "out"
    killed = tmp_path / ".out.tmp-k1ll3d"
    killed.mkdir()
    with claimed_output(out):
        assert not killed.exists()
        with pytest.raises(UserError, match=rf"^--out {out} is in use by another command writing the same output; "
                                            "wait for it to finish, or choose another --out$"):
            with claimed_output(out):
                pass
        with atomic_dir(out) as tmp:            # the command's own write goes on
            (tmp / "weights.bin").write_bytes(b"w")
        with claimed_output(tmp_path / "other"):    # another output is free
            pass
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    with claimed_output(out):                   # free again
        pass
    live = tmp_path / ".deeper.tmp-l1ve"        # any live writer's temporary of the output refuses
    live.mkdir()
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)
    try:
        with pytest.raises(UserError, match="is in use by another command"):
            with claimed_output(tmp_path / "deeper"):
                pass
    finally:
        os.close(held)
    with pytest.raises(UserError):
        with claimed_output(tmp_path / "new" / "dirs" / "x"):
            with claimed_output(tmp_path / "new" / "dirs" / "x"):
                pass
    assert not (tmp_path / "new").exists()


REPORT_SET = ["pareto.png", "report.md", "report.html", "report.json"]      # as write_reports gives them


@pytest.mark.parametrize("renamed", range(len(REPORT_SET)))
def test_a_set_of_files_stopped_while_replaced_never_mixes_two_sets(renamed, tmp_path, monkeypatch):
    """Renamed one by one over the earlier files, report.json last, a stop between renames left
    a new report.md beside the report.json of the run before: a set that looked complete. The
    earlier set goes first now, report.json first of all: a report.json is only ever beside
    its own set, and writing the set again completes it."""
    atomic_files(tmp_path, {name: b"earlier" for name in REPORT_SET})
    real_replace, replaced = os.replace, []

    def stop_after_some(src, dst):
        if len(replaced) == renamed:
            raise KeyboardInterrupt
        real_replace(src, dst)
        replaced.append(dst)
    monkeypatch.setattr(os, "replace", stop_after_some)
    with pytest.raises(KeyboardInterrupt):
        atomic_files(tmp_path, {name: b"new" for name in REPORT_SET})
    monkeypatch.undo()
    left = {path.name: path.read_bytes() for path in tmp_path.iterdir()}     # no temporaries either
    assert set(left) <= set(REPORT_SET) and len(set(left.values())) <= 1, left   # files of one set
    assert "report.json" not in left or sorted(left) == sorted(REPORT_SET), left  # ... complete with it
    atomic_files(tmp_path, {name: b"rerun" for name in REPORT_SET})
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == {name: b"rerun" for name in REPORT_SET}
