"""The "NO ISOLATION" warning is logged when rlimits is the fallback, not when it is asked for."""

import logging

from dsv32.envs import sandbox
from dsv32.envs.sandbox import launch


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "NO ISOLATION" in r.getMessage()
    ]


def test_rlimits_asked_for_logs_no_warning(caplog, monkeypatch):
    launch._warn_once.cache_clear()
    monkeypatch.delenv("DSV32_SANDBOX", raising=False)
    with caplog.at_level(logging.WARNING, logger=launch.log.name):
        assert sandbox.isolation("rlimits").kind == "rlimits"
    assert _warnings(caplog) == []


def test_rlimits_as_the_fallback_logs_the_warning(caplog, monkeypatch):
    launch._warn_once.cache_clear()
    monkeypatch.delenv("DSV32_SANDBOX", raising=False)
    monkeypatch.setattr(launch, "_works", lambda kind: kind == "rlimits")
    with caplog.at_level(logging.WARNING, logger=launch.log.name):
        assert sandbox.isolation().kind == "rlimits"
    assert len(_warnings(caplog)) == 1
    launch._warn_once.cache_clear()
