"""What the stages of every proof run share (the agentic proof's :class:`~dsv32.posttrain.pipeline.ProofRun`
and the transfer run's :class:`~dsv32.posttrain.transfer.TransferRun`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class StagedRun:
    """What the stages of every proof run share: the minutes each took (``details.stage_minutes`` of
    the report) and the JSON files they write under the run's root. A subclass holds ``recipe``
    (with its ``root``) and ``minutes``."""

    recipe: Any
    minutes: dict[str, float]

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Record the minutes the block took as ``stage``."""
        t = time.time()
        yield
        self.minutes[stage] = round((time.time() - t) / 60, 2)

    def write_json(self, name: str, data: dict) -> None:
        path = self.recipe.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
