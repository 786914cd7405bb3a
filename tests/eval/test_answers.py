"""Reading answers leaves the user's logging configuration as it was."""

from __future__ import annotations

import logging
import threading

import pytest

from dsv32.eval.answers import math_equal

LOGGERS = ("", "math_verify", "math_verify.parser", "math_verify.grader", "sympy", "latex2sympy2_extended")


@pytest.fixture
def user_logging():
    """A user's logging setup: levels of their choosing on the libraries the checks use."""
    chosen = {name: level for name, level in zip(LOGGERS, (logging.INFO, logging.DEBUG, 5, 7, 9, 11))}
    before = {name: logging.getLogger(name).level for name in LOGGERS}
    for name, level in chosen.items():
        logging.getLogger(name).setLevel(level)
    yield chosen
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def _state():
    return {
        name: (
            logging.getLogger(name).level,
            list(logging.getLogger(name).handlers),
            logging.getLogger(name).disabled,
        )
        for name in LOGGERS
    }


def test_math_equal_keeps_the_users_logging_config(user_logging):
    before = _state()
    assert math_equal("\\frac{3}{4}", "0.75") and not math_equal("1/2", "0.75")  # in this (main) thread
    results = []
    worker = threading.Thread(target=lambda: results.append(math_equal("2", "\\sqrt{4}")))
    worker.start()
    worker.join(timeout=120)
    assert results == [True]  # in a scoring thread: the bounded worker process
    assert _state() == before
    assert {name: logging.getLogger(name).level for name in LOGGERS} == user_logging
