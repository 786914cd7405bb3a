"""What several RL tests share: a recipe whose one task source is a JSONL file they write."""

from __future__ import annotations

import json

from dsv32.rl.grpo.config import load_rl_config


def jsonl_recipe(tmp_path, rows: list[dict], sets: list[str], *, name: str = "toy", domain: str = "toy"):
    """An RL recipe (``sets``: dotted overrides; ``out_dir`` is ``tmp_path/run``) whose task source is
    ``tmp_path/<name>.jsonl`` holding ``rows`` (task ids are ``<name>-<line>``), of domain ``domain``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_rl_config(None, [f"out_dir={tmp_path / 'run'}", *sets])
    cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", str(path), domain
    return cfg
