"""``dsv32 view``: one self-contained HTML page (no network, inline CSS and JavaScript) of what a run
left on disk — an episode or a rollout dump, an evaluation run directory, a post-training run
directory — to read in a browser opened from the file.

:func:`render` looks at the path and picks the page:

- a directory with ``samples.jsonl`` (an evaluation run, :mod:`dsv32.eval.runner`): the samples table
  with filters, each row opening its trajectory;
- a directory with ``report.json`` or ``eval_<stage>.json`` (a post-training run): the stages side by
  side per held-out task, the report's figures, the training curves;
- a directory with ``trajectories/`` (``dsv32 envs run --out``) or ``trajectory.json``
  (``dsv32 agent run``): its episodes;
- a ``.json`` file (a trajectory, a conversation, a sample, an ``eval_<stage>.json``) or a ``.jsonl``
  file (evaluation samples, or one episode a line).

It imports only the leaf modules: the formats it reads are JSON on disk, not the classes that wrote
them.
"""

from __future__ import annotations

from pathlib import Path

from dsv32.view.errors import ViewError
from dsv32.view.page import page
from dsv32.view.runs import envs_run_dir, eval_dir, jsonl_file, posttrain_dir, trajectory_file

__all__ = ["ViewError", "render", "write_view"]


def render(path: str | Path) -> str:
    """The HTML page of ``path`` (see the module docstring for what it may be)."""
    path = Path(path)
    if path.is_dir():
        if (path / "samples.jsonl").is_file():
            parts = eval_dir(path)
        elif (path / "report.json").is_file() or any(path.glob("eval_*.json")):
            parts = posttrain_dir(path)
        elif (path / "trajectories").is_dir():
            parts = envs_run_dir(path)
        elif (path / "trajectory.json").is_file():
            parts = trajectory_file(path / "trajectory.json")
        else:
            raise ViewError(
                f"{path}: not a run directory dsv32 view knows: an evaluation run (samples.jsonl), a "
                "post-training run (report.json, eval_<stage>.json), a dsv32 envs run (trajectories/) or "
                "a dsv32 agent run (trajectory.json)"
            )
    elif path.is_file():
        if path.suffix == ".jsonl":
            parts = jsonl_file(path)
        elif path.suffix == ".json":
            parts = trajectory_file(path)
        else:
            raise ViewError(f"{path}: a .json or .jsonl file, or a run directory, is what dsv32 view shows")
    else:
        raise ViewError(f"{path}: no such file or directory")
    return page(*parts)


def write_view(path: str | Path, out: str | Path) -> Path:
    """Render ``path`` and write the page to ``out`` (its folder is made)."""
    html = render(path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out
