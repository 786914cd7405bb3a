"""The sandbox against the attacks a user worries about: after each one the host process, a
neighbouring episode (a sandboxed program running meanwhile) and that episode's files are intact.

Each attack runs under every confining isolation that works here (bubblewrap and/or unshare); the
plain-rlimits fallback is tested for what it promises (limits, timeouts, the process group).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers.disk import FILL, allocated

from dsv32.envs import sandbox
from dsv32.envs.sandbox import SandboxError, launch, view, watch
from dsv32.paths import cache_dir

CONFINING = [k for k in ("bwrap", "unshare") if launch._works(k)]
if not CONFINING:
    pytest.skip("no confining sandbox works here (no bwrap, no user namespaces)", allow_module_level=True)

PY = sys.executable


@pytest.fixture(params=CONFINING)
def kind(request):
    return request.param


@pytest.fixture
def neighbour(tmp_path, kind):
    """Another episode: its work dir with a file, and a sandboxed program alive in it."""
    home = tmp_path / "neighbour"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    proc = sandbox.popen(
        [PY, "-c", "import time; time.sleep(60)"], cwd=home, timeout_s=60, memory_mb=256, kind=kind
    )
    yield home
    alive = proc.poll() is None
    sandbox.kill(proc)
    proc.wait()
    assert alive, "the neighbouring episode's process died"
    assert (home / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


def attack(code: str, workdir: Path, kind: str, **limits) -> sandbox.SandboxResult:
    workdir.mkdir(exist_ok=True)
    options = {"timeout_s": 3, "memory_mb": 512} | limits
    return sandbox.run([PY, "-c", code], cwd=workdir, kind=kind, **options)


def processes_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes():
                found.append(int(p.name))
        except OSError:
            continue
    return found


def test_runs_a_program_in_its_work_dir(tmp_path, kind):
    r = attack("import os; open('out.txt', 'w').write('hi'); print(os.getcwd())", tmp_path / "w", kind)
    assert r.ok and r.stdout.strip() == str((tmp_path / "w").resolve())
    assert (tmp_path / "w" / "out.txt").read_text() == "hi"
    assert r.isolation == kind and r.killed_reason is None


def test_fork_bomb(tmp_path, kind, neighbour):
    marker = uuid.uuid4().hex
    code = f"import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)  # {marker}"
    r = attack(code, tmp_path / "w", kind, timeout_s=3, processes=32)
    assert r.timed_out and r.killed_reason == "wall-time limit"
    assert processes_with(marker) == []  # the whole tree died with the sandbox
    assert sandbox.run(["true"], timeout_s=5, memory_mb=128, kind=kind).ok  # processes can still start


def test_memory_bomb(tmp_path, kind, neighbour):
    r = attack("a = []\nwhile True:\n    a.append(bytearray(10**7))", tmp_path / "w", kind, memory_mb=256)
    assert r.returncode != 0 and "MemoryError" in r.stderr


def test_infinite_loop_and_its_children_are_killed(tmp_path, kind, neighbour):
    marker = uuid.uuid4().hex
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {marker}'],"
        " start_new_session=True)\nwhile True:\n    pass"
    )
    r = attack(code, tmp_path / "w", kind, timeout_s=2)
    assert r.timed_out and r.returncode < 0
    assert processes_with(marker) == []  # even the child that left the process group


def test_cpu_limit(tmp_path, kind):
    r = attack("while True:\n    pass", tmp_path / "w", kind, timeout_s=30, cpu_s=1)
    assert not r.timed_out and r.killed_reason == "cpu-time limit" and r.returncode == -signal.SIGXCPU


def test_writing_outside_the_work_dir(tmp_path, kind, neighbour):
    targets = [neighbour / "notes.txt", neighbour / "new.txt", "/usr/evil", "/etc/evil"]
    targets.append(Path.cwd() / f"evil-{uuid.uuid4().hex}")
    code = (
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n        open(path, 'w').write('pwned')\n        print('written')\n"
        "    except OSError:\n        print('refused')\n"
    )
    r = attack(code, tmp_path / "w", kind)
    assert r.ok, r.stderr
    assert r.stdout.split()[:4] == ["refused"] * 4, r.stdout
    # the checkout is absent, or (a clone under /tmp) at most a path in the program's private /tmp:
    # nothing reaches the host's files
    assert not Path(targets[4]).exists()
    remount = sandbox.run(
        ["mount", "-o", "remount,rw", "/"], cwd=tmp_path / "w", timeout_s=5, memory_mb=128, kind=kind
    )
    assert remount.returncode != 0  # no capability to undo the read-only view


def test_file_size_limit(tmp_path, kind):
    r = attack("open('big', 'wb').write(b'x' * (4 << 20))", tmp_path / "w", kind, file_size_mb=1)
    assert r.returncode != 0 and (tmp_path / "w" / "big").stat().st_size <= 1 << 20


def test_socket_to_localhost(tmp_path, kind, neighbour):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
            "except OSError as err:\n    print('refused', err)"
        )
        r = attack(code, tmp_path / "w", kind)
        assert r.ok and r.stdout.startswith("refused")
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing reached the listener
        allowed = attack(code, tmp_path / "w", kind, network=True)
        assert allowed.stdout.startswith("connected")  # the same code reaches it when the network is on
        listener.accept()[0].close()


def test_huge_print(tmp_path, kind, neighbour):
    r = attack(
        "while True:\n    print('x' * 10000)", tmp_path / "w", kind, output_bytes=100_000, timeout_s=30
    )
    assert r.killed_reason == "output limit" and r.truncated and not r.timed_out
    assert len(r.stdout) < 100_200 and r.stdout.endswith("kept 100000]")


def test_killing_the_parent(tmp_path, kind, neighbour):
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, -1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as err:\n        print(err)\n"
        "print('done')"
    )
    r = attack(code, tmp_path / "w", kind)
    assert "done" in r.stdout  # the host pid is not visible, the namespace's init ignores the signal
    assert os.getpid() > 0  # and this test process is alive to check


def test_environment_is_fresh(tmp_path, kind, monkeypatch):
    monkeypatch.setenv("SECRET_API_KEY", "sk-leak")
    r = attack("import os; print(sorted(os.environ))", tmp_path / "w", kind, env={"EXTRA": "1"})
    assert "SECRET_API_KEY" not in r.stdout and "'EXTRA'" in r.stdout and "'HOME'" in r.stdout


@pytest.fixture
def home(monkeypatch):
    """A host user's home with secrets, outside /tmp (bwrap's fresh /tmp would hide it anyway)."""
    path = cache_dir(f"sandbox-test-home-{uuid.uuid4().hex}").resolve()
    (path / ".ssh").mkdir(parents=True)
    (path / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (path / "lib").mkdir()
    (path / "lib" / "homemod.py").write_text("VALUE = 42\n")
    (path / "data.txt").write_text("shared")
    monkeypatch.setenv("HOME", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_home_is_hidden_but_what_the_program_needs_from_it_is_not(home, kind):
    work = home / "episode"  # a work dir inside the home stays writable
    code = (
        "import os, homemod\n"
        "for path in ['.ssh/id_ed25519', '.bash_history']:\n"
        "    print(path, os.path.exists(os.path.join(HOME, path)))\n"
        "print('import', homemod.VALUE)\n"
        "print('readable', open(os.path.join(HOME, 'data.txt')).read())\n"
        "print('listing', sorted(os.listdir(HOME)))\n"
        "open('mine.txt', 'w').write('ok')\n"
        "try:\n    open(os.path.join(HOME, 'planted'), 'w')\nexcept OSError:\n    print('home read-only')\n"
    ).replace("HOME", repr(str(home)))
    r = attack(code, work, kind, env={"PYTHONPATH": str(home / "lib")}, readable=[str(home / "data.txt")])
    assert r.ok, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == [".ssh/id_ed25519 False", ".bash_history False"]
    assert lines[2:5] == ["import 42", "readable shared", "listing ['data.txt', 'episode', 'lib']"]
    assert lines[5] == "home read-only"
    assert (work / "mine.txt").read_text() == "ok" and not (home / "planted").exists()
    assert (home / ".ssh" / "id_ed25519").read_text() == "PRIVATE KEY"
    assert not any(v == str(home) for v in sandbox.isolation(kind).visible)


def test_a_home_given_as_the_work_dir_is_the_program_s(home, kind):
    r = sandbox.run(
        [PY, "-c", "open('made', 'w').write(open('data.txt').read())"],
        cwd=home,
        timeout_s=5,
        memory_mb=256,
        kind=kind,
    )
    assert r.ok, r.stderr
    assert (home / "made").read_text() == "shared"


def test_a_python_installed_in_the_home_keeps_its_packages(home, kind, tmp_path):
    # the host runs from a venv inside the home, with an editable-style .pth path there too
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "inside.py").write_text("V = 'site'\n")
    (home / "src").mkdir()
    (home / "src" / "editable.py").write_text("V = 'pth'\n")
    (site / "_editable.pth").write_text(f"{home / 'src'}\n")
    program = (
        f"import inside, editable, os; print(inside.V, editable.V, os.path.exists({str(home / '.ssh')!r}))"
    )
    host = (
        "import sys\nfrom dsv32.envs import sandbox\n"
        f"r = sandbox.run([sys.executable, '-c', {program!r}], cwd={str(tmp_path)!r}, timeout_s=10, "
        f"memory_mb=512, kind={kind!r})\n"
        "print(r.stdout.strip() or r.stderr)"
    )
    ours = os.pathsep.join(
        p for p in sys.path if p and (Path(p, "dsv32").is_dir() or Path(p, "pydantic").is_dir())
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", host], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": ours, "HOME": str(home)},
    )  # fmt: skip
    assert done.stdout.strip() == "site pth False", done.stdout + done.stderr


def test_rlimits_fallback_still_limits(tmp_path):
    r = sandbox.run([PY, "-c", "while True: pass"], cwd=tmp_path, timeout_s=1, memory_mb=256, kind="rlimits")
    assert r.timed_out and r.isolation == "rlimits"
    r = sandbox.run([PY, "-c", "bytearray(10**9)"], cwd=tmp_path, timeout_s=5, memory_mb=256, kind="rlimits")
    assert "MemoryError" in r.stderr
    assert "NO ISOLATION" in sandbox.isolation("rlimits").note
    assert sandbox.isolation("rlimits").visible == ()


def test_stdin_exit_codes_and_missing_programs(tmp_path):
    r = sandbox.run(
        [PY, "-c", "import sys; print(sys.stdin.read()[::-1]); sys.exit(3)"],
        stdin="abc",
        timeout_s=5,
        memory_mb=256,
    )
    assert r.stdout == "cba\n" and r.returncode == 3 and not r.ok
    assert sandbox.run(["no-such-program-here"], timeout_s=5, memory_mb=128).returncode == 127


def test_bad_requests_are_typed_errors():
    with pytest.raises(SandboxError, match="choose one of"):
        sandbox.isolation("docker")
    with pytest.raises(SandboxError, match="positive"):
        sandbox.run(["true"], timeout_s=0, memory_mb=128)
    with pytest.raises(SandboxError, match="empty"):
        sandbox.run([], timeout_s=1, memory_mb=128)


def test_a_tree_deeper_than_the_recursion_limit_and_unreadable_dirs_are_cleaned_up(tmp_path, kind):
    code = (
        "import os\nos.mkdir('locked'); open('locked/f', 'w').write('x'); os.chmod('locked', 0o500)\n"
        "for i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nprint('deep')"
    )
    r = sandbox.run([PY, "-c", code], timeout_s=60, memory_mb=256, kind=kind)  # its own temporary work dir
    assert r.ok and r.stdout.strip() == "deep", r.stderr
    work = tmp_path / "w"
    r = attack(code, work, kind, timeout_s=60)
    assert r.ok
    sandbox.remove_tree(work)
    assert not work.exists()
    sandbox.remove_tree(work)  # already gone: nothing to do, no error


def test_the_program_cannot_forge_its_exit_status_or_trace_the_confine_stage(tmp_path, kind):
    # the confine stage (pid 1 of the namespace) reports the program's end on a pipe; the program
    # must reach neither that pipe (through /proc/1/fd) nor the process (ptrace)
    code = (
        "import ctypes, os, sys\n"
        "try:\n    fds = os.listdir('/proc/1/fd')\nexcept OSError:\n    fds = []\n"
        "for fd in fds:\n"
        "    try:\n        open(f'/proc/1/fd/{fd}', 'w').write('exit 0 ')\n        print('wrote', fd)\n"
        "    except OSError:\n        pass\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ptrace', libc.ptrace(16, 1, None, None))\n"  # PTRACE_ATTACH
        "sys.exit(3)"
    )
    r = attack(code, tmp_path / "w", kind)
    assert "wrote" not in r.stdout and "ptrace -1" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 3


def test_mount_points_with_escaped_and_non_ascii_names_are_read_back_exactly():
    from dsv32.envs.sandbox import confine

    # mountinfo escapes space, tab, newline and backslash as octal and writes other bytes raw
    assert confine._unescape(b"/tmp/mnt\\040sp\\011t\\134b-\xc3\xa9") == "/tmp/mnt sp\tt\\b-é"
    assert confine._unescape(b"/data/\xff") == os.fsdecode(b"/data/\xff")  # not UTF-8: still that path
    assert os.path.isdir(confine._mount_points()[0])


def test_other_episodes_and_host_sockets_are_out_of_reach(tmp_path, kind, neighbour):
    # a Unix socket is reachable through a read-only mount: the host's temporary directories (other
    # episodes' work dirs, a Jupyter kernel's ipc sockets) and /run must not be there at all
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp_path / "host.sock")
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(0.5)
    code = (
        "import os, socket\n"
        f"print('neighbour', os.path.exists({str(neighbour)!r}))\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"try:\n    s.connect({path!r}); s.sendall(b'hello'); print('connected')\nexcept OSError as e:\n"
        "    print('refused', type(e).__name__)\n"
        "print('run', sorted(os.listdir('/run')) if os.path.isdir('/run') else None)\n"
    )
    try:
        r = attack(code, tmp_path / "w", kind)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert r.ok, r.stderr
    assert r.stdout.splitlines() == ["neighbour False", "refused FileNotFoundError", "run None"]
    assert not any(v == "/tmp" for v in sandbox.isolation(kind).visible)


def test_a_sandboxed_program_dies_with_the_process_that_started_it(tmp_path, kind):
    marker = f"orphan-{uuid.uuid4().hex}"
    host = (
        "import sys, time\nfrom dsv32.envs import sandbox\n"
        f"sandbox.popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], cwd={str(tmp_path)!r}, "
        f"timeout_s=60, memory_mb=256, kind={kind!r})\n"
        "time.sleep(1)\nprint('started', flush=True)\n"
    )
    done = subprocess.run([PY, "-c", host], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "started", done.stderr
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(marker)  # the host exited without stopping it: it went with the host


def test_dev_is_read_only_but_a_private_dev_shm(kind, tmp_path):
    """/dev holds no file the program made (its RAM would be the host's); /dev/shm is a private
    writable tmpfs (multiprocessing's locks need it) — or, with a bubblewrap too old to size one,
    read-only — and never the host's."""
    code = (
        "import os\n"
        "for path in ('/dev/planted', '/dev/shm/planted'):\n"
        "    try:\n"
        "        open(path, 'w').close(); print(path, 'written')\n"
        "    except OSError as err:\n"
        "        print(path, err.strerror)\n"
        "open('/dev/null', 'w').write('x')\n"
    )
    r = attack(code, tmp_path / "w", kind)
    assert r.returncode == 0, r.stderr
    assert "/dev/planted Read-only file system" in r.stdout, r.stdout
    shm = "written" if kind == "unshare" or launch._bwrap_sizes_tmpfs() else "Read-only file system"
    assert f"/dev/shm/planted {shm}" in r.stdout, r.stdout
    assert not os.path.exists("/dev/shm/planted")


def test_the_project_source_and_the_task_files_read_are_hidden(kind, tmp_path):
    """Task answers stay out of reach: the project's source (the shipped task sets, the code that
    generates tasks, its git history) is hidden, and a task file the host read is /dev/null there
    (read as empty, or refused where devices may not be opened)."""
    from dsv32.envs.base import load_tasks

    shipped = Path(sandbox.__file__).parents[1] / "swe" / "tasks.jsonl"
    user = Path("/var/tmp") / f"dsv32-test-tasks-{uuid.uuid4().hex}.jsonl"
    user.write_text('{"id": "t", "prompt": "p", "answer": "the secret answer"}\n')
    try:
        load_tasks(user)
        code = (
            "import importlib.util, sys\n"
            f"for path in ({str(shipped)!r}, {str(user)!r}):\n"
            "    try:\n"
            "        print(path, repr(open(path).read(40)))\n"
            "    except OSError as err:\n"
            "        print(path, err.strerror)\n"
            "try:\n    import dsv32.envs.swe\n    print('dsv32.envs.swe importable: True')\n"
            "except ImportError:\n    print('dsv32.envs.swe importable: False')\n"
        )
        r = attack(code, tmp_path / "w", kind)
        named = attack(code, tmp_path / "w", kind, readable=[str(user)])  # even when a caller names it
    finally:
        user.unlink()
    assert r.returncode == 0, r.stderr
    assert f"{shipped} No such file or directory" in r.stdout, r.stdout
    assert f"{user} No such file or directory" in r.stdout, r.stdout  # /var is not in the view
    assert f"{user} ''" in named.stdout or f"{user} Permission denied" in named.stdout, named.stdout
    assert "secret" not in r.stdout + named.stdout, r.stdout
    assert "dsv32.envs.swe importable: False" in r.stdout, r.stdout  # (single files bound in may remain)
    confine = os.path.realpath(sandbox.CONFINE)
    for project in sandbox.project_dirs():
        shown = [v for v in sandbox.isolation(kind).visible if view.under(v, [project])]
        # at most the confine stage (one file) and a Python installation (a virtual environment)
        assert all(v == confine or view.under(v, view._installations()) for v in shown), shown


def test_multiprocessing_works_and_dev_shm_is_bounded(kind, tmp_path):
    """A Lock and a Pool of 2 work (their semaphores live in /dev/shm); /dev/shm holds at most
    min(64 MB, memory_mb): the third 24 MB file does not fit."""
    if kind == "bwrap" and not launch._bwrap_sizes_tmpfs():
        pytest.skip("this bubblewrap cannot size a tmpfs: its sandbox's /dev/shm is read-only")
    code = (
        "import errno, multiprocessing as mp\n"
        "with mp.Lock():\n    pass\n"
        "with mp.Pool(2) as pool:\n    print(pool.map(abs, [-1, -2]))\n"
        "try:\n"
        "    for i in range(8):\n"
        "        with open(f'/dev/shm/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (24 << 20))\n"
        "except OSError as err:\n    print(errno.errorcode[err.errno], i)\n"
    )
    r = attack(code, tmp_path / "w", kind, timeout_s=30, memory_mb=512)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[1, 2]", "ENOSPC 2"]


@pytest.mark.parametrize("sizes", [True, False])
def test_the_bwrap_dev_shm_is_sized_or_read_only(tmp_path, monkeypatch, sizes):
    """bubblewrap 0.10+ gets --size before the /dev/shm tmpfs; an older one no tmpfs there at all,
    so /dev/shm is the fresh /dev's empty directory, remounted read-only with /dev. The unshare
    confine stage gets the same size."""
    monkeypatch.setattr(launch, "_bwrap_sizes_tmpfs", lambda: sizes)
    argv = sandbox.command_prefix(cwd=tmp_path, memory_mb=32, timeout_s=5, kind="bwrap")
    shm = ["--perms", "1777", "--size", str(32 << 20), "--tmpfs", "/dev/shm"]
    at = [i for i in range(len(argv)) if argv[i : i + len(shm)] == shm]
    dev, read_only = (
        argv.index("--dev"),
        [i for i in range(len(argv)) if argv[i : i + 2] == ["--remount-ro", "/dev"]],
    )
    assert argv[dev + 1] == "/dev" and len(read_only) == 1
    if sizes:
        assert len(at) == 1 and dev < at[0] < read_only[0]
    else:
        assert at == [] and "/dev/shm" not in argv
    big = sandbox.command_prefix(cwd=tmp_path, memory_mb=4096, timeout_s=5, kind="bwrap")
    assert (str(64 << 20) in big) == sizes  # min(64 MB, memory_mb)
    spec = json.loads(sandbox.command_prefix(cwd=tmp_path, memory_mb=32, timeout_s=5, kind="unshare")[-1])
    assert ["dev", "/dev", 32 << 20] in spec["view"]


def test_writing_past_the_disk_quota(tmp_path, kind, neighbour):
    """Files each just under the file-size cap, 512 MB in all, past a 16 MB quota: the program is
    killed and what stays is the quota and what it wrote between two checks — a 20 ms poll of the
    free space and a walk of a few files, some tens of MB at page-cache speed (about 2 GB/s on one
    core). 128 MB leaves room for a loaded machine and is a quarter of what it would write."""
    work = tmp_path / "w"
    r = attack(FILL, work, kind, timeout_s=60, file_size_mb=1, disk_mb=16)
    assert r.killed_reason == "disk limit" and not r.timed_out and r.returncode < 0
    assert allocated(work) <= (16 + 128) << 20


def test_a_program_within_its_disk_quota_is_untouched(tmp_path, kind):
    """4 MB written and a sparse file 60 MB long (one block on disk), watched for a second, in a
    16 MB quota: the allocated size counts, not the length."""
    code = (
        "import os, time\nopen('data', 'wb').write(b'x' * (4 << 20))\n"
        "with open('sparse', 'wb') as f:\n    f.truncate(60 << 20)\n    f.write(b'x')\n"
        "time.sleep(1)\nprint(os.path.getsize('sparse') >> 20)"
    )
    r = attack(code, tmp_path / "w", kind, timeout_s=30, disk_mb=16)
    assert r.ok and r.killed_reason is None and r.stdout == "60\n", r.stderr
    assert (tmp_path / "w" / "data").stat().st_size == 4 << 20


def test_a_work_dir_left_past_its_quota_is_reported_and_not_run_again(tmp_path, kind):
    work = tmp_path / "w"
    r = attack("open('big', 'wb').write(b'x' * (3 << 20))", work, kind, disk_mb=2)  # and exits at once
    assert r.killed_reason == "disk limit"  # killed on the way, or found past it after its exit
    r = attack("open('ran', 'w').close()", work, kind, disk_mb=2)
    assert r.returncode == 126 and r.killed_reason == "disk limit" and "was not run" in r.stderr
    assert not (work / "ran").exists()
    with pytest.raises(SandboxError, match="positive"):
        sandbox.run(["true"], timeout_s=1, memory_mb=128, disk_mb=0)


HOLD = {
    "open": "f = tempfile.TemporaryFile()\n    f.write(BLOCK)\n    f.flush()\n    held.append(f)",
    "mapped": (  # mapped, its descriptor closed and its name removed: only the mapping holds it
        "fd = os.open(f'm{i}', os.O_RDWR | os.O_CREAT)\n    os.write(fd, BLOCK)\n"
        "    held.append(libc.mmap(None, len(BLOCK), 1, 1, fd, 0))\n    os.close(fd)\n    os.unlink(f'm{i}')"
    ),
}


@pytest.mark.parametrize("how", sorted(HOLD))
def test_deleted_files_the_program_holds_count(tmp_path, kind, how):
    code = (
        "import ctypes, os, tempfile, time\n"
        "libc = ctypes.CDLL(None)\nlibc.mmap.restype = ctypes.c_void_p\n"
        "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
        "BLOCK, held = b'x' * ((1 << 20) - 1), []\n"
        f"for i in range(64):\n    {HOLD[how]}\n"
        "print('held', len(os.listdir('.')), flush=True)\ntime.sleep(60)"
    )
    r = attack(code, tmp_path / "w", kind, timeout_s=30, file_size_mb=1, disk_mb=16)
    assert r.killed_reason == "disk limit" and not r.timed_out, r.stdout + r.stderr
    assert allocated(tmp_path / "w") <= 1 << 20  # held files went with it; at most the one it was writing


def test_a_flood_of_empty_files_counts(tmp_path, kind):
    """Each name counts at least 16 KiB (an inode's share of a disk): 16 MB is about a thousand."""
    code = "import time\nfor i in range(100_000):\n    open(f'e{i}', 'w').close()\ntime.sleep(60)"
    r = attack(code, tmp_path / "w", kind, timeout_s=60, disk_mb=16)
    assert r.killed_reason == "disk limit" and not r.timed_out
    assert len(os.listdir(tmp_path / "w")) < 100_000


def package_copy(folder: Path) -> Path:
    """This package copied into ``folder``, readable by every user (the checkout may lie in a
    directory only its owner may enter, such as a clone under ``mktemp -d``)."""
    shutil.copytree(Path(sandbox.__file__).parents[2], folder / "dsv32")
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return folder


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to be another user")
def test_a_directory_its_owner_made_unreadable_is_counted_and_left_as_it_was():
    """A host user (not root, who reads anything) counts what a program hid in a directory without
    read permission (0o300) or without any (0o000, inside it), and leaves their modes as they were."""
    base = Path("/var/tmp") / f"dsv32-test-unreadable-{uuid.uuid4().hex}"
    try:
        (base / "hidden" / "locked").mkdir(parents=True)
        (base / "hidden" / "a").write_bytes(b"x" * (2 << 20))
        (base / "hidden" / "locked" / "b").write_bytes(b"x" * (3 << 20))
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534)
        os.chmod(base / "hidden" / "locked", 0o000)
        os.chmod(base / "hidden", 0o300)
        source = package_copy(Path(f"{base}-src"))
        measure = f"import sys; sys.path.insert(0, {str(source)!r}); from dsv32.envs import sandbox; print(sandbox.disk_usage([{str(base)!r}]))"
        done = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", PY, "-c", measure],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) >= 5 << 20
        assert (base / "hidden").stat().st_mode & 0o777 == 0o300
        assert (base / "hidden" / "locked").stat().st_mode & 0o777 == 0o000
    finally:
        sandbox.remove_tree(base)
        sandbox.remove_tree(f"{base}-src")


def spawn(count: int) -> str:
    """A program that starts ``count`` sleeping processes and says how many it started."""
    return (
        "import subprocess\nstarted = []\ntry:\n"
        f"    for i in range({count}):\n"
        "        started.append(subprocess.Popen(['sleep', '30']))\n"
        "except OSError as err:\n    print('stopped', len(started), err.errno)\nelse:\n    print('started', len(started))\n"
        "for p in started:\n    p.kill()\n"
    )


def test_the_process_limit_holds_whoever_runs_the_host(tmp_path, kind):
    """400 processes cannot start under a limit of 64, also when the host runs as root (whom the
    kernel exempts from RLIMIT_NPROC: the sandbox runs as a user id of its own then); and a process
    outside the sandbox still starts processes while a fork bomb runs."""
    r = attack(spawn(400), tmp_path / "w", kind, timeout_s=30, processes=64)
    assert r.ok, r.stderr
    word, count, errno_ = r.stdout.split()
    assert word == "stopped" and int(count) < 64 and errno_ == "11", r.stdout  # EAGAIN
    bomb = sandbox.popen(
        [PY, "-c", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"],
        cwd=tmp_path / "w", timeout_s=30, memory_mb=256, processes=32, kind=kind,
    )  # fmt: skip
    try:
        time.sleep(1)
        assert bomb.poll() is None  # it is running, at its limit
        assert all(subprocess.run(["true"]).returncode == 0 for _ in range(20))
    finally:
        sandbox.kill(bomb)
        bomb.wait()
    assert "RLIMIT_NPROC" in sandbox.isolation(kind).processes
    if os.geteuid() == 0:
        assert "user id of the sandbox's own" in sandbox.isolation(kind).processes


def test_files_the_program_writes_are_the_host_s_to_read_and_remove(tmp_path, kind):
    work = tmp_path / "w"
    work.mkdir()
    (work / "given.txt").write_text("from the host")
    r = attack("import os\nos.makedirs('d/e')\nopen('d/e/f', 'w').write(open('given.txt').read() + '!')\n"
               "open('given.txt', 'a').write(' and the program')", work, kind)  # fmt: skip
    assert r.ok, r.stderr
    assert (work / "d" / "e" / "f").read_text() == "from the host!"
    assert (work / "given.txt").read_text() == "from the host and the program"
    sandbox.remove_tree(work)
    assert not work.exists()


def test_no_nested_user_namespaces(tmp_path, kind):
    if kind == "bwrap" and not launch.bwrap_has("--disable-userns"):
        pytest.skip("this bubblewrap has no --disable-userns")
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for flags in (0x10000000, 0x10000000 | 0x00020000 | 0x40000000):\n"  # NEWUSER (| NEWNS | NEWNET)
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0 if libc.unshare(flags) == 0 else ctypes.get_errno())\n"
        "    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    r = attack(code, tmp_path / "w", kind)
    assert r.ok, r.stderr
    assert all(int(code) != 0 for code in r.stdout.split()), r.stdout  # refused (ENOSPC or EPERM)
    assert len(r.stdout.split()) == 2


def test_the_host_s_secrets_in_etc_are_not_there(tmp_path, kind):
    code = (
        "import os\n"
        "for path in ('/etc/shadow', '/etc/gshadow', '/etc/ssh', '/etc/sudoers'):\n"
        "    print(path, os.path.exists(path))\n"
        "print(open('/etc/passwd').read().count(':x:'))\n"
        "print(os.path.exists('/etc/hosts') or not os.path.exists('/etc'))\n"
    )
    r = attack(code, tmp_path / "w", kind)
    assert r.ok, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:4] == [f"{p} False" for p in ("/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/sudoers")]
    assert lines[4:] == ["2", "True"]  # a synthetic passwd: root and nobody


def test_a_host_service_socket_outside_the_work_dir_is_unreachable(tmp_path, kind):
    path = f"/var/tmp/dsv32-test-{uuid.uuid4().hex[:12]}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(0.5)
    code = (
        "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"try:\n    s.connect({path!r}); s.sendall(b'hello'); print('connected')\n"
        "except OSError as e:\n    print('refused', type(e).__name__)\n"
    )
    try:
        r = attack(code, tmp_path / "w", kind)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
        os.unlink(path)
    assert r.stdout.strip() == "refused FileNotFoundError", r.stdout + r.stderr


def test_answers_in_the_cache_and_an_output_dir_are_out_of_reach(tmp_path, kind, monkeypatch):
    """With the cache and a run's output directory outside the home, a program can neither read,
    copy nor grep what they hold (the pristine source, a task's answer)."""
    base = Path("/var/tmp") / f"dsv32-test-answers-{uuid.uuid4().hex}"
    cache, out = base / "cache", base / "out"
    secret = f"ANSWER-{uuid.uuid4().hex}"
    for folder in (cache / "swe" / "pkg", out):
        folder.mkdir(parents=True)
    (cache / "swe" / "pkg" / "pristine.py").write_text(f"FIX = {secret!r}\n")
    (out / "tasks_heldout.jsonl").write_text(json.dumps({"prompt": "p", "answer": secret}) + "\n")
    monkeypatch.setenv("DSV32_CACHE_DIR", str(cache))
    assert cache_dir() == cache
    code = (
        "import os, shutil, subprocess\n"
        f"for path in ({str(cache / 'swe' / 'pkg' / 'pristine.py')!r}, {str(out / 'tasks_heldout.jsonl')!r}):\n"
        "    try:\n        print(open(path).read())\n    except OSError as e:\n        print('read', e.strerror)\n"
        "    try:\n        shutil.copy(path, 'copy')\n        print(open('copy').read())\n"
        "    except OSError as e:\n        print('copy', e.strerror)\n"
        # a checkout under one of these places shows its virtualenv, gigabytes that hold no answer
        "print(subprocess.run(['grep', '-r', '--exclude-dir=.venv', 'ANSWER-', '/var', '/srv', '/opt', '/home', '/mnt',"
        " '/root', '/run', '/tmp'],"
        " capture_output=True, text=True).stdout)\n"
    )
    try:
        r = attack(code, tmp_path / "w", kind, timeout_s=30)
    finally:
        shutil.rmtree(base)
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout and r.stdout.count("No such file or directory") == 4, r.stdout
    shown = sandbox.isolation(kind).visible
    for place in ("/var", "/srv", "/opt", "/home", "/mnt", "/root", "/run", str(cache), str(out)):
        assert not any(v == place for v in shown)


AS_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def python_for_nobody() -> str | None:
    """A Python interpreter uid 65534 may run (this one may lie where only root may enter)."""
    for python in dict.fromkeys([PY, shutil.which("python3") or "", "/usr/bin/python3"]):
        probe = [*AS_NOBODY, "env", "-i", python, "-c", "import json"]
        if python and subprocess.run(probe, capture_output=True, cwd="/").returncode == 0:
            return python
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to be another user")
def test_the_process_limit_holds_for_an_unprivileged_host(kind):
    """The same 400-process spawn from a host process that is not root: stopped at the limit, the
    count kept in the sandbox's user namespace."""
    python = python_for_nobody()
    if python is None:
        pytest.skip("no Python interpreter uid 65534 may run")
    base = Path("/var/tmp") / f"dsv32-test-nobody-{uuid.uuid4().hex}"
    try:
        source = package_copy(base / "src")
        work = base / "w"
        work.mkdir()
        os.chown(work, 65534, 65534)
        host = (
            "import sys\nfrom dsv32.envs import sandbox\n"
            f"r = sandbox.run([sys.executable, '-c', {spawn(400)!r}], cwd={str(work)!r}, timeout_s=30, "
            f"memory_mb=512, processes=64, kind={kind!r})\n"
            "print(r.stdout.strip() or r.stderr.strip())\nprint(sandbox.isolation({kind!r}).processes)"
        ).replace("{kind!r}", repr(kind))
        done = subprocess.run(
            [*AS_NOBODY, "env", "-i", f"PATH={os.defpath}", "HOME=/nonexistent", f"PYTHONPATH={source}",
             python, "-c", host],
            capture_output=True, text=True, timeout=120, cwd=str(base),
        )  # fmt: skip
    finally:
        sandbox.remove_tree(base)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split()[0] == "stopped", done.stdout + done.stderr
    assert int(lines[0].split()[1]) < 64 and "own user namespace" in lines[1]


def test_a_private_directory_a_caller_names_is_readable(tmp_path, kind):
    """A directory made by ``mkdtemp`` (0700, the host's) given as ``readable``: its files read as
    their own modes say, whichever user the program runs as; a file only its owner may read stays so
    when that owner is not the program's user."""
    private = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        (private / "sub").mkdir(mode=0o700)
        (private / "sub" / "data.txt").write_text("shared")
        (private / "own.txt").write_text("owner only")
        os.chmod(private / "own.txt", 0o600)
        code = (
            f"import os\nprint(open({str(private / 'sub' / 'data.txt')!r}).read())\n"
            f"print(sorted(os.listdir({str(private)!r})))\n"
            f"try:\n    print(open({str(private / 'own.txt')!r}).read())\n"
            "except OSError as e:\n    print(e.strerror)\n"
        )
        r = attack(code, tmp_path / "w", kind, readable=[str(private)])
    finally:
        shutil.rmtree(private)
    assert r.ok, r.stderr
    own = "Permission denied" if os.geteuid() == 0 else "owner only"  # root: the program is another id
    assert r.stdout.splitlines() == ["shared", "['own.txt', 'sub']", own]


def test_the_sandbox_user_ids_are_checked(monkeypatch):
    monkeypatch.setenv("DSV32_SANDBOX_UIDS", "100:x")
    with pytest.raises(SandboxError, match="BASE:COUNT"):
        sandbox.sandbox_uids()
    monkeypatch.setenv("DSV32_SANDBOX_UIDS", f"{2**32 - 10}:100")
    with pytest.raises(SandboxError, match="must lie in"):
        sandbox.sandbox_uids()
    monkeypatch.setenv("DSV32_SANDBOX_UIDS", "3000000000:16")
    assert sandbox.sandbox_uids() == (3_000_000_000, 16)
    if Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]:  # every id exists
        assert sandbox.own_user_ids() == (os.geteuid() == 0)


def test_a_path_reached_through_a_symlink_under_tmp_is_there(tmp_path, kind):
    """A ``readable`` path named through a symlink in the host's /tmp: the link is in the program's
    private /tmp and leads to the file."""
    target = Path("/var/tmp") / f"dsv32-test-target-{uuid.uuid4().hex}"
    target.write_text("through the link")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    try:
        r = attack(f"print(open({str(link)!r}).read())", tmp_path / "w", kind, readable=[str(link)])
    finally:
        target.unlink()
    assert r.ok and r.stdout.strip() == "through the link", r.stdout + r.stderr


def test_a_python_started_through_a_relative_path_runs_sandboxed_programs_and_kernels(tmp_path, kind):
    """``sys.executable`` is the path Python was started by (``benchmarks/../.venv/bin/python``); the
    sandbox's view holds real paths only, so the confined program must be run by a normalised one."""
    roundabout = os.path.relpath(PY, tmp_path)  # Python joins a relative argv[0] to the cwd as it is
    script = (
        "import json, sys, tempfile\n"
        "from dsv32.envs import sandbox\n"
        "from dsv32.envs.interpreter.kernel import SandboxedKernel\n"
        f"kind = {kind!r}\n"
        "done = sandbox.run([sys.executable, '-c', 'print(6 * 7)'], timeout_s=20, memory_mb=512, kind=kind)\n"
        "with SandboxedKernel(kind=kind, startup_timeout_s=30) as kernel:\n"
        "    cell = kernel.execute('21 * 2').text\n"
        "print(json.dumps([sys.executable, done.returncode, done.stdout, cell, kernel.restarts]))\n"
    )
    out = subprocess.run(
        [roundabout, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    executable, code, stdout, cell, restarts = json.loads(out.stdout.strip().splitlines()[-1])
    assert ".." in executable  # the case under test: the unnormalised path
    assert (code, stdout.strip()) == (0, "42")
    assert cell.strip() == "42" and restarts == 0


def test_release_removes_the_process_s_sandbox_files_and_the_next_sandbox_makes_them_again(tmp_path, kind):
    first = attack("print('one')", tmp_path / "a", kind)
    folder = os.path.dirname(launch._etc_files()["/etc/passwd"])
    sandbox.release()
    assert first.stdout.strip() == "one" and not os.path.exists(folder)
    second = attack("import pwd; print(pwd.getpwuid(0).pw_name)", tmp_path / "b", kind)
    assert second.returncode == 0, second.stderr
    assert os.path.isfile(launch._etc_files()["/etc/passwd"])


def test_many_disk_watches_share_one_thread_and_each_still_catches_its_own_program(tmp_path):
    """Fifty watches (a hundred kernels' worth would be the same): one watcher thread polls them
    all; the one whose directory passes its quota is stopped, the others are not, and each is let
    go when stopped."""
    sleeper = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        fired: list[int] = []
        dirs = [tmp_path / f"w{i}" for i in range(50)]
        watches = []
        for i, d in enumerate(dirs):
            d.mkdir()
            watches.append(sandbox.DiskWatch([d], 1 << 20, sleeper.pid, lambda i=i: fired.append(i)))
        for w in watches:
            w.start()
        names = [t.name for t in threading.enumerate()]
        assert names.count("dsv32-disk-watch") == 1
        (dirs[7] / "big").write_bytes(b"x" * (2 << 20))  # past its 1 MB quota
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert fired == [7] and watches[7].over and not any(w.over for i, w in enumerate(watches) if i != 7)
        watches[7].join(5)
        assert not watches[7].is_alive() and all(w.is_alive() for i, w in enumerate(watches) if i != 7)
        for w in watches:
            w.stop()
        for w in watches:
            w.join(5)
        assert not any(w.is_alive() for w in watches) and fired == [7]
        assert not watch._WATCHER._any.is_set()  # no watch left: the watcher sleeps, it does not poll
    finally:
        sleeper.kill()
        sleeper.wait()
