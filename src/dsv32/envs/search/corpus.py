"""Search corpora: JSONL rows ``{"id", "title", "text"}`` (extra fields kept as metadata), the
default standard-library corpus cached per Python version, and paging of a document's text.

A page is at most ``PAGE_CHARS`` characters, cut at line ends (a single longer line is cut hard), so
``open(doc_id, page)`` returns the same page for the same document every time.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dsv32.envs.base import EnvError
from dsv32.jsonl import read_jsonl
from dsv32.paths import cache_dir

PAGE_CHARS = 2000
CORPUS_VERSION = "1"  # part of the cache key: bump it when stdlib_docs writes different documents


class CorpusError(EnvError):
    """A corpus file that is missing, malformed or has duplicate ids."""


@dataclass(frozen=True)
class Doc:
    """One searchable document."""

    id: str
    title: str
    text: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


def load_corpus(path: str | Path) -> list[Doc]:
    """Documents from a JSONL file of ``{"id", "title", "text", ...}`` rows; errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist; pass a JSONL file of id/title/text rows")
    docs, seen = [], set()
    for n, row in read_jsonl(path, CorpusError):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("id", "title", "text")):
            raise CorpusError(f"{path}:{n}: a corpus row needs string fields id, title and text")
        if row["id"] in seen:
            raise CorpusError(f"{path}:{n}: duplicate document id {row['id']!r}")
        seen.add(row["id"])
        meta = {k: v for k, v in row.items() if k not in ("id", "title", "text")}
        docs.append(Doc(row["id"], row["title"], row["text"], meta))
    if not docs:
        raise CorpusError(f"{path}: the corpus is empty")
    return docs


def python_tag() -> str:
    """The cache key of the standard-library corpus: this interpreter's full version."""
    return "py" + ".".join(map(str, sys.version_info[:3]))


def stdlib_cache() -> Path:
    """The folder of this Python's standard-library corpus, its index and its generated tasks."""
    return cache_dir("search", f"{python_tag()}-v{CORPUS_VERSION}")


def stdlib_corpus_path() -> Path:
    """The standard-library corpus of this Python as a JSONL file, built on first use (a child
    process imports every public module: ~1–2 s) and cached under ``cache_dir("search")``."""
    path = stdlib_cache() / "corpus.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "dsv32.envs.search.stdlib_docs", str(path)],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0 or not path.is_file():
            raise CorpusError(f"building the standard-library corpus failed: {done.stderr.strip()[-2000:]}")
    return path


def pages(text: str, size: int = PAGE_CHARS) -> list[str]:
    """``text`` split into pages of at most ``size`` characters, at line ends where possible."""
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > size:
            if cur:
                out.append(cur)
                cur = ""
            out.append(line[:size])
            line = line[size:]
        if len(cur) + len(line) > size:
            out.append(cur)
            cur = ""
        cur += line
    if cur or not out:
        out.append(cur)
    return out
