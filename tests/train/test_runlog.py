"""Run directories (dsv32.runlog) on a tiny module: a new run never loses its checkpoints to an older
run's, resuming checks the checkpoint belongs to the run, unreadable checkpoints are named and
skipped, run logs survive a torn last line, ``optimizer.pt`` loads without unpickling code."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from dsv32.jsonl import read_json
from dsv32.runlog import (
    CheckpointError,
    RunLogError,
    StepCheckpoints,
    read_metrics,
    run_differences,
    truncate_metrics,
)

RUN = {"model": {"name": "m"}, "data": {"source": "a.jsonl"}, "train": {"lr": 0.1}}


def _model(seed=0, width=4):
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _save(out, steps, run=RUN, keep=1, seed=0):
    ckpts = StepCheckpoints(out, keep=keep, run=run)
    model, opt = _model(seed)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    for s in steps:
        ckpts.save(s, model, opt)
    return model


def _names(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def _listing(out):
    return sorted((str(p.relative_to(out)), p.stat().st_mtime_ns) for p in out.rglob("*"))


def test_a_new_run_keeps_its_checkpoints_beside_a_later_step_of_an_older_one(tmp_path):
    _save(tmp_path, [6])  # the previous run reached step 6
    _save(tmp_path, [1, 2])  # rotation (keep=1) never removes a checkpoint past the one just saved
    assert _names(tmp_path) == ["step_000002", "step_000006"]


def test_starting_over_discards_the_previous_run_and_a_plain_run_resumes_the_new_one(tmp_path):
    _save(tmp_path, [6])
    (tmp_path / "metrics.jsonl").write_text('{"step": 6}\n')
    (tmp_path / "model").mkdir()
    ckpts = StepCheckpoints(tmp_path, run=RUN)
    model, opt = _model()
    assert ckpts.begin(model, opt, resume=False, steps=2) == 0
    ckpts.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    ckpts.save(2, model, opt)
    assert _names(tmp_path) == ["step_000002"]
    fresh, opt = _model(seed=1)
    assert StepCheckpoints(tmp_path, run=RUN).begin(fresh, opt, resume=True, steps=3) == 2
    assert torch.equal(fresh.weight, model.weight)


def test_discard_leaves_other_files_and_cleans_up_after_an_interrupted_discard(tmp_path):
    _save(tmp_path, [2])
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".discarded-1" / "checkpoints").mkdir(parents=True)  # a crash in the middle of one
    StepCheckpoints(tmp_path).discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resuming_another_run_names_the_fields_and_writes_nothing(tmp_path):
    _save(tmp_path, [4])
    before = _listing(tmp_path)
    other = {**RUN, "data": {"source": "b.jsonl"}, "train": {"lr": 0.5}}
    model, opt = _model(seed=1)
    w = model.weight.detach().clone()
    with pytest.raises(CheckpointError) as err:
        StepCheckpoints(tmp_path, run=other).begin(model, opt, resume=True, steps=4)
    msg = str(err.value)
    assert "step_000004 belongs to another run" in msg and "--no-resume" in msg and "--out" in msg
    assert 'data.source "a.jsonl" → "b.jsonl"' in msg and "train.lr 0.1 → 0.5" in msg
    assert _listing(tmp_path) == before and torch.equal(model.weight, w)


def test_more_steps_extend_a_run_and_fewer_than_the_checkpoint_are_refused(tmp_path):
    _save(tmp_path, [4])
    model, opt = _model(seed=1)
    with pytest.raises(CheckpointError, match="at step 4, past this run's 3 steps: pass at least --steps 4"):
        StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=3)
    assert StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=9) == 4


def test_run_differences_flatten_sections_and_lists_as_recipes_name_them():
    a = {"grpo": {"lr": 1e-4}, "sources": [{"path": "x", "sha256": "1"}]}
    b = {"grpo": {"lr": 1e-4}, "sources": [{"path": "x", "sha256": "2"}]}
    assert run_differences(a, b) == ['sources.0.sha256 "1" → "2"']
    assert run_differences(a, json.loads(json.dumps(a))) == []
    assert run_differences({"betas": [0.9, 0.99]}, {"betas": (0.9, 0.99)}) == []  # as saved in JSON


@pytest.mark.parametrize("file", ["weights.safetensors", "optimizer.pt", "state.json"])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_older_one(tmp_path, file, caplog):
    saved = _save(tmp_path, [2])
    _save(tmp_path, [4], keep=2, seed=3)
    bad = tmp_path / "checkpoints" / "step_000004" / file
    bad.write_bytes(bad.read_bytes()[:20])
    model, opt = _model(seed=1)
    with caplog.at_level(logging.WARNING):
        assert StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=4) == 2
    assert torch.equal(model.weight, saved.weight)
    assert str(bad) in caplog.text and "step_000002" in caplog.text
    # the run goes on: saving step 3 keeps the unreadable step 4 until step 4 is saved again
    ckpts = StepCheckpoints(tmp_path, keep=1, run=RUN)
    ckpts.save(3, model, opt)
    assert _names(tmp_path) == ["step_000003", "step_000004"]
    ckpts.save(4, model, opt)
    assert _names(tmp_path) == ["step_000004"]
    assert StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=4) == 4


@pytest.mark.parametrize("file", ["weights.safetensors", "optimizer.pt", "state.json"])
def test_no_readable_checkpoint_is_a_typed_error_naming_the_file(tmp_path, file):
    _save(tmp_path, [2])
    bad = tmp_path / "checkpoints" / "step_000002" / file
    bad.write_bytes(bad.read_bytes()[:20])
    model, opt = _model()
    with pytest.raises(CheckpointError, match="no readable checkpoint") as err:
        StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=4)
    assert str(bad) in str(err.value) and "--no-resume" in str(err.value)


def test_a_checkpoint_of_another_shape_is_refused_not_skipped(tmp_path):
    _save(tmp_path, [2])
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(
        CheckpointError, match=r"does not fit the model \(weight is \[3, 4\] in the checkpoint"
    ):
        StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=4)


def test_a_fresh_start_over_a_trained_model_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    model, opt = _model()
    with pytest.raises(CheckpointError, match="holds a trained model/ and no checkpoint"):
        StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=True, steps=4)
    assert StepCheckpoints(tmp_path, run=RUN).begin(model, opt, resume=False, steps=4) == 0


def test_optimizer_state_loads_without_unpickling_code(tmp_path):
    _save(tmp_path, [1])
    blob = torch.load(tmp_path / "checkpoints" / "step_000001" / "optimizer.pt", weights_only=True)
    assert {"optimizer", "rng"} <= blob.keys()


def test_rng_states_round_trip_and_earlier_numpy_state_files_still_load(tmp_path):
    model = _save(tmp_path, [1])
    path = tmp_path / "checkpoints" / "step_000001" / "optimizer.pt"
    blob = torch.load(path, weights_only=True)
    np.random.seed(7)
    torch.save(blob | {"rng": blob["rng"] | {"numpy": np.random.get_state()}}, path)  # an array, as before
    expected = np.random.rand(3)
    np.random.seed(0)
    fresh, opt = _model(seed=1)
    StepCheckpoints(tmp_path, run=RUN).load(path.parent, fresh, opt)
    assert np.array_equal(np.random.rand(3), expected) and torch.equal(fresh.weight, model.weight)


def test_truncating_a_log_cuts_a_torn_last_line_and_names_a_bad_one(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "lr"')
    assert [r["step"] for r in read_metrics(log)] == [1, 2, 3, 4, 5]
    assert log.read_text().endswith('{"step": 6, "lr"')  # reading leaves the file as it is
    truncate_metrics(log, 4)
    assert log.read_text() == "".join(json.dumps({"step": s}) + "\n" for s in range(1, 5))
    log.write_text('{"step": 1}\n{"step": 2, oops}\n')
    with pytest.raises(RunLogError, match=rf"{log}:2: not JSON .*--no-resume"):
        truncate_metrics(log, 1)
    log.write_text('{"step": 1}\n[2]\n')
    with pytest.raises(RunLogError, match=rf"{log}: a row without an integer step"):
        truncate_metrics(log, 1)


def test_read_json_names_the_file(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"a": 1,')
    with pytest.raises(RunLogError, match=rf"^{path}: not JSON \(.* line 1, column 9\); fix it$"):
        read_json(path, RunLogError, "fix it")
    path.write_bytes(b"\xff")
    with pytest.raises(RunLogError, match=rf"^{path}: not JSON \(UnicodeDecodeError"):
        read_json(path, RunLogError)


# ---------------------------------------------------------------------------------------------- durability
def record_syncs(monkeypatch):
    """Record, in order, every ``os.fsync`` (as the path synced) and ``os.replace`` (as ``(src, dst)``)."""
    import os

    events: list = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def _synced_before_and_after(events, src, dst, files):
    """Every file of ``files`` and the folders that hold them were synced before ``src`` was renamed to
    ``dst``, and ``dst``'s folder after."""
    i = events.index(("replace", str(src), str(dst)))
    before = {e[1] for e in events[:i] if e[0] == "fsync"}
    after = {e[1] for e in events[i + 1 :] if e[0] == "fsync"}
    assert {str(f) for f in files} <= before, (files, before)
    assert {str(f.parent) for f in files} <= before
    assert str(src.parent) in before and str(dst.parent) in after


def test_durable_replace_syncs_a_file_and_its_folder_around_the_rename(tmp_path, monkeypatch):
    from dsv32.runlog import durable_replace

    (tmp_path / "a").mkdir()
    src, dst = tmp_path / "a" / "new.txt", tmp_path / "b.txt"
    src.write_text("new")
    dst.write_text("old")
    events = record_syncs(monkeypatch)
    durable_replace(src, dst)
    assert dst.read_text() == "new" and not src.exists()
    _synced_before_and_after(events, src, dst, [src])
    assert events[-1] == ("fsync", str(tmp_path))  # the rename itself reaches the disk


def test_durable_replace_syncs_every_file_and_folder_of_a_tree_first(tmp_path, monkeypatch):
    from dsv32.runlog import durable_replace

    src = tmp_path / ".tmp"
    (src / "sub").mkdir(parents=True)
    files = [src / "x.bin", src / "sub" / "y.bin"]
    for f in files:
        f.write_bytes(b"data")
    events = record_syncs(monkeypatch)
    durable_replace(src, tmp_path / "done")
    _synced_before_and_after(events, src, tmp_path / "done", [*files, src / "sub"])
    assert (tmp_path / "done" / "sub" / "y.bin").read_bytes() == b"data"


def test_a_step_checkpoint_reaches_the_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    events = record_syncs(monkeypatch)
    _save(tmp_path, [1])
    ckpts = tmp_path / "checkpoints"
    tmp = ckpts / ".tmp_step_000001"
    files = [tmp / n for n in ("weights.safetensors", "optimizer.pt", "state.json")]
    _synced_before_and_after(events, tmp, ckpts / "step_000001", files)
    events.clear()
    _save(tmp_path, [1], seed=1)  # the same step again: the old folder moves aside, the new one in
    _synced_before_and_after(events, tmp, ckpts / "step_000001", files)
    assert _names(tmp_path) == ["step_000001"]


def test_metadata_is_synced_with_its_folder(tmp_path, monkeypatch):
    from dsv32.runlog import write_json

    events = record_syncs(monkeypatch)
    write_json(tmp_path / "config.json", {"a": 1})
    (replaced,) = [e for e in events if e[0] == "replace"]
    tmp = Path(replaced[1])
    _synced_before_and_after(events, tmp, tmp_path / "config.json", [tmp])
    assert read_json(tmp_path / "config.json", RunLogError) == {"a": 1}


def _refuse_folder_syncs(monkeypatch, code):
    """``os.fsync`` that answers ``code`` for a directory (as some network mounts do); the folders
    refused, in order."""
    import os
    import stat

    real_fsync, refused = os.fsync, []

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            refused.append(os.readlink(f"/proc/self/fd/{fd}"))
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return refused


def _stage(root, step, payload=b"data"):
    from dsv32.runlog import stage_checkpoint

    staged = stage_checkpoint(root, step)
    (staged / "payload.bin").write_bytes(payload)
    (staged / "state.json").write_text(json.dumps({"step": step}))
    return staged


@pytest.mark.parametrize("code", ["EINVAL", "ENOTSUP", "EBADF"])
def test_a_checkpoint_is_published_where_a_folder_cannot_be_synced(tmp_path, monkeypatch, code):
    import errno

    from dsv32.runlog import publish_checkpoint

    refused = _refuse_folder_syncs(monkeypatch, getattr(errno, code))
    root = tmp_path / "checkpoints"
    for step, payload in [(1, b"one"), (2, b"two"), (2, b"again")]:
        path = publish_checkpoint(_stage(root, step, payload), step, keep=1)
    assert str(root) in refused
    assert path == root / "step_000002" and _names(tmp_path) == ["step_000002"]
    assert (path / "payload.bin").read_bytes() == b"again"


def test_a_folder_sync_that_fails_otherwise_stops_the_publish(tmp_path, monkeypatch):
    import errno

    from dsv32.runlog import publish_checkpoint

    _refuse_folder_syncs(monkeypatch, errno.EIO)
    staged = _stage(tmp_path / "checkpoints", 1)
    with pytest.raises(OSError, match="Input/output error"):
        publish_checkpoint(staged, 1, keep=1)
    assert _names(tmp_path) == [".tmp_step_000001"]  # nothing published, the staged folder is left


def test_publishing_keeps_the_newest_up_to_the_step_and_never_the_one_just_published(tmp_path):
    from dsv32.runlog import complete_checkpoints, publish_checkpoint

    root = tmp_path / "checkpoints"
    for step in (9, 1, 2, 3):  # 9: a later step of an earlier run
        publish_checkpoint(_stage(root, step), step, keep=2)
    assert [s for s, _ in complete_checkpoints(root)] == [2, 3, 9]  # 9 is past step 3: never pruned
    publish_checkpoint(_stage(root, 4), 4, keep=0)  # keep at least the one just published
    assert _names(tmp_path) == ["step_000004", "step_000009"]
