"""A general-tool task bundle: one directory another tool can write (a task synthesizer, a user).

    BUNDLE/
      task.json    {"id", "prompt", "category", "difficulty",
                    "reference": {"calls": [{"name", "arguments"}...], "answer": "..."}}
      db.sqlite    the initial database (never modified: each episode works on a copy)
      tools.json   the tools' OpenAI function schemas (read by the host; the code is never imported there)
      tools.py     one function per tool: ``def NAME(db: sqlite3.Connection, **arguments)`` returning
                   JSON-serializable data; raising is an error the model reads
      verify.py    ``def verify(initial_db, final_db, answer) -> bool`` (read-only connections, the
                   final answer text); ``assert cond, "why"`` inside it gives the reward's reason

Everything in ``tools.py`` and ``verify.py`` runs in the sandbox (see :mod:`.runner`), one process
per call. ``reference`` is the solution the ``reference`` backend plays and the golden tests check.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from dsv32.envs.base import EnvError

SOURCES = Path(__file__).with_name("sources")
FILES = ("task.json", "db.sqlite", "tools.json", "tools.py", "verify.py")


@dataclass
class Bundle:
    path: Path
    task: dict
    tools: list[dict]

    @property
    def db(self) -> Path:
        return self.path / "db.sqlite"


def load_bundle(path: str | Path) -> Bundle:
    """Check a bundle's layout and read its task and tool schemas."""
    path = Path(path).resolve()
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise EnvError(
            f"task bundle {path}: missing {', '.join(missing)} (a bundle holds {', '.join(FILES)})"
        )
    task = json.loads((path / "task.json").read_text(encoding="utf-8"))
    tools = json.loads((path / "tools.json").read_text(encoding="utf-8"))
    if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
        raise EnvError(f"task bundle {path}: task.json needs a 'prompt' string")
    if not isinstance(tools, list) or not all(t.get("function", {}).get("name") for t in tools):
        raise EnvError(f"task bundle {path}: tools.json must be a list of OpenAI function schemas")
    return Bundle(path, task, tools)


def write_bundle(
    path: str | Path,
    *,
    task: dict,
    tables: dict[str, tuple[str, list[tuple]]],
    tools_schema: list[dict],
    tools_source: str,
    verify_source: str,
) -> Bundle:
    """Write a bundle: ``tables`` maps a table name to ``(column definitions, rows)``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    db_path = path / "db.sqlite"
    db_path.unlink(missing_ok=True)
    with sqlite3.connect(db_path) as db:
        for name, (columns, rows) in tables.items():
            db.execute(f"CREATE TABLE {name} ({columns})")
            if rows:
                marks = ", ".join("?" * len(rows[0]))
                db.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    db.close()
    (path / "task.json").write_text(json.dumps(task, indent=1, ensure_ascii=False), encoding="utf-8")
    (path / "tools.json").write_text(json.dumps(tools_schema, indent=1), encoding="utf-8")
    (path / "tools.py").write_text(tools_source, encoding="utf-8")
    (path / "verify.py").write_text(verify_source, encoding="utf-8")
    return load_bundle(path)


def with_params(source: str, params: dict) -> str:
    """A verifier's source with the task's parameters bound as ``PARAMS`` at the top."""
    return f"import json\n\nPARAMS = json.loads({json.dumps(params)!r})\n\n{source}"


def write_generated(
    path: str | Path, *, task: dict, tables: dict, tools_schema: list[dict], params: dict
) -> Bundle:
    """Write a generator's bundle: its tools and verifier are ``sources/CATEGORY_tools.py`` and
    ``sources/CATEGORY_verify.py`` (``task["category"]``), the verifier with ``params`` bound."""
    category = task["category"]
    return write_bundle(
        path,
        task=task,
        tables=tables,
        tools_schema=tools_schema,
        tools_source=(SOURCES / f"{category}_tools.py").read_text(encoding="utf-8"),
        verify_source=with_params((SOURCES / f"{category}_verify.py").read_text(encoding="utf-8"), params),
    )
