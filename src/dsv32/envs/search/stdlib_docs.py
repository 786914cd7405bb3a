"""The default search corpus: one document per public standard-library module, class, function and
method of the running Python, written from ``inspect`` (signature, docstring, defining module).

It imports every public standard-library module, so it runs in a child process
(``python -m dsv32.envs.search.stdlib_docs OUT.jsonl``, see :func:`dsv32.envs.search.corpus.stdlib_corpus_path`)
and never inside the caller. Each JSONL row is ``{"id", "title", "text", "kind", "module",
"params"}``: ``id`` is the dotted name (``json.dumps``, ``collections.OrderedDict.move_to_end``),
``params`` the signature's parameters with the ``repr`` of their defaults (what the question
generator asks about). Iteration is sorted, so one Python version always gives the same corpus.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import warnings
from pathlib import Path

# Modules with side effects on import (a browser, printed text, a GUI), test suites, and tooling
# whose import fails or is deprecated noise; everything else public in sys.stdlib_module_names is kept.
SKIP = {
    "antigravity", "this", "idlelib", "turtledemo", "turtle", "tkinter", "test", "lib2to3", "ensurepip",
    "pydoc_data", "__main__", "__future__", "xxsubtype", "xxlimited", "xxlimited_35", "msilib", "winreg",
    "winsound", "msvcrt", "nt", "_winapi", "sre_compile", "sre_constants", "sre_parse", "distutils",
}  # fmt: skip
MAX_DOC_CHARS = 6000
MAX_MEMBERS_LISTED = 60


def module_names() -> list[str]:
    """Public standard-library modules and their public submodules, sorted."""
    names = set()
    for top in sorted(sys.stdlib_module_names):
        if top.startswith("_") or top in SKIP:
            continue
        mod = _import(top)
        if mod is None:
            continue
        names.add(top)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []) or [], prefix=f"{top}."):
            parts = info.name.split(".")
            if any(p.startswith("_") or p in SKIP or p in ("tests", "test") for p in parts):
                continue
            if _import(info.name) is not None:
                names.add(info.name)
    return sorted(names)


def _import(name: str):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except Exception:  # an optional C extension or OS-specific module missing here: not in the corpus
            return None


def _signature(obj) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError, AttributeError, NameError, SyntaxError):  # C functions' text signatures
        return None


def _params(sig: inspect.Signature | None) -> dict[str, str]:
    if sig is None:
        return {}
    return {
        name: repr(p.default)
        for name, p in sig.parameters.items()
        if p.default is not inspect.Parameter.empty and not name.startswith("_")
    }


def _doc(obj) -> str:
    return (inspect.getdoc(obj) or "").strip()[:MAX_DOC_CHARS]


def _first_line(obj) -> str:
    return _doc(obj).split("\n", 1)[0][:160]


def _row(doc_id: str, kind: str, module: str, obj, extra: str = "") -> dict:
    sig = _signature(obj) if kind != "module" else None
    head = [doc_id, f"Kind: {kind}", f"Defined in module: {module}"]
    if sig is not None:
        head.append(f"Signature: {doc_id}{sig}")
    defaults = _params(sig)
    if defaults:
        head.append("Defaults: " + ", ".join(f"{k}={v}" for k, v in defaults.items()))
    text = "\n".join(head) + "\n\n" + (_doc(obj) or "(no documentation)") + (f"\n\n{extra}" if extra else "")
    return {"id": doc_id, "title": doc_id, "text": text, "kind": kind, "module": module, "params": defaults}


def _members(mod) -> list[tuple[str, object]]:
    """The public classes and functions a module defines, and those it re-exports from a private
    accelerator module (``bisect.bisect_left`` lives in ``_bisect``)."""
    exported = set(getattr(mod, "__all__", []) or [])
    out = []
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        home = getattr(obj, "__module__", None) or "_"
        if home == mod.__name__ or (home.startswith("_") and (name in exported or not exported)):
            out.append((name, obj))
    return out


def _methods(cls) -> list[tuple[str, object]]:
    return [
        (name, obj)
        for name, obj in sorted(vars(cls).items())
        if not name.startswith("_")
        and (inspect.isroutine(obj) or isinstance(obj, (classmethod, staticmethod)))
    ]


def documents() -> list[dict]:
    """Every document, in a fixed order; an object reachable under two names is documented once,
    under the first, with an ``Also available as:`` line naming the others."""
    rows: list[dict] = []
    seen: dict[int, dict] = {}
    for modname in module_names():
        mod = sys.modules[modname]
        members = _members(mod)
        listing = ", ".join(n for n, _ in members[:MAX_MEMBERS_LISTED])
        rows.append(_row(modname, "module", modname, mod, f"Members: {listing}" if listing else ""))
        for name, obj in members:
            doc_id = f"{modname}.{name}"
            if id(obj) in seen:
                first = seen[id(obj)]
                first["text"] = first["text"].replace("\n", f"\nAlso available as: {doc_id}\n", 1)
                continue
            if inspect.isclass(obj):
                methods = _methods(obj)
                lines = [f"  {m}: {_first_line(getattr(obj, m, f))}" for m, f in methods[:MAX_MEMBERS_LISTED]]
                rows.append(
                    _row(doc_id, "class", modname, obj, "Methods:\n" + "\n".join(lines) if lines else "")
                )
                seen[id(obj)] = rows[-1]
                for mname, _ in methods:
                    meth = getattr(obj, mname, None)
                    if meth is not None and inspect.isroutine(meth):
                        rows.append(_row(f"{doc_id}.{mname}", "method", modname, meth))
            else:
                rows.append(_row(doc_id, "function", modname, obj))
                seen[id(obj)] = rows[-1]
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    rows = documents()
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(out)
    print(len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
