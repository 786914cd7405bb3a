"""The agent tests import their shared helpers (scripted replies, a counting backend) by name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
