"""The SWE miner and environment end to end, offline, on a small package the test writes into a
private cache (so nothing is downloaded): mining, the tools, the reward and its guards."""

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest
from helpers.swe import cached_package

from dsv32.envs import EnvError, Episode, Task
from dsv32.envs.swe import SweEnv, snapshot, testrun
from dsv32.envs.swe.mine import mine
from dsv32.envs.swe.snapshot import materialize, python_path, scoring_tree
from dsv32.envs.swe.testrun import run_pytest

CORE = """\
def clamp(x, lo, hi):
    \"\"\"Clamp x.\"\"\"
    if x < lo:
        return lo
    if x > hi and not lo == hi:
        return hi
    return min(max(x, lo), hi)


def total(xs):
    s = 0
    for x in xs:
        s += x
    return s
"""

MINIPKG = {
    "minipkg/__init__.py": "from minipkg.core import clamp, total\n",
    "minipkg/core.py": CORE,
    "tests/test_core.py": (
        "from minipkg import clamp, total\n\n"
        "def test_low():\n    assert clamp(-5, 0, 10) == 0\n\n"
        "def test_high():\n    assert clamp(50, 0, 10) == 10\n\n"
        "def test_mid():\n    assert clamp(5, 0, 10) == 5\n\n"
        "def test_edge():\n    assert clamp(0, 0, 10) == 0\n\n"
        "def test_total():\n    assert total([1, 2, 3]) == 6\n\n"
        "def test_total_empty():\n    assert total([]) == 0\n"
    ),
}


@pytest.fixture
def minipkg(tmp_path, monkeypatch):
    """A package 'minipkg==0.1' already in a private cache (so nothing is downloaded)."""
    return cached_package(tmp_path, monkeypatch, "minipkg-0.1", MINIPKG)


def test_the_miner_keeps_mutants_that_break_some_tests(minipkg):
    assert python_path(minipkg) == "."
    tasks = mine("minipkg==0.1", n=2, seed=1)
    assert len(tasks) == 2
    all_tests = {
        f"tests/test_core.py::test_{n}" for n in ("low", "high", "mid", "edge", "total", "total_empty")
    }
    for task in tasks:
        f2p, p2p = task.info["FAIL_TO_PASS"], task.info["PASS_TO_PASS"]
        assert f2p and set(f2p) | set(p2p) == all_tests and not set(f2p) & set(p2p)
        assert task.info["mutation"]["path"] == "minipkg/core.py"
        assert task.info["mutation"]["function"] in {"clamp", "total"}
        assert task.info["patch"].startswith("--- a/minipkg/core.py")
        assert f2p[0] in task.prompt and task.info["bug"][0]["new"] not in task.prompt
    assert len({t.id for t in tasks}) == 2


def test_the_miner_refuses_a_package_without_passing_tests(minipkg):
    (minipkg / "tests" / "test_core.py").write_text("def test_no():\n    assert False\n")
    with pytest.raises(EnvError, match="no test passes"):
        mine("minipkg==0.1", n=1)


@pytest.fixture
def mini_task(minipkg):
    bug = {
        "path": "minipkg/core.py",
        "old": "    if x < lo:\n        return lo\n",
        "new": "    if x < lo:\n        return hi\n",
    }
    info = {
        "package": "minipkg==0.1",
        "bug": [bug],
        "FAIL_TO_PASS": ["tests/test_core.py::test_low"],
        "PASS_TO_PASS": [
            f"tests/test_core.py::test_{n}" for n in ("high", "mid", "edge", "total", "total_empty")
        ],
        "pythonpath": ".",
    }
    return Task("mini-1", "clamp is broken", None, "swe", info)


def test_tools_read_edit_bash_and_tests(mini_task):
    env = SweEnv(bash_timeout_s=20)
    messages = env.reset(mini_task)
    assert messages[1]["content"] == "clamp is broken" and "minipkg==0.1" in messages[0]["content"]
    assert {t["function"]["name"] for t in env.tools()} == {"bash", "read_file", "edit_file", "run_tests"}
    shown = env.call("read_file", {"path": "minipkg/core.py", "start_line": 3, "end_line": 4})
    assert "     4\t        return hi" in shown and "(lines 3-4 of" in shown
    assert env.call("bash", {"command": "grep -n 'return hi' minipkg/core.py"}).startswith("exit code 0\n4:")
    assert env.call("run_tests", {}).startswith("1 failed, 5 passed")
    assert "FAILED tests/test_core.py::test_low" in env.call(
        "run_tests", {"tests": ["tests/test_core.py::test_low"]}
    )
    assert (
        env.call(
            "edit_file",
            {
                "path": "minipkg/core.py",
                "old_str": "lo:\n        return hi",
                "new_str": "lo:\n        return lo",
            },
        )
        == "edited minipkg/core.py"
    )
    assert env.call("run_tests", {}).startswith("6 passed")
    assert env.reward(Episode([], "fixed")).value == 1.0
    repo = env.repo
    env.close()
    assert not repo.exists()


def test_tool_errors_are_text(mini_task):
    env = SweEnv(bash_timeout_s=5)
    env.reset(mini_task)
    assert "occurs 0 times" in env.call(
        "edit_file", {"path": "minipkg/core.py", "old_str": "nope", "new_str": ""}
    )
    assert "outside" in env.call("read_file", {"path": "../../etc/passwd"})
    assert env.call("read_file", {"path": "missing.py"}).startswith("error:")
    assert env.call("edit_file", {"path": "minipkg/core.py"}).startswith("error:")
    assert env.call("run_tests", {"tests": "all"}).startswith("error:")
    assert env.call("git", {}).startswith("error: unknown tool")
    assert "wall-time limit" in env.call("bash", {"command": "sleep 30"})
    assert env.state()["errors"] == 6
    env.close()


def test_the_reward_restores_tests_the_model_edited(mini_task):
    env = SweEnv()
    env.reset(mini_task)
    env.call("bash", {"command": "printf 'def test_ok():\\n    pass\\n' > tests/test_core.py"})
    assert env.call("run_tests", {}).startswith("1 passed")
    reward = env.reward(Episode([], "done"))
    assert reward.value == 0.0 and reward.components["fail_to_pass"] == 0.0
    env.close()


def test_bash_cannot_write_outside_the_repository_or_reach_the_network(mini_task, tmp_path):
    env = SweEnv(bash_timeout_s=20)
    env.reset(mini_task)
    target = tmp_path / "outside.txt"
    out = env.call(
        "bash",
        {
            "command": f"echo x > {target}; python -c \"import socket; socket.create_connection(('127.0.0.1', 9), 2)\""
        },
    )
    assert not target.exists()
    assert "exit code 0" not in out
    env.close()


def test_bad_tasks_are_typed_errors():
    env = SweEnv()
    with pytest.raises(EnvError, match=r"info\.package"):
        env.reset(Task("t", "p", None, "swe", {}))
    info = {"package": "x==1", "bug": [], "FAIL_TO_PASS": [], "PASS_TO_PASS": []}
    with pytest.raises(EnvError, match="FAIL_TO_PASS is empty"):
        env.reset(Task("t", "p", None, "swe", info))
    with pytest.raises(EnvError, match="before reset"):
        env.reward(Episode([], None))


@pytest.mark.parametrize("pythonpath", ["../../../root", "/root", "src/../..", "", 1])
def test_a_pythonpath_outside_the_repository_is_a_typed_error(mini_task, pythonpath):
    info = {**mini_task.info, "pythonpath": pythonpath}
    env = SweEnv()
    with pytest.raises(EnvError, match=r"info\.pythonpath"):
        env.reset(Task("t", "p", None, "swe", info))
    repo = snapshot.pristine("minipkg==0.1")
    with pytest.raises(EnvError, match="pythonpath"):
        testrun.test_env(repo, pythonpath, repo)


def test_a_package_folder_made_a_symlink_out_of_the_repository_binds_nothing(mini_task, tmp_path):
    """The package folder goes on the sandbox's import path and is bound in; a symlink the model
    puts in its place must not bind the folder it points to."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("the hidden key\n")
    env = SweEnv(bash_timeout_s=20)
    env.reset(Task("t", "p", None, "swe", {**mini_task.info, "pythonpath": "lib"}))
    assert env.call("bash", {"command": f"ln -s {secret} lib && echo linked"}).startswith("exit code 0")
    for name, args in (("bash", {"command": "cat lib/key.txt; cat $PYTHONPATH/key.txt"}), ("run_tests", {})):
        out = env.call(name, args)
        assert out.startswith("error:") and "outside the repository" in out, (name, out)
        assert "the hidden key" not in out
    env.close()


def test_build_swe_cli_mines_tasks_the_swe_env_plays(minipkg, tmp_path, capsys):
    from dsv32.cli import main

    out = tmp_path / "mined"
    assert (
        main(["envs", "build-swe", "--package", "minipkg==0.1", "--n", "2", "--seed", "1", "--out", str(out)])
        == 0
    )
    path = out / "minipkg-0.1.jsonl"
    assert "2 tasks from minipkg==0.1" in capsys.readouterr().out
    assert main(["envs", "run", "swe", "--tasks", str(path), "--backend", "reference"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["mean_reward"] == 1.0


# What a model could plant to pass without fixing the bug; each, played on the unfixed task, must
# still score 0 with every PASS_TO_PASS test passing (the suite really ran).
_PASS_EVERY_TEST = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    rep.outcome, rep.longrepr = "passed", None
"""
_WRITE_A_PASSING_REPORT = """\
import sys

NAMES = ("low", "high", "mid", "edge", "total", "total_empty")


def forge():
    cases = "".join(f'<testcase classname="tests.test_core" name="test_{n}"/>' for n in NAMES)
    path = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml=")][0]
    with open(path, "w") as f:
        f.write(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
"""
_PATCH_THE_REPORTS = """\
import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    rep = _made(cls, item, call)
    rep.outcome, rep.longrepr = "passed", None
    return rep


_pytest.reports.TestReport.from_item_and_call = classmethod(_passed)
"""
FORGERIES = {
    "a pytest.py shadowing pytest": {"pytest.py": _WRITE_A_PASSING_REPORT + "forge()\n"},
    "a sitecustomize.py": {
        "sitecustomize.py": _WRITE_A_PASSING_REPORT + "import atexit\natexit.register(forge)\n"
    },
    "a new tests/conftest.py": {"tests/conftest.py": _PASS_EVERY_TEST},
    "a new root conftest.py": {"conftest.py": _PASS_EVERY_TEST},
    "a plugin named by a new pytest.ini": {
        "minipkg/forge.py": _PASS_EVERY_TEST,
        "pytest.ini": "[pytest]\naddopts = -p minipkg.forge\n",
    },
    "a new test module patching pytest": {"tests/test_zz.py": _PATCH_THE_REPORTS},
    "an exit hook in the package": {
        "minipkg/__init__.py": MINIPKG["minipkg/__init__.py"]
        + _WRITE_A_PASSING_REPORT
        + "import atexit\natexit.register(forge)\n"
    },
}


@pytest.mark.parametrize("files", FORGERIES.values(), ids=FORGERIES.keys())
def test_files_the_model_plants_do_not_forge_the_reward(mini_task, files):
    env = SweEnv()
    env.reset(mini_task)
    for rel, text in files.items():
        (env.repo / rel).write_text(text)
    reward = env.reward(Episode([], "done"))
    assert reward.value == 0.0, reward.reason
    assert reward.components == {"fail_to_pass": 0.0, "pass_to_pass": 1.0}, reward.reason
    env.close()


def test_the_reward_scores_the_models_library_code_and_leaves_its_repository_alone(mini_task):
    env = SweEnv()
    env.reset(mini_task)
    core = env.repo / "minipkg" / "core.py"
    (env.repo / "minipkg" / "bounds.py").write_text("def low(x, lo):\n    return lo if x < lo else x\n")
    core.write_text(
        "from minipkg.bounds import low\n\n"
        + core.read_text().replace("    if x < lo:\n        return hi\n", "    x = low(x, lo)\n")
    )
    (env.repo / "tests" / "test_core.py").write_text("def test_ok():\n    pass\n")
    assert env.reward(Episode([], "fixed")).value == 1.0  # a new module the fix imports is kept
    assert (env.repo / "tests" / "test_core.py").read_text() == "def test_ok():\n    pass\n"
    core.unlink()
    reward = env.reward(Episode([], "deleted"))
    assert reward.value == 0.0 and reward.components["pass_to_pass"] == 0.0
    env.close()


def _conftest_replacing_the_report(how: str, forged: str) -> str:
    """A conftest.py that, once pytest has written its JUnit report, replaces it (``how``)."""
    act = {
        "symlink": f"os.symlink({forged!r}, path)",
        "fifo": "os.mkfifo(path)",
        "malformed": "open(path, 'w').write('<oops')",
        "doctype": "open(path, 'w').write('<!DOCTYPE t [<!ENTITY a \"x\">]><testsuite>&a;</testsuite>')",
        "directory": "os.mkdir(path)",
    }[how]
    return (
        "import os\n\n\ndef pytest_unconfigure(config):\n"
        "    path = os.path.join(os.environ['TMPDIR'], 'report.xml')\n"
        f"    os.unlink(path)\n    {act}\n"
    )


@pytest.mark.parametrize("how", ["symlink", "fifo", "malformed", "doctype", "directory"])
def test_a_report_that_is_not_a_plain_well_formed_file_gives_no_results(tmp_path, how):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_a.py").write_text("def test_a():\n    assert False\n")
    forged = tmp_path / "forged.xml"  # a host file the sandbox cannot see
    forged.write_text('<testsuite><testcase classname="test_a" name="test_a"/></testsuite>')
    (repo / "conftest.py").write_text(_conftest_replacing_the_report(how, str(forged)))
    report = run_pytest(repo, timeout_s=60)
    assert report.outcomes == {} and "the JUnit report" in report.output, report


def test_a_report_over_the_size_cap_gives_no_results(tmp_path, monkeypatch):
    monkeypatch.setattr(testrun, "REPORT_BYTES", 100)
    (tmp_path / "test_a.py").write_text("def test_a():\n    pass\n")
    report = run_pytest(tmp_path, timeout_s=60)
    assert report.outcomes == {} and "larger than" in report.output, report


def test_run_tests_and_the_reward_survive_a_malformed_report(mini_task):
    env = SweEnv()
    env.reset(mini_task)
    (env.repo / "tests" / "conftest.py").write_text(_conftest_replacing_the_report("malformed", ""))
    out = env.call("run_tests", {})
    assert out.startswith("no test results") and "the JUnit report" in out, out
    # in the reward's run only the package's code could still reach the report
    (env.repo / "minipkg" / "__init__.py").write_text(
        MINIPKG["minipkg/__init__.py"]
        + "import builtins\nimport _pytest.junitxml\n\n\n"
        + "def _open(path, *args, **kwargs):\n"
        + "    f = builtins.open(path, *args, **kwargs)\n    f.write('<oops')\n    return f\n\n\n"
        + "_pytest.junitxml.open = _open\n"
    )
    reward = env.reward(Episode([], "done"))
    assert reward.value == 0.0 and "the JUnit report" in reward.reason, reward.reason
    env.close()


def _unblock(path):
    """Open a FIFO for writing and close it, so a reader blocked on it gets end of file."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_tools_refuse_special_and_oversized_files(mini_task, monkeypatch):
    env = SweEnv(bash_timeout_s=20)
    env.reset(mini_task)
    assert env.call("bash", {"command": "mkfifo pipe.py && echo ok"}).startswith("exit code 0")
    answers = {}

    def call(name, args):
        answers[name] = env.call(name, args)

    for name, args in (
        ("read_file", {"path": "pipe.py"}),
        ("edit_file", {"path": "pipe.py", "old_str": "a", "new_str": "b"}),
    ):
        worker = threading.Thread(target=call, args=(name, args), daemon=True)
        worker.start()
        worker.join(10)
        blocked = worker.is_alive()
        _unblock(env.repo / "pipe.py")
        worker.join(5)
        assert not blocked, f"{name} blocked on a FIFO"
        assert answers[name].startswith("error:") and "not a regular file" in answers[name], answers[name]
    (env.repo / "wide.py").write_text("x" * 5000 + "\nshort\n")
    shown = env.call("read_file", {"path": "wide.py"})
    assert "short" in shown and len(shown) < 3000 and "more characters" in shown, shown[:200]
    monkeypatch.setattr(snapshot, "MAX_FILE_BYTES", 1000)
    assert "larger than" in env.call("read_file", {"path": "wide.py"})
    assert "larger than" in env.call("edit_file", {"path": "wide.py", "old_str": "short", "new_str": "s"})
    env.close()


def test_the_reward_survives_special_files_in_the_repository(mini_task):
    env = SweEnv(bash_timeout_s=20)
    env.reset(mini_task)
    out = env.call(
        "bash",
        {"command": "rm tests/test_core.py && mkfifo tests/test_core.py pipe.py && ln -s /dev/zero zero.py "
         "&& ln -s ../outside minipkg/out.py && echo ok"},
    )  # fmt: skip
    assert out.startswith("exit code 0"), out
    reward = env.reward(Episode([], "done"))
    assert reward.value == 0.0 and reward.components == {"fail_to_pass": 0.0, "pass_to_pass": 1.0}, reward
    env.close()


def test_nul_bytes_in_arguments_are_error_texts(mini_task):
    env = SweEnv(bash_timeout_s=20)
    env.reset(mini_task)
    for name, args in (
        ("bash", {"command": "echo a\x00b"}),
        ("read_file", {"path": "minipkg/core.py\x00"}),
        ("edit_file", {"path": "minipkg/\x00core.py", "old_str": "a", "new_str": "b"}),
        ("run_tests", {"tests": ["tests/test_core.py\x00"]}),
    ):
        out = env.call(name, args)
        assert out.startswith("error:") and "NUL" in out, (name, out)
    env.close()


def test_lone_surrogates_in_arguments_are_error_texts_and_change_nothing(mini_task):
    """JSON's \\u escapes carry lone surrogates, which UTF-8 cannot encode: every tool answers with
    an error text (it never raises) and the file an edit named keeps its content."""
    env = SweEnv(bash_timeout_s=20)
    env.reset(mini_task)
    core = env.repo / "minipkg" / "core.py"
    before = core.read_bytes()
    for name, raw in (
        (
            "edit_file",
            '{"path": "minipkg/core.py", "old_str": "def total", "new_str": "def total  # \\ud83d"}',
        ),
        ("bash", '{"command": "echo \\ud800"}'),
        ("read_file", '{"path": "minipkg/\\ud800.py"}'),
        ("run_tests", '{"tests": ["tests/test_core.py::x\\ud800"]}'),
    ):
        out = env.call(name, json.loads(raw))
        assert out.startswith("error:") and "surrogate" in out, (name, out)
        out.encode("utf-8")
    assert core.read_bytes() == before
    env.close()


def test_an_edit_that_cannot_be_written_leaves_the_file_whole(minipkg, tmp_path):
    repo = materialize("minipkg==0.1", [], tmp_path / "repo")
    core = repo / "minipkg" / "core.py"
    core.chmod(0o640)
    with pytest.raises(snapshot.SnapshotError, match="not valid UTF-8"):
        snapshot.apply_edit(repo, snapshot.Edit("minipkg/core.py", "def total", "def total\ud83d"))
    assert core.read_text() == CORE
    snapshot.apply_edit(repo, snapshot.Edit("minipkg/core.py", "def total", "def total_"))
    assert "def total_(xs)" in core.read_text() and (core.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in core.parent.iterdir()) == ["__init__.py", "core.py"]


def test_the_scored_copy_is_the_snapshot_with_the_models_library_code(mini_task, tmp_path, monkeypatch):
    repo = materialize("minipkg==0.1", [], tmp_path / "repo")
    planted = {
        "minipkg/new.py": "NEW = 1\n",
        "minipkg/conftest.py": "X = 1\n",
        "tests/test_core.py": "def test_ok():\n    pass\n",
        "tests/helpers.py": "H = 1\n",
        "test_root.py": "def test_r():\n    pass\n",
        "pytest.ini": "[pytest]\n",
        "minipkg/data.txt": "data\n",
        "minipkg/__pycache__/core.cpython-311.pyc": "",
    }
    for rel, text in planted.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    os.mkfifo(repo / "minipkg" / "pipe.py")
    (repo / "minipkg" / "link.py").symlink_to("/etc/hostname")
    (repo / "minipkg" / "core.py").write_text("# the model's\n")
    dest = tmp_path / "scored"
    left_out = scoring_tree("minipkg==0.1", repo, dest, edited=[], tests=["tests/test_core.py"])
    assert sorted(left_out) == [
        "minipkg/pipe.py is not a regular file (a FIFO)",
        "path 'minipkg/link.py' is outside the repository",
    ]
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir()}
    assert files == set(MINIPKG) | {"minipkg/new.py"}
    assert (dest / "minipkg" / "core.py").read_text() == "# the model's\n"
    assert (dest / "tests" / "test_core.py").read_text() == MINIPKG["tests/test_core.py"]

    env = SweEnv()
    env.reset(mini_task)
    monkeypatch.setattr(snapshot, "MAX_SCORED_ENTRIES", 3)
    reward = env.reward(Episode([], "done"))
    assert reward.value == 0.0 and reward.reason.startswith("not scored: the repository has more than 3")
    env.close()


def test_the_bash_tool_cannot_read_the_task_answers(mini_task, tmp_path):
    """The shipped SWE tasks hold each bug's exact fix; a task file the host read holds the one of
    the episode: neither is readable from the repository's sandbox, nor is this project importable."""
    from dsv32.envs.base import load_tasks, save_tasks

    shipped = Path(snapshot.__file__).with_name("tasks.jsonl")
    user = Path("/var/tmp") / f"dsv32-test-swe-{os.getpid()}.jsonl"
    save_tasks([mini_task], user)
    try:
        (task,) = load_tasks(user)
        env = SweEnv(bash_timeout_s=20)
        env.reset(task)
        out = env.call("bash", {"command": f"cat {shipped} {user}; python -c 'import dsv32.envs.swe'"})
        env.close()
    finally:
        user.unlink()
    assert "No such file or directory" in out and "No module named 'dsv32" in out, out
    assert "return hi" not in out and "FAIL_TO_PASS" not in out, out
