"""Repository snapshots: a package's source distribution from the package index, unpacked once into
the cache, and per-episode copies with a task's edits applied.

A task never stores third-party source: it names ``NAME==VERSION`` and a list of exact string edits
``{"path", "old", "new"}``. :func:`pristine` downloads the sdist file from the package index's
simple API (PEP 503: ``$PIP_INDEX_URL``, else PyPI), checks it against the sha256 the index gives,
keeps it in ``cache_dir("swe", "sdists")`` and unpacks it under ``cache_dir("swe", "src")`` (tar
members through the ``data`` filter: no links or paths out, no device files); nothing of the package
runs on the host; :func:`materialize` copies that tree and applies the edits. An
edit applies only where ``old`` occurs exactly once in its file, so a stale edit fails loudly.

A repository an episode worked on holds whatever the model's commands left there (FIFOs, symlinks,
huge or deep trees): the host reads from it only regular files, up to :data:`MAX_FILE_BYTES`
(:func:`read_regular`), and the reward runs on :func:`scoring_tree`, the snapshot with only the
model's library code taken from the repository.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from dsv32.envs.base import EnvError
from dsv32.paths import cache_dir

MAX_FILE_BYTES = 16 << 20  # the largest file the host reads from a repository
MAX_SCORED_ENTRIES = 100_000  # files and folders outside the tests the reward's copy looks at
MAX_SCORED_BYTES = 256 << 20  # the model's library code the reward's copy takes, in all
MAX_SCORED_DEPTH = 64  # folders deeper than this are not looked into
DEFAULT_INDEX = "https://pypi.org/simple"
PAGE_BYTES = 32 << 20  # the largest project page read from the index
MAX_SDIST_BYTES = 256 << 20  # the largest source distribution downloaded
TEST_DIRS = frozenset({"tests", "test", "testing"})

_SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


class SnapshotError(EnvError):
    """A package spec that is malformed or cannot be downloaded, or an edit that does not apply."""


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of ``old`` in ``path`` (relative to the repository) by ``new``."""

    path: str
    old: str
    new: str

    def inverse(self) -> Edit:
        return Edit(self.path, self.new, self.old)

    def to_dict(self) -> dict:
        return {"path": self.path, "old": self.old, "new": self.new}

    @classmethod
    def from_dict(cls, row: dict) -> Edit:
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("path", "old", "new")):
            raise SnapshotError(f"an edit is an object with string fields path, old and new, got {row!r}")
        return cls(row["path"], row["old"], row["new"])


def parse_spec(spec: str) -> tuple[str, str]:
    """``"name==1.2.3"`` → ``("name", "1.2.3")``."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise SnapshotError(f"package spec {spec!r} is not NAME==VERSION (for example inflection==0.5.1)")
    return m.group(1), m.group(2)


class _Links(HTMLParser):
    """The ``href`` of every ``<a>`` of a PEP 503 project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def index_url() -> str:
    """The package index's simple API (PEP 503): ``$PIP_INDEX_URL``, the variable pip reads, else
    PyPI's."""
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def _fetch(url: str):
    try:
        return urllib.request.urlopen(
            urllib.request.Request(url, headers={"Accept": "text/html"}), timeout=60
        )
    except (OSError, ValueError) as err:  # URLError and HTTPError are OSErrors
        raise SnapshotError(f"could not fetch {url}: {err}") from None


def _sdist_link(name: str, version: str) -> tuple[str, str, str]:
    """``(url, file name, sha256)`` of the source distribution of ``name==version`` on the index's
    project page; a :class:`SnapshotError` when the page lists none or gives no sha256."""
    page = f"{index_url()}/{re.sub(r'[-_.]+', '-', name).lower()}/"
    with _fetch(page) as response:
        html = response.read(PAGE_BYTES + 1)
        page = response.geturl()  # after redirects: relative links start from here
    if len(html) > PAGE_BYTES:
        raise SnapshotError(f"the index page {page} is larger than {PAGE_BYTES} bytes")
    links = _Links()
    links.feed(html.decode("utf-8", errors="replace"))
    found = []
    for href in links.hrefs:
        url = urllib.parse.urljoin(page, href)
        parts = urllib.parse.urlsplit(url)
        filename = urllib.parse.unquote(parts.path.rsplit("/", 1)[-1])
        if _is_sdist(filename, name, version):
            digest = dict(urllib.parse.parse_qsl(parts.fragment)).get("sha256", "")
            found.append((filename.endswith(".zip"), urllib.parse.urlunsplit(parts._replace(fragment="")),
                          filename, digest))  # fmt: skip
    if not found:
        raise SnapshotError(f"the index ({page}) lists no source distribution of {name}=={version}")
    _, url, filename, digest = min(found)  # a .tar.gz before a .zip
    if not re.fullmatch(r"[0-9a-f]{64}", digest.lower()):
        raise SnapshotError(f"the index gives no sha256 for {filename}, so it cannot be checked")
    return url, filename, digest.lower()


def _download(name: str, version: str) -> Path:
    """Fetch the sdist file of ``name==version`` from the index into ``cache_dir("swe", "sdists")``
    and check its sha256. Only the file is fetched: nothing of the package runs (``pip download``
    would run its build backend to read its metadata)."""
    url, filename, digest = _sdist_link(name, version)
    dest = cache_dir("swe", "sdists")
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".download-", dir=dest)
    try:
        sha, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out, _fetch(url) as response:
            while chunk := response.read(1 << 20):
                size += len(chunk)
                if size > MAX_SDIST_BYTES:
                    raise SnapshotError(f"{url} is larger than {MAX_SDIST_BYTES} bytes")
                sha.update(chunk)
                out.write(chunk)
        if sha.hexdigest() != digest:
            raise SnapshotError(f"{url} does not have the sha256 the index gives ({digest})")
        os.replace(tmp, dest / filename)
    except OSError as err:
        raise SnapshotError(f"could not download {url}: {err}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest / filename


def _is_sdist(filename: str, name: str, version: str) -> bool:
    """Whether ``filename`` is ``NAME-VERSION.tar.gz`` or ``.zip`` for ``name`` (in any spelling)."""
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
    if stem == filename or not stem.endswith(f"-{version}"):
        return False
    norm = re.sub(r"[-_.]+", "_", name).lower()
    return re.sub(r"[-_.]+", "_", stem[: -len(version) - 1]).lower() == norm


def _find_sdist(folder: Path, name: str, version: str) -> Path | None:
    for f in sorted(folder.iterdir()):
        if _is_sdist(f.name, name, version):
            return f
    return None


def _unpack(archive: Path, into: Path) -> Path:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
    else:
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")
    tops = [p for p in into.iterdir()]
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else into


def pristine(spec: str) -> Path:
    """The unpacked source tree of ``spec`` (downloaded and unpacked on first use; read it, never
    write it: episodes work on copies)."""
    name, version = parse_spec(spec)
    root = cache_dir("swe", "src", f"{name}-{version}")
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{name}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download and unpack at a time, across threads and processes
        if root.is_dir():
            return root
        sdists = cache_dir("swe", "sdists")
        archive = (_find_sdist(sdists, name, version) if sdists.is_dir() else None) or _download(
            name, version
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root.parent))
        try:
            os.replace(_unpack(archive, tmp), root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def python_path(root: Path) -> str:
    """Where the package imports from, relative to the repository: ``src`` for a src layout, else ``.``."""
    return "src" if (root / "src").is_dir() and any((root / "src").glob("*/__init__.py")) else "."


def inside(root: Path, rel: str) -> Path:
    """``root / rel``, refusing paths that leave ``root`` (``..``, absolute paths, symlinks out)."""
    if "\0" in rel:
        raise SnapshotError(f"path {rel!r} contains a NUL byte")
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise SnapshotError(f"path {rel!r} is outside the repository")
    return path


def read_regular(path: Path, name: str, limit: int | None = None) -> bytes:
    """The content of the regular file ``path`` (``name`` in messages): a :class:`SnapshotError` when
    it is missing, a symlink (not followed), a FIFO, socket or device (never waited on), or larger
    than ``limit`` bytes (default :data:`MAX_FILE_BYTES`)."""
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SnapshotError(f"{name}: no such file") from None
    except OSError as err:
        why = "a symbolic link" if os.path.islink(path) else err.strerror
        raise SnapshotError(f"{name} is not a regular file ({why})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            raise SnapshotError(f"{name} is not a regular file ({kind})")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise SnapshotError(f"{name} is larger than {limit} bytes (the limit)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: Path, rel: str) -> str:
    """The text (UTF-8) of the regular file ``rel`` inside ``root``."""
    return read_regular(inside(root, rel), rel).decode("utf-8")


def apply_edit(root: Path, edit: Edit) -> None:
    """Apply one exact-string edit; an error when ``old`` is not there exactly once or the result is
    not UTF-8 text (a lone surrogate). The new content is written to a temporary file beside the
    file, then renamed over it: a failure leaves the file as it was."""
    path = inside(root, edit.path)
    text = read_regular(path, edit.path).decode("utf-8")
    count = text.count(edit.old)
    if count != 1:
        raise SnapshotError(f"{edit.path}: the text to replace occurs {count} times (it must occur once)")
    try:
        data = text.replace(edit.old, edit.new, 1).encode("utf-8")
    except UnicodeEncodeError as err:
        raise SnapshotError(f"{edit.path}: the new text is not valid UTF-8 text ({err.reason})") from None
    mode = stat.S_IMODE(os.stat(path).st_mode)
    fd, tmp = tempfile.mkstemp(prefix=".dsv32-edit-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def materialize(spec: str, edits: list[Edit], dest: Path) -> Path:
    """A fresh copy of ``spec``'s source at ``dest`` with ``edits`` applied; returns ``dest``."""
    shutil.copytree(pristine(spec), dest, symlinks=True)
    for edit in edits:
        apply_edit(dest, edit)
    return dest


def is_test_file(rel: str) -> bool:
    """A path pytest treats as test code: in a ``tests``, ``test`` or ``testing`` folder, or named
    ``test_*.py``, ``*_test.py`` or ``conftest.py``."""
    *dirs, name = rel.split("/")
    return (
        bool(TEST_DIRS.intersection(dirs))
        or name == "conftest.py"
        or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")))
    )


def _library_files(repo: Path, owned) -> list[str]:
    """The paths under ``repo`` (not following symlinked folders, not looking into test folders,
    ``__pycache__`` or folders deeper than :data:`MAX_SCORED_DEPTH`) for which ``owned(rel)``."""
    found, seen, stack = [], 0, [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(repo / rel_dir) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_SCORED_ENTRIES:
                        raise SnapshotError(
                            f"the repository has more than {MAX_SCORED_ENTRIES} files and folders outside "
                            "its tests"
                        )
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    try:
                        folder = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    if not folder:
                        if owned(rel):
                            found.append(rel)
                    elif entry.name not in TEST_DIRS | {"__pycache__"} and rel.count("/") < MAX_SCORED_DEPTH:
                        stack.append(rel)
        except OSError:  # unreadable, vanished, or a path too long: nothing from there
            continue
    return found


def scoring_tree(
    spec: str, repo: Path, dest: Path, *, edited: Iterable[str], tests: Iterable[str]
) -> list[str]:
    """The tree the reward runs the tests on, made at ``dest``: the snapshot of ``spec``, with its
    library code replaced by the model's. The model's are the ``.py`` files of ``repo`` that are not
    test code (:func:`is_test_file`) nor in ``tests`` (the files the task's test ids name), and the
    files in ``edited`` (the task's bug); everything else — tests, ``conftest.py``, pytest
    configuration, data files, anything the model added that is not library code — is the
    snapshot's. A model file that is not a regular file inside ``repo`` of at most
    :data:`MAX_FILE_BYTES` is left out (so it is missing from ``dest``); returns why, one line each.
    A :class:`SnapshotError` when the repository is too large to copy (more than
    :data:`MAX_SCORED_ENTRIES` entries outside its tests, or :data:`MAX_SCORED_BYTES` of library
    code)."""
    edited, tests = set(edited), set(tests) - set(edited)

    def owned(rel: str) -> bool:
        return rel in edited or (rel.endswith(".py") and rel not in tests and not is_test_file(rel))

    shutil.copytree(pristine(spec), dest, symlinks=True)
    for rel in {*_library_files(dest, owned), *edited}:  # the snapshot's library code goes
        inside(dest, rel)
        (dest / rel).unlink(missing_ok=True)
    left_out, total = [], 0
    for rel in sorted(set(_library_files(repo, owned)) | edited):
        try:
            data = read_regular(inside(repo, rel), rel)
        except (SnapshotError, OSError) as err:
            left_out.append(str(err) if isinstance(err, SnapshotError) else f"{rel}: {err.strerror}")
            continue
        total += len(data)
        if total > MAX_SCORED_BYTES:
            raise SnapshotError(f"the repository has more than {MAX_SCORED_BYTES} bytes of library code")
        try:
            target = inside(dest, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except (SnapshotError, OSError) as err:
            left_out.append(str(err) if isinstance(err, SnapshotError) else f"{rel}: {err.strerror}")
    return left_out


def unified_diff(path: str, before: str, after: str) -> str:
    """The change of file ``path`` from ``before`` to ``after`` as a unified diff (``a/`` and ``b/``
    prefixes)."""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )
