"""Reading what each experiment tracker wrote back through the tracker's own format, and comparing it
with the run's ``metrics.jsonl`` (:mod:`dsv32.trackers`)."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path

import pytest

from dsv32.runlog import read_metrics
from dsv32.trackers import TRACKERS, scalars

Series = dict[str, dict[int, float]]  # name → step → value


def installed(name: str) -> bool:
    return importlib.util.find_spec(TRACKERS[name][0]) is not None


def skip_unless_installed(name: str) -> None:
    if not installed(name):
        pytest.skip(f"{name} is not installed (pip install 'dsv32[{TRACKERS[name][1]}]')")


def expected(out: Path, logs: dict[str, str] | None = None) -> Series:
    """The numeric scalars of every row of ``out``'s JSONL logs (``{"metrics.jsonl": ""}`` by default;
    the value is the prefix their names are logged under)."""
    series: Series = {}
    for name, prefix in (logs or {"metrics.jsonl": ""}).items():
        for row in read_metrics(out / name):
            for key, value in scalars(row, prefix).items():
                series.setdefault(key, {})[row["step"]] = value
    return series


def tensorboard(folder: Path) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tensorboard_text(folder: Path, tag: str) -> list[str]:
    """The texts logged under ``tag``, one per launch of the run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return [event.tensor_proto.string_val[0].decode() for event in acc.Tensors(f"{tag}/text_summary")]


def mlflow(folder: Path) -> tuple[Series, dict, dict]:
    """The metrics of the one run in the file store, its config artifact and its parameters."""
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=folder.absolute().as_uri())
    experiment = client.get_experiment_by_name("dsv32")
    (run,) = client.search_runs([experiment.experiment_id])
    series = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in run.data.metrics
    }
    config = json.loads(Path(client.download_artifacts(run.info.run_id, "config.json")).read_text())
    return series, config, run.data.params


def _leveldb_records(path: Path):
    """The records of a W&B transaction log (``run-<id>.wandb``): a 7-byte header (``:W&B``, magic
    0xBEE1, version 0), then LevelDB log records in 32 KiB blocks — 4-byte CRC-32C, 2-byte length,
    1-byte type (1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), path
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield payload
        elif kind == 2:
            pending = payload
        elif kind == 3:
            pending += payload
        elif kind == 4:
            yield pending + payload
            pending = b""


def wandb(folder: Path) -> tuple[Series, dict]:
    """The history and the config of the one offline run in ``folder``, read from its ``.wandb``
    transaction log with W&B's own protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    series: Series = {}
    config: dict = {}
    for payload in _leveldb_records(log):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = int(items.pop("_step", record.history.step.num))
            for key, value in items.items():
                if not key.startswith("_"):
                    series.setdefault(key, {})[step] = value
        elif kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return series, config


def trackio(folder: Path) -> tuple[Series, dict]:
    """The logs of the one run of project ``dsv32`` in the trackio store ``folder`` and its config,
    read with trackio's own storage (pointed at ``folder`` as the tracker points it)."""
    from dsv32.trackers import _point_trackio_at

    _point_trackio_at(folder)
    from trackio.sqlite_storage import SQLiteStorage

    (run,) = SQLiteStorage.get_runs("dsv32")
    series: Series = {}
    for row in SQLiteStorage.get_logs("dsv32", run):
        step = row.pop("step")
        for key, value in row.items():
            if key != "timestamp" and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, {})[step] = value
    config = SQLiteStorage.get_run_config("dsv32", run) or {}
    return series, config


def assert_same(logged: Series, want: Series, rel: float = 0.0) -> None:
    """Every scalar of ``want`` logged at its step, nothing else (``rel``: TensorBoard's float32)."""
    assert set(logged) == set(want), (sorted(set(logged) ^ set(want)), "names differ")
    for key, steps in want.items():
        assert set(logged[key]) == set(steps), (key, sorted(logged[key]), sorted(steps))
        for step, value in steps.items():
            got = logged[key][step]
            if math.isnan(value):
                assert math.isnan(got), (key, step, got)
            elif math.isinf(value) or rel == 0.0:
                assert got == value, (key, step, got, value)
            else:
                assert math.isclose(got, value, rel_tol=rel, abs_tol=1e-30), (key, step, got, value)
