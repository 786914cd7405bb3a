"""The search environment: ``search(query, k)`` (BM25) and ``open(doc_id, page)`` (paged text) over
a local corpus; the reward is 1 when the final answer matches the task's answer under the rule of
:mod:`dsv32.envs.search.answers`, else 0.

The default corpus is the standard library of the running Python (one document per module, class,
function and method); ``SearchEnv(corpus="docs.jsonl")`` searches any JSONL corpus of
``{"id", "title", "text"}`` rows instead. Indexes are built once per corpus and shared by every
episode of the process.
"""

from __future__ import annotations

import threading
from pathlib import Path

from dsv32.envs.base import EnvError, Environment, Reward, Task, TrajectoryLike, tool_call, tool_schema
from dsv32.envs.search.answers import extract, matches
from dsv32.envs.search.corpus import PAGE_CHARS, load_corpus, pages, stdlib_corpus_path
from dsv32.envs.search.index import Index

MAX_K = 20
SNIPPET_CHARS = 240

SYSTEM = (
    "You answer questions by searching a local documentation corpus{what}. Tools: `search(query, k)` "
    "returns the ids, titles and snippets of the k best-matching documents; `open(doc_id, page)` returns "
    "one page of a document ({chars} characters a page, pages start at 1). Search, open the documents "
    "you need, and check the fact in the text before answering. End your reply with one line "
    "`Answer: <answer>` holding only the answer."
)

_LOCK = threading.Lock()
_INDEXES: dict[str, Index] = {}


def shared_index(corpus: str | Path | None = None) -> Index:
    """The index of ``corpus`` (a JSONL path; None: the standard library), built once per process;
    the default corpus's index is also cached on disk next to it."""
    path = Path(corpus) if corpus is not None else stdlib_corpus_path()
    key = str(path.resolve())
    with _LOCK:
        if key not in _INDEXES:
            cache = path.parent if corpus is None else None
            _INDEXES[key] = Index(load_corpus(path), cache=cache)
        return _INDEXES[key]


class SearchEnv(Environment):
    name = "search"
    description = "BM25 search and paged reading over a local corpus (default: the Python standard library)"

    def __init__(self, corpus: str | Path | None = None, page_chars: int = PAGE_CHARS) -> None:
        self.corpus = corpus
        self.page_chars = page_chars
        self.index = shared_index(corpus)
        self.task: Task | None = None
        self.log: list[dict] = []

    def reset(self, task: Task) -> list[dict]:
        if task.answer is None:
            raise EnvError(f"search task {task.id!r} has no answer; a search task needs one to be verified")
        self.task, self.log = task, []
        what = " (the Python standard library's documentation)" if self.corpus is None else ""
        return [
            {"role": "system", "content": SYSTEM.format(what=what, chars=self.page_chars)},
            {"role": "user", "content": task.prompt},
        ]

    def tools(self) -> list[dict]:
        return [
            tool_schema(
                "search",
                "BM25 search over the corpus; returns the best k documents (id, title, number of pages, snippet).",
                {
                    "query": {"type": "string", "description": "keywords, e.g. a function's dotted name"},
                    "k": {"type": "integer", "description": f"how many results, 1 to {MAX_K} (default 5)"},
                },
                required=["query"],
            ),
            tool_schema(
                "open",
                "Read one page of a document by its id (from search results).",
                {
                    "doc_id": {"type": "string", "description": "a document id from search results"},
                    "page": {"type": "integer", "description": "page number, starting at 1 (default 1)"},
                },
                required=["doc_id"],
            ),
        ]

    def call(self, name: str, arguments: dict) -> str:
        # The corpus needs no episode: the synthesis agents search it before there is a task.
        if name in ("search", "open") and not isinstance(arguments, dict):
            out = f"error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}"
        elif name == "search":
            out = self._search(arguments)
        elif name == "open":
            out = self._open(arguments)
        else:
            out = f"error: unknown tool {name!r}; the tools are search and open"
        self.log.append({"tool": name, "arguments": arguments, "error": out.startswith("error:")})
        return out

    def _search(self, args: dict) -> str:
        query, k = args.get("query"), args.get("k", 5)
        if not isinstance(query, str) or not query.strip():
            return "error: search needs a non-empty string 'query'"
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            return f"error: 'k' must be an integer from 1 to {MAX_K}"
        hits = self.index.search(query, k)
        if not hits:
            return f"no results for {query!r}; try other keywords"
        lines = []
        for r, hit in enumerate(hits, 1):
            snippet = " ".join(hit.doc.text.split())[:SNIPPET_CHARS]
            n = len(pages(hit.doc.text, self.page_chars))
            lines.append(f"[{r}] id: {hit.doc.id} | title: {hit.doc.title} | pages: {n}\n    {snippet}")
        return "\n".join(lines)

    def _open(self, args: dict) -> str:
        doc_id, page = args.get("doc_id"), args.get("page", 1)
        if not isinstance(doc_id, str):
            return "error: open needs a string 'doc_id' from search results"
        doc = self.index.by_id.get(doc_id)
        if doc is None:
            return f"error: no document with id {doc_id!r}; use an id from search results"
        parts = pages(doc.text, self.page_chars)
        if not isinstance(page, int) or isinstance(page, bool) or not 1 <= page <= len(parts):
            return f"error: 'page' must be an integer from 1 to {len(parts)} for {doc_id!r}"
        return f"{doc.title} (id: {doc.id}, page {page} of {len(parts)})\n\n{parts[page - 1]}"

    def reward(self, trajectory: TrajectoryLike) -> Reward:
        if self.task is None:
            raise EnvError("reward() before reset(): start an episode with env.reset(task)")
        gold = str(self.task.answer)
        final = trajectory.final
        if final is None:
            return Reward(0.0, {"correct": 0.0, "answered": 0.0}, "no final answer")
        ok = matches(final, gold)
        got = extract(final)
        reason = f"answer {got!r} {'matches' if ok else 'does not match'} {gold!r}"
        return Reward(float(ok), {"correct": float(ok), "answered": 1.0}, reason)

    def reference(self, task: Task) -> list[dict]:
        if task.answer is None:
            raise EnvError(f"search task {task.id!r} has no answer, so it has no reference solution")
        messages, n = [], 0
        for step in task.info.get("reference", []):
            for name, args in (("search", {"query": step["query"], "k": 5}), ("open", self._open_args(step))):
                n += 1
                call = tool_call(name, args, f"ref-{n}")
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "assistant", "content": f"Answer: {task.answer}"})
        return messages

    def state(self) -> dict:
        return {
            "task": self.task.id if self.task else None,
            "searches": sum(1 for e in self.log if e["tool"] == "search"),
            "opened": [
                e["arguments"].get("doc_id") for e in self.log if e["tool"] == "open" and not e["error"]
            ],
            "errors": sum(1 for e in self.log if e["error"]),
        }

    def _open_args(self, step: dict) -> dict:
        """``open`` arguments for a reference step: the page (at this env's page size) that holds
        the step's evidence text."""
        doc = self.index.by_id.get(step["doc_id"])
        if doc is None:
            raise EnvError(f"reference document {step['doc_id']!r} is not in this corpus")
        parts = pages(doc.text, self.page_chars)
        found = [n for n, text in enumerate(parts, 1) if step.get("evidence", "") in text]
        return {"doc_id": doc.id, "page": found[0] if found else 1}
