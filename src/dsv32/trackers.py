"""Experiment trackers: a run's ``metrics.jsonl`` mirrored into TensorBoard, Weights & Biases, MLflow
or trackio, offline, under ``<out_dir>/trackers/<name>/``.

``metrics.jsonl`` stays the record. Every trainer writes each row through one hook,
:meth:`Trackers.append`, which appends the row to its JSONL file and then logs exactly the row's numeric
scalars (:func:`scalars`: nested tables flattened as ``a/b``; lists, strings, booleans and None left
out) at the row's ``step`` to every tracker the recipe's ``report_to`` names. The run's config is
logged once, when the trackers open.

- ``tensorboard``: event files in ``trackers/tensorboard/`` (``torch.utils.tensorboard``); a resumed
  run purges the steps after its checkpoint, so the curve has no doubled tail.
- ``wandb``: an offline run (``WANDB_MODE``, default ``offline``) in ``trackers/wandb/``;
  ``wandb sync`` uploads it later.
- ``mlflow``: the file store ``file:<out>/trackers/mlflow`` (unless ``MLFLOW_TRACKING_URI`` names
  another), experiment ``dsv32``; the config as ``config.json`` and as parameters.
- ``trackio``: trackio's local store (``TRACKIO_DIR``) in ``trackers/trackio/``, project ``dsv32``.

Each package is imported only when its tracker opens; :func:`require` checks that the named ones are
installed before a model loads and raises :class:`TrackerError` naming the pip extra. Only the main
process of a ``torchrun`` launch opens trackers (``main=``). This module imports only leaf modules,
so every trainer may use it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from dsv32.errors import DSV32Error
from dsv32.recipe import Rule
from dsv32.runlog import append_metrics

logger = logging.getLogger(__name__)

#: The trackers, each with the module it needs and the pip extra that installs it.
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
}
NONE = "none"
#: Where a run's trackers write, under its output directory (one folder per tracker).
TRACKERS_DIR = "trackers"
PROJECT = "dsv32"


class TrackerError(DSV32Error, ValueError):
    """A ``report_to`` that names an unknown tracker, or one whose package is not installed."""


# ---------------------------------------------------------------------------------------------- names
def _problem(value: Any) -> str | None:
    """Why ``value`` is not a ``report_to``, or None when it is one."""
    if not isinstance(value, str):
        return "it is not a string"
    names = [n.strip() for n in value.split(",")]
    if any(not n for n in names):
        return "an empty name in the list"
    unknown = [n for n in names if n != NONE and n not in TRACKERS]
    if unknown:
        return f"unknown {', '.join(repr(n) for n in unknown)}"
    if NONE in names and len(names) > 1:
        return f"{NONE!r} cannot be combined with a tracker"
    if len(set(names)) < len(names):
        return "a tracker named twice"
    return None


ALLOWED = f"{NONE!r} or a comma-separated list of {', '.join(repr(n) for n in TRACKERS)}"

#: The recipes' rule for their top-level ``report_to`` (:mod:`dsv32.recipe`).
REPORT_TO = Rule(lambda v: _problem(v) is None, ALLOWED, why=lambda v: _problem(v) or "")


def parse_report_to(value: str) -> tuple[str, ...]:
    """``"tensorboard, wandb"`` → ``("tensorboard", "wandb")``; ``"none"`` → ``()``."""
    problem = _problem(value)
    if problem is not None:
        raise TrackerError(f"report_to = {value!r}: must be {ALLOWED} ({problem})")
    return tuple(n.strip() for n in value.split(",") if n.strip() != NONE)


def require(report_to: str) -> tuple[str, ...]:
    """The trackers ``report_to`` names, each checked to be importable (nothing is imported):
    call it before a model loads, so a missing package stops the run at once."""
    names = parse_report_to(report_to)
    missing = [n for n in names if importlib.util.find_spec(TRACKERS[n][0]) is None]
    if missing:
        extras = ",".join(TRACKERS[n][1] for n in missing)
        raise TrackerError(
            f"report_to = {report_to!r}: {', '.join(missing)} not installed; "
            f"pip install 'dsv32[{extras}]' (or 'dsv32[trackers]' for all), or drop it from report_to"
        )
    return names


# ---------------------------------------------------------------------------------------------- rows
def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """The numeric scalars of a metrics row, each name after ``prefix``, nested tables flattened as
    ``a/b``; the row's ``step`` (the x-axis), lists, strings, booleans and None are left out."""
    return _numbers({k: v for k, v in record.items() if k != "step"}, prefix)


def _numbers(table: dict, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= _numbers(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def _flat_config(config: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= _flat_config(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---------------------------------------------------------------------------------------------- trackers
class Tracker(Protocol):
    """One experiment tracker of a run."""

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_config(self, config: dict) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Event files in ``folder``; ``purge_step``: a resumed run's first new step (TensorBoard drops the
    events of the earlier launch from there on)."""

    def __init__(self, folder: Path, name: str, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), purge_step=purge_step, comment=name)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_config(self, config: dict) -> None:
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """An offline W&B run (``WANDB_MODE`` may say otherwise) whose files are in ``folder``."""

    def __init__(self, folder: Path, name: str) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=name,
            dir=str(folder),
            mode=os.environ.get("WANDB_MODE") or "offline",
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)

    def close(self) -> None:
        import wandb

        self.run.finish()
        if wandb.run is None:  # no other run in this process: wait until the service has written the files
            wandb.teardown()


class MLflowTracker:
    """An MLflow run of experiment ``dsv32`` in the file store in ``folder`` (``MLFLOW_TRACKING_URI``
    may name another store)."""

    def __init__(self, folder: Path, name: str) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or folder.absolute().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store behind this switch; an offline run needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(PROJECT)
        eid = experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
        self.run_id = self.client.create_run(eid, run_name=name).info.run_id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_config(self, config: dict) -> None:
        from mlflow.entities import Param

        self.client.log_dict(self.run_id, config, "config.json")
        params = [
            Param(_param_key(k), json.dumps(v, default=str)[:6000]) for k, v in _flat_config(config).items()
        ]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _param_key(key: str) -> str:
    """An MLflow parameter name (letters, digits, ``_ - . / `` and space only)."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


class TrackioTracker:
    """A trackio run of project ``dsv32`` in the local store ``folder``."""

    def __init__(self, folder: Path, name: str) -> None:
        _point_trackio_at(folder)
        import trackio

        with _quiet():
            self.run = trackio.init(
                project=PROJECT, name=name, embed=False, auto_log_gpu=False, auto_log_cpu=False
            )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config)

    def close(self) -> None:
        from trackio import context_vars

        with _quiet():
            self.run.finish()
        if context_vars.current_run.get() is self.run:  # else trackio finishes it again at exit
            context_vars.current_run.set(None)


def _point_trackio_at(folder: Path) -> None:
    """trackio reads ``TRACKIO_DIR`` once, when it is imported, into module constants: set the
    variable for a first import, and move the constants of an earlier import to ``folder``."""
    os.environ["TRACKIO_DIR"] = str(folder.absolute())
    utils = sys.modules.get("trackio.utils")
    if utils is None:
        return
    old = utils.TRACKIO_DIR
    new = {"TRACKIO_DIR": folder.absolute()}
    new |= {"MEDIA_DIR": new["TRACKIO_DIR"] / "media", "ARTIFACTS_DIR": new["TRACKIO_DIR"] / "artifacts"}
    before = {"TRACKIO_DIR": old, "MEDIA_DIR": old / "media", "ARTIFACTS_DIR": old / "artifacts"}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "trackio" or name.startswith("trackio.")):
            continue
        for attr, value in new.items():
            if getattr(module, attr, None) == before[attr]:
                setattr(module, attr, value)


@contextlib.contextmanager
def _quiet():
    """What a tracker prints to stdout (its banners) goes to the log instead."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield
    for line in buffer.getvalue().splitlines():
        if line.strip():
            logger.info("%s", line.strip())


_CLASSES = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MLflowTracker,
    "trackio": TrackioTracker,
}


# ---------------------------------------------------------------------------------------------- a run's
class Trackers:
    """The trackers of one run (none for ``report_to = "none"`` or a process other than the main
    one). :meth:`append` is the hook every trainer writes its metrics rows through."""

    def __init__(self, trackers: dict[str, Tracker] | None = None) -> None:
        self.trackers = dict(trackers or {})

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, path: str | Path, record: dict, prefix: str = "") -> None:
        """Append ``record`` to the JSONL log ``path``, then log its scalars (:func:`scalars`, each
        name after ``prefix``) at its ``step`` to every tracker."""
        append_metrics(Path(path), record)
        self.log_record(record, prefix)

    def log_record(self, record: dict, prefix: str = "") -> None:
        if not self.trackers:
            return
        values = scalars(record, prefix)
        for tracker in self.trackers.values():
            tracker.log(int(record["step"]), values)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, {}
        for tracker in trackers.values():
            tracker.close()


def open_trackers(
    report_to: str,
    out_dir: str | Path,
    *,
    config: dict,
    name: str,
    main: bool = True,
    resumed_step: int = 0,
) -> Trackers:
    """The trackers ``report_to`` names, each writing under ``out_dir/trackers/<tracker>/``, with
    ``config`` logged once; ``name``: the run's name in each tracker; ``main``: False in the other
    processes of a ``torchrun`` launch (they get no trackers); ``resumed_step``: the checkpoint step
    a resumed run continues from. Open it after the run's checks and its start-over discard."""
    names = require(report_to)
    if not main or not names:
        return Trackers()
    root = Path(out_dir) / TRACKERS_DIR
    opened: dict[str, Tracker] = {}
    try:
        for tracker in names:
            folder = root / tracker
            folder.mkdir(parents=True, exist_ok=True)
            if tracker == "tensorboard":
                opened[tracker] = TensorBoardTracker(folder, name, resumed_step + 1 if resumed_step else None)
            else:
                opened[tracker] = _CLASSES[tracker](folder, name)
            opened[tracker].log_config(json.loads(json.dumps(config, default=str)))
    except BaseException:
        Trackers(opened).close()
        raise
    logger.info("trackers %s → %s", ", ".join(names), root)
    return Trackers(opened)
