"""What a training run leaves on disk, shared by every trainer: ``metrics.jsonl`` (one JSON line per
logged step), its metadata files and step checkpoints it can resume from exactly.

A checkpoint is ``out_dir/checkpoints/step_NNNNNN/`` with ``weights.safetensors`` (all parameters, or
only the trainable ones), ``optimizer.pt`` (optimizer state and the RNG states of torch, CUDA, Python
and NumPy, plain tensors and numbers: it loads with ``torch.load(weights_only=True)``) and
``state.json`` (the step, the run's identity and whatever the trainer adds). Every trainer's
checkpoint, whatever its files, is published the same way: written into a staging folder
(:func:`stage_checkpoint`), synced to disk and renamed into place (:func:`publish_checkpoint`), so
neither a killed run nor a power loss leaves a half-written checkpoint; after each save the newest
``keep`` checkpoints up to that step stay (a checkpoint past it is never removed).

Resuming (:meth:`StepCheckpoints.begin`) takes the newest checkpoint and checks, before anything is
written, that it belongs to this run: the run's identity (what determines the training: model, data,
hyper-parameters; not the number of steps, which may grow to extend a run) must equal the one the
checkpoint was saved with, the checkpoint's step must not be past the run's last step, and its
tensors must fit the model. A checkpoint that cannot be read (a truncated file) is skipped with a
warning for the next older one; when none is readable the run stops with a :class:`CheckpointError`.
Starting over (no checkpoint, or ``resume=False``) first discards the previous run's checkpoints and
outputs in ``out_dir`` (:meth:`StepCheckpoints.discard`): they are renamed into one hidden folder
and then deleted, so the directory never holds a mix of two runs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dsv32.errors import DSV32Error
from dsv32.jsonl import read_json, read_log

logger = logging.getLogger(__name__)

#: What a run writes besides its checkpoints; :meth:`StepCheckpoints.discard` removes these names only.
#: ``trackers``: the experiment trackers' files (:mod:`dsv32.trackers`).
RUN_OUTPUTS = ("metrics.jsonl", "eval.jsonl", "model", "config.json", "data.json", "stage.json", "trackers")

_START_OVER = "start over with --no-resume (this discards that run) or choose another --out"


class RunLogError(DSV32Error, ValueError):
    """A file of a run's output directory that cannot be read (a malformed ``metrics.jsonl`` line)."""


class CheckpointError(RunLogError):
    """A checkpoint that cannot be read, or that does not belong to this run (another model, data or
    hyper-parameters, a step past the run's end)."""


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint whose files cannot be read (truncated, not what they claim to be)."""


class OtherRunCheckpoint(CheckpointError):
    """A checkpoint of another run: ``saved`` is its run identity, ``differences`` the fields where it
    differs from this run's (:func:`run_differences`), so a trainer can say more about one of them."""

    def __init__(self, message: str, path: Path, saved: dict, differences: list[str]) -> None:
        super().__init__(message)
        self.path, self.saved, self.differences = path, saved, differences


# ---------------------------------------------------------------------------------------------- files
def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically: a temporary file of this process beside it
    (the usual permissions, unlike ``mkstemp``'s 0600), flushed to disk, then a rename — a reader or an
    interrupted run sees the old file or the new one, never a part; a failed write leaves nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as f:
            f.write(text)
        durable_replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_path(path: str | Path) -> None:
    """Flush a file's or a directory's contents to disk (a directory's entries: names created,
    renamed or removed in it). A file system that cannot sync a directory (some network mounts
    answer EINVAL) is left to its own guarantees."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def durable_replace(src: str | Path, dst: str | Path) -> None:
    """``os.replace(src, dst)`` that a power loss cannot tear: every file and folder of ``src`` (a file,
    or a folder tree) and ``src``'s parent folder are synced to disk before the rename, ``dst``'s
    parent folder (which records the rename) after it. A machine that crashes at any point comes back
    with the old ``dst`` or the whole new one, never a renamed folder of empty or partial files."""
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        for root, _dirs, files in os.walk(src, topdown=False):
            for name in files:
                fsync_path(Path(root) / name)
            fsync_path(root)
    else:
        fsync_path(src)
    fsync_path(src.absolute().parent)
    os.replace(src, dst)
    fsync_path(dst.absolute().parent)


def write_json(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON in ``path``, atomically (:func:`write_text`)."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (a data file's identity in a run's identity)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- metrics
_METRICS_HINT = "fix or delete that line, or " + _START_OVER


def append_metrics(path: Path, record: dict) -> None:
    with Path(path).open("a") as f:
        f.write(json.dumps(record) + "\n")


def _steps_of(path: Path, rows: list) -> list[int]:
    steps = []
    for row in rows:
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise RunLogError(
                f"{path}: a row without an integer step ({json.dumps(row)[:60]}); {_METRICS_HINT}"
            )
        steps.append(step)
    return steps


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the rows of a JSONL run log (``metrics.jsonl``, ``eval.jsonl``) after ``step``: a resumed
    run rewrites them. An interrupted last line is cut off as :func:`dsv32.jsonl.read_log` does; a bad
    complete line raises :class:`RunLogError` naming the file and line."""
    path = Path(path)
    rows = read_log(path, RunLogError, _METRICS_HINT)
    steps = _steps_of(path, rows)
    if any(s > step for s in steps):
        write_text(path, "".join(json.dumps(r) + "\n" for r, s in zip(rows, steps) if s <= step))


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a run log (``[]`` when there is none); an interrupted last line is left out."""
    return read_log(path, RunLogError, _METRICS_HINT, cut=False)


# ---------------------------------------------------------------------------------------------- identity
def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts (and lists of dicts) as ``{"section.field": value}``, as recipes name fields."""
    if isinstance(obj, dict) and obj:
        out = {}
        for k, v in obj.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    if isinstance(obj, list) and obj and all(isinstance(v, dict) for v in obj):
        out = {f"{prefix}len": len(obj)}
        for i, v in enumerate(obj):
            out |= _flat(v, f"{prefix}{i}.")
        return out
    return {prefix[:-1]: obj}


def run_differences(saved: dict, current: dict) -> list[str]:
    """``field saved → current`` for every field where two run identities differ, the shallowest
    fields first (``stage`` before the fields of a section)."""
    a, b = _flat(saved), _flat(json.loads(json.dumps(current)))
    return [
        f"{k} {json.dumps(a.get(k))} → {json.dumps(b.get(k))}"
        for k in sorted(a.keys() | b.keys(), key=lambda k: (k.count("."), k))
        if a.get(k) != b.get(k)
    ]


# ---------------------------------------------------------------------------------------------- checkpoints
def rng_state() -> dict:
    key, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [key, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    key, keys, *rest = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((key, keys.astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _load_blob(path: Path, device) -> Any:
    """``optimizer.pt`` without unpickling code: tensors and plain values only (checkpoints of earlier
    versions kept NumPy's RNG state as an array, whose reconstruction is allowed too)."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as err:
        if "numpy" not in str(err):
            raise
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location=device, weights_only=True)


def step_folder(root: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is published in ``root`` (``checkpoints/``)."""
    return Path(root) / f"step_{step:06d}"


def staging_folder(root: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is published (:func:`stage_checkpoint`)."""
    return Path(root) / f".tmp_step_{step:06d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every published checkpoint in ``root`` (a ``step_NNNNNN`` folder with its
    ``state.json``), oldest first."""
    found = []
    for p in Path(root).glob("step_*"):
        digits = p.name[len("step_") :]
        if digits.isdigit() and (p / "state.json").is_file():
            found.append((int(digits), p))
    return sorted(found)


def stage_checkpoint(root: str | Path, step: int) -> Path:
    """A fresh, empty staging folder for the checkpoint of ``step`` in ``root`` (a leftover of an
    interrupted save of that step is removed): the trainer writes its files there, ``state.json``
    last, then hands it to :func:`publish_checkpoint`."""
    staged = staging_folder(root, step)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def publish_checkpoint(staged: str | Path, step: int, *, keep: int) -> Path:
    """Publish a staged checkpoint folder as ``step_NNNNNN`` beside it (:func:`step_folder`) and
    return that folder. Every file and folder of ``staged`` is synced to disk before the rename and
    the parent folder after it (:func:`durable_replace`; a file system that refuses to sync a
    directory is left to its own guarantees, :func:`fsync_path`). A checkpoint of the same step
    already there (a finished run re-run, an unreadable one redone) is moved aside first and deleted
    once the new one is in place. Then only the newest ``keep`` (at least 1) checkpoints up to
    ``step`` stay: the one just published and any past it are never removed."""
    staged = Path(staged)
    root = staged.parent
    final, aside = step_folder(root, step), root / f".old_step_{step:06d}"
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)  # reaches the disk with the sync of ``root`` before the next rename
    durable_replace(staged, final)
    shutil.rmtree(aside, ignore_errors=True)
    upto = [p for s, p in complete_checkpoints(root) if s <= step]
    for old in upto[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class StepCheckpoints:
    """``out_dir/checkpoints/step_NNNNNN/`` (see the module docstring). ``trainable_only``: save and
    restore only the parameters with ``requires_grad`` (a frozen base is not copied every time);
    ``run``: the run's identity, saved with every checkpoint and compared on resume."""

    def __init__(
        self, out_dir: str | Path, keep: int = 1, trainable_only: bool = False, run: dict | None = None
    ) -> None:
        self.out = Path(out_dir)
        self.root = self.out / "checkpoints"
        self.keep = max(1, keep)
        self.trainable_only = trainable_only
        self.run = run
        self.resumed_from: Path | None = None  # the checkpoint :meth:`begin` loaded

    def complete(self) -> list[tuple[int, Path]]:
        """``(step, folder)`` of every complete checkpoint, oldest first."""
        return complete_checkpoints(self.root)

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1][1] if done else None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, **state) -> Path:
        from safetensors.torch import save_file, save_model

        tmp = stage_checkpoint(self.root, step)
        if self.trainable_only:
            tensors = {
                n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad
            }
            save_file(tensors, str(tmp / "weights.safetensors"))
        else:
            save_model(model, str(tmp / "weights.safetensors"))
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state()}, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, "run": self.run, **state}))
        return publish_checkpoint(tmp, step, keep=self.keep)

    def state(self, path: Path) -> dict:
        file = Path(path) / "state.json"
        state = read_json(file, UnreadableCheckpoint)
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise UnreadableCheckpoint(f"{file}: not a checkpoint state (no integer step)")
        return state

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Restore weights, optimizer and RNG states from ``path``; returns its step. Every file is read
        and checked against the model before anything changes: :class:`UnreadableCheckpoint` for a
        file that cannot be read, :class:`CheckpointError` for tensors that do not fit the model."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        step = int(self.state(path)["step"])
        device = next(model.parameters()).device
        weights, opt_file = path / "weights.safetensors", path / "optimizer.pt"
        try:
            tensors = load_file(str(weights))
        except (SafetensorError, OSError, ValueError) as err:
            raise UnreadableCheckpoint(f"{weights}: unreadable ({err})") from err
        try:
            blob = _load_blob(opt_file, device)
        except Exception as err:  # truncated zip, foreign pickle: torch raises several kinds
            why = " ".join(str(err).split()).split(". ")[0]  # torch adds paragraphs of advice
            raise UnreadableCheckpoint(f"{opt_file}: unreadable ({why})") from err
        if not (isinstance(blob, dict) and {"optimizer", "rng"} <= blob.keys()):
            raise UnreadableCheckpoint(f"{opt_file}: not an optimizer checkpoint (no optimizer/rng state)")
        if self.trainable_only:
            params = {n: p for n, p in model.named_parameters() if p.requires_grad}
            missing = [n for n in params if n not in tensors]
        else:
            params = model.state_dict()
            storages: dict[int, list[str]] = {}
            for n, t in params.items():
                storages.setdefault(t.untyped_storage().data_ptr(), []).append(n)
            missing = [  # a tied weight is saved once, under one of its names
                n
                for n, t in params.items()
                if not any(m in tensors for m in storages[t.untyped_storage().data_ptr()])
            ]
        unexpected = [n for n in tensors if n not in params]
        shapes = [
            f"{n} is {list(t.shape)} in the checkpoint, {list(params[n].shape)} in the model"
            for n, t in tensors.items()
            if n in params and t.shape != params[n].shape
        ]
        if missing or unexpected or shapes:
            what = (
                shapes[0]
                if shapes
                else f"missing {missing[:3]}"
                if missing
                else f"unexpected {unexpected[:3]}"
            )
            raise CheckpointError(f"{weights} does not fit the model ({what}): {_START_OVER}")
        with torch.no_grad():
            for name, tensor in tensors.items():
                params[name].copy_(tensor)
        try:
            optimizer.load_state_dict(blob["optimizer"])
        except (ValueError, KeyError) as err:
            raise CheckpointError(f"{opt_file} does not fit the optimizer ({err}): {_START_OVER}") from err
        set_rng_state(blob["rng"])
        return step

    def begin(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, resume: bool, steps: int) -> int:
        """The step this run starts at. ``resume``: the newest readable checkpoint of this run, loaded
        into ``model`` and ``optimizer`` (0 when there is none; an unreadable newer one is skipped with
        a warning). Raises :class:`CheckpointError`, writing nothing, for a checkpoint of another run
        or one past ``steps``, for no readable checkpoint at all, and for a fresh start over the
        ``model/`` of a run without checkpoints."""
        found = self.complete() if resume else []
        skipped: list[str] = []
        for _, path in reversed(found):
            try:
                state = self.state(path)
                self._check(path, state, steps)
                step = self.load(path, model, optimizer)
            except UnreadableCheckpoint as err:
                skipped.append(str(err))
                continue
            for why in skipped:
                logger.warning("skipping an unreadable checkpoint: %s; resuming from %s", why, path)
            self.resumed_from = path
            return step
        if skipped:
            raise CheckpointError(f"no readable checkpoint: {skipped[0]}; {_START_OVER}")
        if resume and (self.out / "model").exists():
            raise CheckpointError(
                f"{self.out} holds a trained model/ and no checkpoint to resume from: "
                "pass --no-resume to train anew and replace it, or choose another --out"
            )
        return 0

    def _check(self, path: Path, state: dict, steps: int) -> None:
        saved = state.get("run")
        if saved is None:
            logger.warning("%s has no run identity (an earlier dsv32 wrote it): resuming unchecked", path)
        elif self.run is not None and (diff := run_differences(saved, self.run)):
            more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
            raise OtherRunCheckpoint(
                f"{path} belongs to another run ({', '.join(diff[:4])}{more}): {_START_OVER}",
                path,
                saved,
                diff,
            )
        if state["step"] > steps:
            raise CheckpointError(
                f"{path} is at step {state['step']}, past this run's {steps} steps: pass at least "
                f"--steps {state['step']} to continue it, or {_START_OVER}"
            )

    def discard(self, outputs: Iterable[str] = RUN_OUTPUTS) -> None:
        """Remove the previous run in ``out_dir`` before a new one starts: its checkpoints first, then
        ``outputs``; everything is renamed into one hidden folder and then deleted, so a crash in
        between leaves no checkpoint to resume beside the other run's files. Leftovers of such a
        crash are deleted too."""
        for left in self.out.glob(".discarded-*"):
            shutil.rmtree(left, ignore_errors=True)
        present = [p for p in (self.root, *(self.out / n for n in outputs)) if p.exists() or p.is_symlink()]
        if not present:
            return
        trash = self.out / f".discarded-{time.time_ns()}"
        trash.mkdir()
        for p in present:
            p.rename(trash / p.name)
        shutil.rmtree(trash, ignore_errors=True)
