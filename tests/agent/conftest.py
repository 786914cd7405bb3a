"""The agent tests import their shared helpers (scripted replies, a counting backend) by name; ``stub``
is a stub Chat Completions server, closed after the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import Stub


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()
