"""PYTEST_DONT_REWRITE: the pytest plugin that vouches for each test of a sandboxed run (its
verdicts, not pytest's report, decide which tests count as passed).

Standard library and pytest only: :func:`~dsv32.envs.swe.testrun.run_pytest` copies this file into a
read-only folder outside the repository and the launcher imports it right after pytest and its
built-in plugins, before the repository is on ``sys.path``, so nothing of the tested code has run
when it loads. At load it

- reads a one-run key (hex, one line) from stdin and the verdict file's path from
  ``DSV32_SEAL_OUT`` (then removed from the environment);
- records the identity of everything pytest's machinery and a test body rely on: the module objects
  and every attribute of ``pytest``, ``_pytest.*``, ``pluggy.*``, ``unittest.*`` and ``builtins``
  (and of the classes they define), their entries in ``sys.modules``, the module types, and the
  trace function (:func:`_snapshot`).

For every test it wraps setup, call and teardown (outermost hook wrappers) and writes one verdict,
``ok`` only when

- the records are intact once the tests are collected, and after each test's call and teardown (a
  library that replaced ``Function.runtest``, ``pytest.raises``, ``builtins.len`` or
  ``sys.modules["pytest"]``, or set a trace function that could jump over lines, fails every test
  from then on; a change undone by the test's teardown, such as a ``monkeypatch`` of a built-in,
  fails only that test; pytest's own functions it moves onto its classes while it starts are
  allowed);
- the function about to run is the test as the test file on disk defines it: its code object equals
  the one pytest's own assertion rewriter (the copy recorded at load) compiles from that file (a
  library cannot swap a test body for another);
- the test function, called through a wrapper this plugin puts in place of ``item.obj``, returned
  normally (so its body ran to its end; a runner that skips the call leaves no mark);
- no phase raised.

Each verdict line is JSON with an HMAC-SHA256 over it and the previous line's MAC (a chain: a line
cannot be forged without the key, dropped or reordered without breaking the chain), and the run
ends with an ``end`` line that repeats the integrity state. The host counts a test as passed only
when pytest's report and an intact chain ending in an ``end`` line agree.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import json
import operator
import os
import sys
import types
from itertools import repeat
from pathlib import Path

import pytest
from _pytest.assertion import rewrite as _rewrite

_ROOTS = ("pytest", "_pytest", "pluggy", "unittest", "builtins")
# attributes pytest itself changes while it runs (state, not machinery)
_MUTABLE = {
    ("builtins", "_"),
    ("_pytest.assertion.util", "_reprcompare"),
    ("_pytest.assertion.util", "_assertion_pass"),
    ("_pytest.assertion.util", "_config"),
    ("_pytest.assertion.rewrite", "_HOOK"),
    ("_pytest.python_api", "__warningregistry__"),
    ("unittest.case", "__warningregistry__"),
    *(
        ("_pytest.debugging", f"pytestPDB.{k}")
        for k in ("_pluginmanager", "_config", "_saved", "_recursive_debug")
    ),
    ("_pytest.debugging", "pytestPDB._wrapped_pdb_cls"),
}

_getattr, _id, _isinstance, _type, _is = getattr, id, isinstance, type, operator.is_
_hmac_new, _dumps, _sha256 = hmac.new, json.dumps, hashlib.sha256
_gettrace, _modules, _rewrite_test = sys.gettrace, sys.modules, _rewrite._rewrite_test


def _snapshot() -> list[tuple]:
    """``(name, module, module type, [(owner, key, value)])`` for every watched module."""
    rows = []
    for name, module in sorted(_modules.items()):
        if name.split(".")[0] not in (*_ROOTS, __name__) or not _isinstance(module, types.ModuleType):
            continue
        attrs = []
        for key, value in list(vars(module).items()):
            if (name, key) not in _MUTABLE:
                attrs.append((module, key, value))
            if _isinstance(value, type) and _getattr(value, "__module__", None) == name:
                attrs += [
                    (value, k, v)
                    for k, v in list(vars(value).items())
                    if k != "__dict__" and (name, f"{key}.{k}") not in _MUTABLE
                ]
        rows.append((name, module, _type(module), attrs))
    return rows


_MISSING = object()


def _own_functions(rows: list[tuple]) -> set[int]:
    """The ids of the functions the watched modules define at module level (kept alive by ``rows``)."""
    return {
        _id(v)
        for _, module, _, attrs in rows
        for o, _, v in attrs
        if o is module and _type(v) is types.FunctionType
    }


def _pytests_own(value: object, own: set[int]) -> bool:
    """Whether ``value`` is one of pytest's own functions, or a property made of them: what pytest
    itself puts on its classes while it starts (``_pytest.legacypath`` adds ``Config``'s legacy
    ini types and path properties this way)."""
    if _type(value) is property:
        return all(f is None or _id(f) in own for f in (value.fget, value.fset, value.fdel))
    return _id(value) in own


def _dict_of(owner: object) -> dict:
    """The dict behind a module's or a class's attributes (a class shows it through a read-only
    proxy, whose lookups are slow; the proxy refers to the dict itself)."""
    mapping = vars(owner)
    return mapping if _type(mapping) is dict else gc.get_referents(mapping)[0]


def _fast(rows: list[tuple]) -> tuple:
    """The records of ``rows`` flattened for :func:`_same`: module names, modules and their types,
    and for every attribute its owner's dict, its key and the value it holds now."""
    dicts, keys, values = [], [], []
    for _, _, _, attrs in rows:
        for owner, key, _ in attrs:
            mapping = _dict_of(owner)
            dicts.append(mapping)
            keys.append(key)
            values.append(mapping.get(key, _MISSING))
    names = tuple(r[0] for r in rows)
    return names, tuple(r[1] for r in rows), tuple(r[2] for r in rows), (dicts, keys, values)


def _same(fast: tuple, trace: object) -> bool:
    """Whether everything in ``fast`` is as it was (C-level passes: the check of every test)."""
    names, modules, kinds, (dicts, keys, values) = fast
    return (
        _gettrace() is trace
        and all(map(_is, map(_modules.get, names), modules))
        and all(map(_is, map(_type, modules), kinds))
        and all(map(_is, map(dict.get, dicts, keys, repeat(_MISSING)), values))
    )


def _intact(rows: list[tuple], trace: object, own: set[int]) -> str:
    """'' when nothing recorded has changed (but for pytest's own functions moved onto its classes),
    else what changed first."""
    if _gettrace() is not trace:
        return "a trace function was set"
    for name, module, kind, attrs in rows:
        if _modules.get(name) is not module:
            return f"sys.modules[{name!r}] was replaced"
        if _type(module) is not kind:
            return f"the type of module {name} was changed"
        for owner, key, value in attrs:
            now = vars(owner).get(key, _MISSING)
            if now is not value and (owner is module or not _pytests_own(now, own)):
                return f"{_getattr(owner, '__name__', '?')}.{key} was changed"
    return ""


class _Seal:
    __slots__ = (
        "_codes",
        "_fast",
        "_last",
        "_mac",
        "_out",
        "_own",
        "_rows",
        "_seq",
        "_state",
        "_trace",
        "broken",
    )

    def __init__(self, key: bytes, path: str) -> None:
        self._mac = _hmac_new(key, digestmod=_sha256)
        self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)
        self._last = ""
        self._seq = 0
        self._rows: list[tuple] = []
        self._own: set[int] = set()
        self._fast: tuple = ((), (), (), [])
        self._trace = _gettrace()
        self.broken = ""
        self._codes: dict[str, list] = {}
        self._state: dict[str, list] = {}

    def write(self, *fields: object) -> None:
        self._seq += 1
        body = _dumps([self._seq, *fields])
        mac = self._mac.copy()
        mac.update((self._last + "\n" + body).encode())
        self._last = mac.hexdigest()
        self._out.write(f"{body}\t{self._last}\n")
        self._out.flush()

    def changed(self) -> str:
        """What changed in the records ('' when nothing did)."""
        if _same(self._fast, self._trace):
            return ""
        change = _intact(self._rows, self._trace, self._own)
        if not change:  # pytest moved its own functions: the new places are the norm now
            self._fast = _fast(self._rows)
        return change

    def check(self) -> bool:
        """Whether the records are intact; a change, once seen, voids the rest of the run."""
        if not self.broken:
            self.broken = self.changed()
        return not self.broken

    def pristine(self, path: str, config) -> list:
        """The code objects pytest's rewriter (and a plain compile) make of the test file ``path``."""
        if path not in self._codes:
            found: list = []
            try:
                with open(path, "rb") as f:
                    source = f.read()
                tops = [compile(source, path, "exec", dont_inherit=True)]
                tops.append(_rewrite_test(Path(path), config)[1])
            except Exception:  # an unreadable or uncompilable file vouches for nothing
                pass
            else:
                stack = list(tops)
                while stack:
                    code = stack.pop()
                    found.append(code)
                    stack += [c for c in code.co_consts if _isinstance(c, types.CodeType)]
            self._codes[path] = found
        return self._codes[path]

    def genuine(self, func, item) -> bool:
        """Whether ``func`` (a bound method's function) is the test ``item`` names as a test file
        defines it: its code is named like the test and equals a code object compiled from the
        item's file, or from another test file under the root directory (a mixin's)."""
        code = _getattr(_getattr(func, "__func__", func), "__code__", None)
        if _type(code) is not types.CodeType or code.co_name != _getattr(item, "originalname", item.name):
            return False
        files = {str(item.path)}
        if _test_file(code.co_filename, str(item.config.rootpath)):
            files.add(code.co_filename)
        return any(
            _type(c) is types.CodeType and c == code for f in files for c in self.pristine(f, item.config)
        )


_TEST_DIRS = ("tests", "test", "testing")


def _test_file(path: str, root: str) -> bool:
    """Whether ``path`` is test code under ``root``: a ``conftest.py``, ``test_*.py`` or ``*_test.py``,
    or any ``.py`` file in a ``tests``, ``test`` or ``testing`` folder (the files the scored copy
    takes from the snapshot, never from the episode)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(top + os.sep) or not real.endswith(".py"):
        return False
    *dirs, name = os.path.relpath(real, top).split(os.sep)
    return (
        any(d in _TEST_DIRS for d in dirs)
        or name == "conftest.py"
        or name.startswith("test_")
        or name.endswith("_test.py")
    )


_SEAL: _Seal | None = None


def _load() -> None:
    global _SEAL
    path = os.environ.pop("DSV32_SEAL_OUT", "")
    if not path:
        return
    key = bytes.fromhex(sys.stdin.readline().strip())
    _SEAL = _Seal(key, path)
    _SEAL._rows = _snapshot()  # after _SEAL is bound, so that it is watched too
    _SEAL._own = _own_functions(_SEAL._rows)
    _SEAL._fast = _fast(_SEAL._rows)


_load()


def _test_function(item, seal: _Seal):
    """The item's test function if it is genuine, else None: its own code (a bound method's function)
    or, for a decorated test, the function its ``__wrapped__`` chain ends in."""
    func = _getattr(item, "obj", None)
    if func is None:
        return None
    if seal.genuine(func, item):
        return func
    inner = func
    for _ in range(16):
        inner = _getattr(inner, "__wrapped__", None)
        if inner is None:
            return None
        if seal.genuine(inner, item):
            return func
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    if _SEAL is not None:
        _SEAL.check()  # what importing the tests (and the code they import) changed


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if _SEAL is None:
        return (yield)
    _SEAL._state[item.nodeid] = [not _SEAL.broken, False, False]
    try:
        result = yield
    except BaseException:
        _SEAL._state[item.nodeid][0] = False
        raise
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    if _SEAL is None:
        return (yield)
    state = _SEAL._state.setdefault(item.nodeid, [False, False, False])
    func = _test_function(item, _SEAL)
    if func is not None and not _SEAL.broken:

        def run(*args, **kwargs):
            result = func(*args, **kwargs)
            if not (hasattr(result, "__await__") or hasattr(result, "__aiter__")):
                state[1] = True
            return result

        item.obj = run
    try:
        result = yield
    except BaseException:
        state[1] = False
        raise
    finally:
        if func is not None:
            item.obj = func
    # a change still in place after the call (a fixture's monkeypatch of a built-in, say) leaves this
    # test unvouched; one still in place after its teardown voids the run
    state[1] = state[1] and not _SEAL.broken and not _SEAL.changed()
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    if _SEAL is None:
        return (yield)
    state = _SEAL._state.pop(item.nodeid, [False, False, False])
    try:
        result = yield
        state[2] = True
    finally:
        ok = all(state) and _SEAL.check()
        _SEAL.write(item.nodeid, "ok" if ok else "no", _SEAL.broken)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _SEAL is not None:
        _SEAL.check()
        _SEAL.write("end", "broken" if _SEAL.broken else "intact", _SEAL.broken)
