"""The SWE environment's parts: JUnit parsing into node ids, mutation operators, exact edits,
package specs and issue texts."""

import ast
import time

import pytest

from dsv32.envs.swe.issue import issue_text
from dsv32.envs.swe.mine import is_source
from dsv32.envs.swe.mutate import OPERATORS, mutants
from dsv32.envs.swe.snapshot import Edit, SnapshotError, apply_edit, inside, parse_spec
from dsv32.envs.swe.testrun import node_id, parse_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_lru.LRUCacheTest" name="test_size" file="tests/__init__.py" line="3"/>
<testcase classname="tests.test_lru.LRUCacheTest" name="test_lru" file="tests/test_lru.py" line="9">
  <failure message="AssertionError: assert 1 == 2">trace</failure></testcase>
<testcase classname="test_mod" name="test_p[a-b]" file="test_mod.py" line="1"><skipped message="no"/></testcase>
<testcase classname="test_mod" name="test_t" file="test_mod.py" line="5">
  <failure message="boom">x</failure><error message="teardown broke">y</error></testcase>
<testcase classname="" name="tests.test_broken" ><error message="collection failure">z</error></testcase>
</testsuite></testsuites>"""


def test_junit_becomes_node_ids_and_worst_outcomes(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_lru.py").write_text("")
    (tmp_path / "test_mod.py").write_text("")
    outcomes, messages = parse_junit(JUNIT, tmp_path)
    assert outcomes == {
        "tests/test_lru.py::LRUCacheTest::test_size": "passed",  # a mixin's test: the collecting module
        "tests/test_lru.py::LRUCacheTest::test_lru": "failed",
        "test_mod.py::test_p[a-b]": "skipped",
        "test_mod.py::test_t": "error",
        "tests.test_broken": "error",
    }
    assert messages["tests/test_lru.py::LRUCacheTest::test_lru"] == "AssertionError: assert 1 == 2"
    assert messages["test_mod.py::test_t"] == "teardown broke"


def test_node_id_without_root_uses_the_file_attribute():
    assert (
        node_id("pkg.tests.test_a.TestX", "test_y", "pkg/tests/test_a.py")
        == "pkg/tests/test_a.py::TestX::test_y"
    )


SOURCE = '''\
def clamp(x, lo, hi):
    """Clamp x."""
    if x < lo:
        return lo
    if x > hi and not lo == hi:
        return hi
    return min(max(x, lo), hi)


class Acc:
    def add(self, xs):
        s = 0
        for i in range(len(xs)):
            s += xs[i] * 2
        return s


def unused(a, b):
    return a - b
'''


def test_every_operator_yields_minimal_valid_mutants():
    found = mutants("m.py", SOURCE)
    assert {m.op for m in found} == set(OPERATORS)
    for m in found:
        mutated = SOURCE.replace(m.edit.old, m.edit.new, 1)
        assert SOURCE.count(m.edit.old) == 1 and mutated.count(m.edit.new) == 1
        assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(SOURCE))
        assert mutated.replace(m.edit.new, m.edit.old, 1) == SOURCE  # the inverse edit is the fix
    edits = {(m.op, m.edit.old.strip(), m.edit.new.strip()) for m in found}
    assert ("compare", "if x < lo:", "if x <= lo:") in edits
    assert ("boolop", "if x > hi and not lo == hi:", "if x > hi or not lo == hi:") in edits
    assert ("drop_not", "if x > hi and not lo == hi:", "if x > hi and lo == hi:") in edits
    assert ("binop", "s += xs[i] * 2", "s += xs[i] // 2") in edits
    assert ("swap_args", "return min(max(x, lo), hi)", "return min(hi, max(x, lo))") in edits
    assert (
        "off_by_one",
        "s = 0\n        for i in range(len(xs)):",
        "s = 1\n        for i in range(len(xs)):",
    ) not in edits
    assert any(m.op == "remove_return" and m.function == "Acc.add" for m in found)
    assert {m.function for m in found} == {"clamp", "Acc.add", "unused"}


def test_only_covered_functions_are_mutated():
    assert {m.function for m in mutants("m.py", SOURCE, covered={1})} == {"clamp"}


def test_edits_apply_exactly_once(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\ny = 2\n")
    apply_edit(tmp_path, Edit("a.py", "y = 2", "y = 3"))
    assert (tmp_path / "a.py").read_text() == "x = 1\nx = 1\ny = 3\n"
    with pytest.raises(SnapshotError, match="occurs 2 times"):
        apply_edit(tmp_path, Edit("a.py", "x = 1", "x = 0"))
    with pytest.raises(SnapshotError, match="occurs 0 times"):
        apply_edit(tmp_path, Edit("a.py", "z", "w"))
    with pytest.raises(SnapshotError, match="outside"):
        inside(tmp_path, "../etc/passwd")
    with pytest.raises(SnapshotError, match="path, old and new"):
        Edit.from_dict({"path": "a.py"})


def test_package_specs():
    assert parse_spec(" toolz==1.0.0 ") == ("toolz", "1.0.0")
    for bad in ["toolz", "toolz>=1", "toolz==", "../x==1"]:
        with pytest.raises(SnapshotError, match="NAME==VERSION"):
            parse_spec(bad)


def test_source_files_exclude_tests_docs_and_build_files():
    assert is_source("toolz/itertoolz.py") and is_source("src/cachetools/keys.py")
    for rel in ["toolz/tests/test_x.py", "docs/conf.py", "setup.py", "pkg/_version.py", "a_test.py", "x.txt"]:
        assert not is_source(rel), rel


def test_issue_text_names_failures_not_the_diff():
    text = issue_text(
        "pkg", "1.0", [f"t.py::test_{i}" for i in range(7)], {"t.py::test_0": "assert 1 == 2\nmore"}, 40
    )
    assert "7 of its 40 tests fail" in text and "`t.py::test_0`" in text and "assert 1 == 2" in text
    assert "and 2 more" in text and "t.py::test_6" not in text


def test_a_forged_report_with_long_or_deep_classnames_parses_quickly(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "test_m.py").write_text("")
    deep = "".join(f'<testcase classname="{".".join([f"p{i}"] * 1000)}" name="t"/>' for i in range(2000))
    xml = (
        f'<testsuite><testcase classname="{"x" * 300}.y" name="t"/>{deep}'
        '<testcase classname="pkg.sub.test_m.TestA" name="t"/></testsuite>'
    )
    start = time.perf_counter()
    outcomes, _ = parse_junit(xml, tmp_path)
    assert time.perf_counter() - start < 10
    assert len(outcomes) == 2002 and outcomes["pkg/sub/test_m.py::TestA::t"] == "passed"


# -- downloading a snapshot from a package index (a local one: the tests stay offline) -----------

BACKEND = """\
import os
open(os.environ["MARKER"], "w").write("the package's build backend ran")
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(d, config_settings=None):
    os.makedirs(f"{d}/hostile-1.0.dist-info")
    with open(f"{d}/hostile-1.0.dist-info/METADATA", "w") as f:
        f.write("Metadata-Version: 2.1\\nName: hostile\\nVersion: 1.0\\n")
    return "hostile-1.0.dist-info"
def build_wheel(*args, **kwargs):
    raise RuntimeError
def build_sdist(*args, **kwargs):
    raise RuntimeError
"""


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 index on 127.0.0.1 serving the sdist of ``hostile==1.0``, a package whose build
    backend writes ``marker`` when it runs; ``serve(sha256)`` publishes the page with that digest."""
    import hashlib
    import http.server
    import io
    import tarfile
    import threading

    root, marker = tmp_path / "index", tmp_path / "marker"
    (root / "simple" / "hostile").mkdir(parents=True)
    (root / "files").mkdir()
    files = {
        "PKG-INFO": "Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": BACKEND,
        "hostile/__init__.py": "VALUE = 1\n",
    }
    archive = root / "files" / "hostile-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"hostile-1.0/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("MARKER", str(marker))
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path / "cache"))

    def serve(sha256: str = digest) -> None:
        link = f'<a href="../../files/hostile-1.0.tar.gz#sha256={sha256}">hostile-1.0.tar.gz</a>'
        (root / "simple" / "hostile" / "index.html").write_text(f"<html><body>{link}</body></html>")

    yield serve, marker, tmp_path / "cache"
    server.shutdown()
    server.server_close()


def test_a_snapshot_is_downloaded_checked_and_unpacked_without_running_package_code(index):
    from dsv32.envs.swe.snapshot import pristine

    serve, marker, cache = index
    serve()
    root = pristine("hostile==1.0")
    assert (root / "hostile" / "__init__.py").read_text() == "VALUE = 1\n"
    assert root == cache / "swe" / "src" / "hostile-1.0"
    assert (cache / "swe" / "sdists" / "hostile-1.0.tar.gz").is_file()
    assert not marker.exists()  # the package's build backend never ran


def test_a_download_whose_sha256_differs_is_refused_and_not_kept(index):
    from dsv32.envs.swe.snapshot import pristine

    serve, marker, cache = index
    serve("0" * 64)
    with pytest.raises(SnapshotError, match="sha256"):
        pristine("hostile==1.0")
    assert not (cache / "swe" / "src" / "hostile-1.0").exists()
    assert [p.name for p in (cache / "swe" / "sdists").iterdir()] == []
    with pytest.raises(SnapshotError, match=r"no source distribution of hostile==2\.0"):
        pristine("hostile==2.0")
    assert not marker.exists()
