"""The code interpreter against hostile cells and impatient callers: calls that outlive the agent's
tool timeout, kernels started from short-lived threads, floods of output, restarts a cell tries to
poison, code that is not valid text. Each case loses nothing: the model reads a text, the next call
works, the host survives and nothing is left behind."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers.disk import FILL, allocated

from dsv32.agent import ScriptedBackend
from dsv32.agent.episode import run_episode
from dsv32.envs.base import Task
from dsv32.envs.interpreter import InterpreterEnv, SandboxedKernel
from dsv32.envs.interpreter.kernel import _Output
from dsv32.envs.sandbox import SandboxError

TASK = Task("t", "What is 41 + 1?", "42")


def calls(code: str) -> dict:
    call = {"type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}
    return {"reasoning_content": "computing", "tool_calls": [call]}


def tool_texts(trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


@pytest.fixture
def env():
    e = InterpreterEnv(memory_mb=1024)
    yield e
    e.close()


def test_variables_survive_calls_through_the_agents_tool_threads(env):
    """Each agent tool call runs in its own short-lived thread; the kernel lives on."""
    replies = [calls("x = 41"), calls("x + 1"), {"content": "\\boxed{42}"}]
    trajectory, reward = run_episode(ScriptedBackend(replies), env, TASK, tool_timeout_s=60)
    assert tool_texts(trajectory) == ["[no output]", "42"]
    assert reward.value == 1.0 and env.state()["kernel_restarts"] == 0


def test_a_call_past_the_tool_timeout_does_not_mix_with_the_next(env):
    """An agent that stops waiting before the kernel's limits (here: told no bound, so its own 4 s
    apply) abandons the loop at 4 s; the kernel interrupts it at 5 s; the next call waits for that
    and reads its own result only."""
    env.cell_timeout_s = 5
    env.call_bound_s = lambda name: None
    loop = "import time\nfor i in range(100):\n    print('tick', i, flush=True)\n    time.sleep(0.2)"
    replies = [calls("x = 41"), calls(loop), calls("print('second'); x + 1"), calls("x"), {"content": "42"}]
    trajectory, _ = run_episode(ScriptedBackend(replies), env, TASK, tool_timeout_s=4)
    first, looped, second, third = tool_texts(trajectory)
    assert first == "[no output]" and "timed out" in looped
    assert second == "second\n42" and third == "41"
    assert [c["status"] for c in env.state()["calls"]] == ["ok", "timeout", "ok", "ok"]


def test_a_cell_waits_for_the_running_one_or_says_the_kernel_is_busy():
    with SandboxedKernel(memory_mb=1024) as kernel:
        kernel.execute("x = 41")
        loop = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)"
        results = []
        worker = threading.Thread(target=lambda: results.append(kernel.execute(loop, timeout_s=3)))
        worker.start()
        time.sleep(0.5)
        start = time.monotonic()
        busy = kernel.execute("x + 1", wait_s=0.5)
        assert busy.status == "busy" and "not run" in busy.text and time.monotonic() - start < 2
        waited = kernel.execute("x + 1")  # waits for the loop's interrupt
        worker.join()
        assert waited.text == "42" and waited.status == "ok"
        (looped,) = results
        assert looped.status == "timeout" and "tick" in looped.text and "42" not in looped.text


def test_close_stops_a_running_cell_and_leaves_nothing(env):
    env.reset(TASK)
    env.call("python", {"code": "x = 1"})
    kernel = env.kernel
    workdir, owner = kernel.workdir, kernel._owner.thread
    worker = threading.Thread(target=env.call, args=("python", {"code": "while True: pass"}))
    worker.start()
    time.sleep(1)
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 10
    worker.join(10)
    assert not worker.is_alive() and not owner.is_alive() and not kernel.alive()
    assert workdir not in glob.glob("/tmp/dsv32-kernel-*")


def test_output_is_kept_bounded_while_it_arrives():
    output = _Output(1000)
    output.add("<start>")
    for i in range(200_000):  # 200 MB of output in all
        output.add(f"{i:>8}" + "z" * 992)
    output.add("<end>")
    kept = len(output.head) + output.tail_chars
    assert kept <= 2 * 1000 + 1000  # the head, and a tail no longer than one chunk past its size
    text = output.text()
    assert output.truncated and text.startswith("<start>") and text.endswith("z<end>")
    assert f"[... output truncated: {output.total - 1000} characters cut ...]" in text
    assert len(text) < 1100


PLANT = """\
import os, site
hang = "import time\\nwhile True:\\n    time.sleep(1)\\n"
profile = os.path.join(os.environ["IPYTHONDIR"], "profile_default")
os.makedirs(os.path.join(profile, "startup"), exist_ok=True)
for path in [os.path.join(profile, "startup", "00-hang.py"), os.path.join(profile, "ipython_kernel_config.py"),
             os.path.join(os.environ["HOME"], ".ipython", "profile_default", "startup", "00-hang.py"),
             "ipykernel_launcher.py", "zmq.py", "traitlets.py"]:  # the work dir is the current directory
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    open(path, "w").write(hang)
os.makedirs(site.getusersitepackages(), exist_ok=True)
open(os.path.join(site.getusersitepackages(), "hang.pth"), "w").write("import time; time.sleep(10**6)\\n")
open("mine.py", "w").write("VALUE = 7\\n")
'planted'
"""


def test_a_cell_cannot_make_the_kernel_restart_run_its_files():
    with SandboxedKernel(memory_mb=1024, startup_timeout_s=30) as kernel:
        assert kernel.execute(PLANT).text == "'planted'"
        start = time.monotonic()
        died = kernel.execute("import os\nos._exit(0)")
        assert died.status == "died" and "it was restarted" in died.text
        assert time.monotonic() - start < 25  # no startup file ran (one hangs for good)
        assert kernel.execute("1 + 1").text == "2" and kernel.alive()
        assert kernel.execute("import mine\nmine.VALUE").text == "7"  # cells import what they wrote


def test_a_failed_restart_is_a_text_and_a_later_cell_recovers(monkeypatch):
    # this kernel's directories only, in a short directory: its ZeroMQ ipc sockets live there, and a
    # socket's path must fit in 107 bytes (a pytest-xdist worker's tmp_path may not leave room)
    tmp_path = Path(tempfile.mkdtemp(prefix="k"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pattern = str(tmp_path / "dsv32-kernel-*")
    before = set(glob.glob(pattern))
    with SandboxedKernel(memory_mb=1024) as kernel:
        assert kernel.workdir.startswith(os.path.realpath(tmp_path))
        kernel.execute("x = 1")
        kernel._sandbox_options["memory_mb"] = 1  # no Python starts in 1 MB: every start fails
        died = kernel.execute("import os\nos._exit(0)")
        assert died.status == "died" and "could not be restarted" in died.text and not kernel.alive()
        again = kernel.execute("1 + 1")
        assert again.status == "died" and "this cell was not run" in again.text
        kernel._sandbox_options["memory_mb"] = 1024
        assert kernel.execute("1 + 1").text == "2" and kernel.alive()
        assert "NameError" in kernel.execute("x").text
    assert set(glob.glob(pattern)) <= before  # work dir and every start's dir removed
    shutil.rmtree(tmp_path, ignore_errors=True)


def _peak_rss_mib(fn):
    """``fn()``, and how far this process's resident memory rose above where it started (MiB)."""

    def rss() -> int:
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) >> 10

    start, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, max(peak[0] - start, 0)


def test_a_print_loop_keeps_host_and_kernel_memory_bounded():
    """Gigabytes of output: the host keeps what it shows, the kernel neither buffers nor keeps it
    (1 GB is enough), the loop is interrupted at its limit like any other."""
    with SandboxedKernel(memory_mb=1024) as kernel:
        kernel.execute("kept = 'yes'")
        flood, rise = _peak_rss_mib(lambda: kernel.execute("while True: print('z' * 10000)", timeout_s=5))
        assert rise < 100 and flood.truncated and "characters cut" in flood.text and len(flood.text) < 9000
        assert flood.status == "timeout" and flood.text.endswith("variables are kept]")
        again = kernel.execute(
            "import sys\nfor _ in range(3000):\n    sys.stdout.write('q' * 100_000)\n'done'"
        )
        assert again.status == "ok" and again.text.endswith("q'done'")  # 300 MB more, in the same kernel
        assert kernel.execute("kept").text == "'yes'" and kernel.restarts == 0


def test_huge_outputs_show_their_head_and_tail_and_keep_host_memory_bounded():
    with SandboxedKernel(memory_mb=2048) as kernel:
        cell = "print('<start>')\nprint('b' * 30_000_000)\nprint('<end>')\n'v' * 20_000_000"
        big, rise = _peak_rss_mib(lambda: kernel.execute(cell))
        assert rise < 100 and big.status == "ok" and big.truncated
        assert big.text.startswith("<start>\nbbb") and big.text.endswith("vvv'")  # its tail is the value's
        cut = (8 + 30_000_001 + 6 + 20_000_003) - 8000  # every line but what is shown
        assert f"\n[... output truncated: {cut} characters cut ...]\n" in big.text


@pytest.mark.xfail(
    reason="on some machines of this kind the kernel dies sending a 150 MB message, with any memory limit; "
    "the cause is not yet found",
    strict=False,
)
def test_messages_past_the_kernels_own_cut_are_refused_and_the_kernel_stays():
    """A cell that sends huge messages itself (not through print) gets a note; the host stays small
    and the next cell reads its own output."""
    send = (
        "k = get_ipython().kernel\n"
        "for i in range(2):\n"
        "    k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': 'c' * 150_000_000},\n"
        "                   parent=k.get_parent('shell'))\n"
        "'sent'"
    )
    with SandboxedKernel(memory_mb=2048) as kernel:
        kernel.execute("kept = 'yes'")
        raw, rise = _peak_rss_mib(lambda: kernel.execute(send))
        assert rise < 100 and raw.status == "ok" and "output was dropped" in raw.text
        assert kernel.execute("print('next'); kept").text == "next\n'yes'" and kernel.restarts == 0


def test_code_and_output_that_are_not_valid_text_are_readable_errors(env):
    env.reset(TASK)
    text = env.call("python", {"code": "x = 1\ns = '\ud800'"})
    assert text.startswith("SyntaxError") and "line 2" in text and "'\\ud800'" in text
    assert env.state()["kernel_alive"] is False  # not sent: no kernel was needed
    assert env.call("python", {"code": "s = '\\ud800'\nlen(s)"}) == "1"  # written as an escape, it runs
    # a kernel made to send one anyway (its own serializer escapes what UTF-8 refuses)
    hostile = (
        "import json\n"
        "get_ipython().kernel.session.pack = lambda o: json.dumps(o, default=str).encode()\n"
        "print('a\\ud800b')"
    )
    out = env.call("python", {"code": hostile})
    assert out == "a\\ud800b" and out.encode("utf-8")


def test_malformed_messages_are_skipped_and_a_failure_here_restarts_the_kernel():
    with SandboxedKernel(memory_mb=1024) as kernel:
        odd = (
            "k = get_ipython().kernel\n"
            "for kind, content in [('execute_result', {'data': 3}), ('status', {}), ('error', {'traceback': 5})]:\n"
            "    k.session.send(k.iopub_socket, kind, content, parent=k.get_parent('shell'))\n"
            "print('fine')"
        )
        r = kernel.execute(odd)
        assert r.status == "ok" and r.text.endswith("fine") and kernel.restarts == 0

        def broken(*args, **kwargs):
            raise RuntimeError("socket trouble")

        kernel.kc.get_iopub_msg = broken
        r = kernel.execute("1 + 1")
        assert r.status == "died" and "RuntimeError: socket trouble" in r.text and "restarted" in r.text
        assert kernel.execute("1 + 1").text == "2" and kernel.restarts == 1


def test_a_process_that_exits_without_closing_leaves_no_kernel_or_directory(tmp_path):
    script = tmp_path / "unclosed.py"
    script.write_text(
        "from dsv32.envs.base import Task\n"
        "from dsv32.envs.interpreter import InterpreterEnv\n"
        "env = InterpreterEnv(memory_mb=1024)\n"
        "env.reset(Task('t', 'q', '1'))\n"
        "print(env.call('python', {'code': 'open(\"f.txt\", \"w\").write(\"x\")'}))\n"
        "print(env.kernel.workdir, env.kernel._run_dir, flush=True)\n"
        "raise SystemExit(3)  # no env.close()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    result, dirs = done.stdout.splitlines()
    workdir, run_dir = dirs.split()
    assert result == "1" and workdir.startswith("/tmp/dsv32-kernel-") and "-run-" in run_dir
    time.sleep(0.5)
    assert not os.path.exists(workdir) and not os.path.exists(run_dir)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert run_dir not in ps  # its kernel died with the process


LATER = (  # a thread that fills the work dir once the host says so (the file 'go'), after its cell ended
    "import os, threading, time\n"
    "def fill():\n"
    "    while not os.path.exists('go'):\n        time.sleep(0.05)\n"
    "    for i in range(512):\n        open(f'g{i}', 'wb').write(b'x' * ((1 << 20) - 1))\n"
    "threading.Thread(target=fill, daemon=True).start()\n'waiting'"
)


def test_a_cell_writing_past_the_disk_quota_gets_a_fresh_kernel_and_work_dir():
    """A cell, then a thread between cells, fill the work dir past its quota: the kernel is killed,
    its work dir emptied, the kernel restarted, and the model reads why; close removes the work dir."""
    env = InterpreterEnv(memory_mb=1024, disk_mb=16)
    try:
        env.reset(TASK)
        assert env.call("python", {"code": "x = 41\nopen('notes.txt', 'w').write('mine')"}) == "4"
        workdir = env.kernel.workdir
        text = env.call("python", {"code": FILL})
        assert text == (
            "[the files in the work dir went past its disk quota of 16 MB: the Python kernel was stopped "
            "and the work dir emptied; it was restarted: variables and files are lost]"
        )
        assert os.listdir(workdir) == [] and env.state()["calls"][-1]["status"] == "died"
        assert "NameError" in env.call("python", {"code": "x"})
        assert env.call("python", {"code": LATER}) == "'waiting'"
        kernel = env.kernel
        open(os.path.join(workdir, "go"), "w").close()
        for _ in range(1200):  # the watch kills it (within a minute, on the slowest machine)
            if not kernel.alive():
                break
            time.sleep(0.05)
        text = env.call("python", {"code": "6 * 7"})
        assert text.startswith(
            "[before this cell, the files in the work dir went past its disk quota of 16 MB"
        )
        assert text.endswith("variables and files are lost]\n42")
        assert env.state()["kernel_restarts"] == 2 and allocated(workdir) < 16 << 20
    finally:
        env.close()
    assert not os.path.exists(workdir)


def test_a_kernel_does_not_start_in_a_given_work_dir_past_its_quota(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * (3 << 20))
    with pytest.raises(
        SandboxError, match="not started: the files in the work dir are past its disk quota of 2 MB"
    ):
        SandboxedKernel(workdir=str(tmp_path), memory_mb=1024, disk_mb=2)
    assert (tmp_path / "big").stat().st_size == 3 << 20  # the caller's files are left as they were


def test_checking_answers_leaves_the_users_logging_configuration_alone():
    """The verifier runs math-verify in this process (main thread) and in its worker pool (other
    threads); neither changes a logger the user configured, nor logging's global switch."""
    import logging
    import threading

    from dsv32.envs.interpreter.verify import math_equal

    names = ["", "math_verify", "math_verify.grader", "math_verify.parser", "latex2sympy2_extended", "sympy"]
    handler = logging.NullHandler()
    saved = {n: logging.getLogger(n).level for n in names}
    try:
        for n in names:
            logging.getLogger(n).setLevel(logging.DEBUG)
        logging.getLogger("math_verify").addHandler(handler)
        state = {n: (logging.getLogger(n).level, logging.getLogger(n).disabled, logging.getLogger(n).handlers[:])
                 for n in names}  # fmt: skip
        disable = logging.root.manager.disable
        assert math_equal("\\frac{1}{2}", "0.5") and not math_equal("2", "3")
        worker = threading.Thread(target=lambda: math_equal("1,000", "1000"))
        worker.start()
        worker.join(60)
        after = {n: (logging.getLogger(n).level, logging.getLogger(n).disabled, logging.getLogger(n).handlers[:])
                 for n in names}  # fmt: skip
        assert after == state and logging.root.manager.disable == disable
    finally:
        logging.getLogger("math_verify").removeHandler(handler)
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def test_the_kernel_starts_without_the_debugger_and_still_imports_from_its_work_dir():
    """The kernel is ipykernel without debugpy (never imported, so never a debug channel); the
    cells still see the work dir's modules and the usual IPython behaviour."""
    with SandboxedKernel(startup_timeout_s=30) as kernel:
        assert (
            kernel.execute("import sys; print(sys.modules.get('debugpy', 'absent'))").text.strip() == "None"
        )
        assert "ModuleNotFoundError" in kernel.execute("import debugpy").text
        kernel.execute("open('helper.py', 'w').write('VALUE = 41')")
        assert kernel.execute("import helper; helper.VALUE + 1").text.strip() == "42"
        assert kernel.execute("get_ipython().__class__.__name__").text.strip() == "'ZMQInteractiveShell'"


def test_a_slow_kernel_start_is_not_the_model_s_timeout():
    """The agent waits for an interpreter call as long as the kernel's own limits allow: a tool
    timeout shorter than a kernel start (0.2 s here) still gets the cell's output."""
    e = InterpreterEnv(memory_mb=1024)
    try:
        assert e.call_bound_s("python") > 2 * 60  # a start and a restart fit
        script = [calls("print(41 + 1)"), {"role": "assistant", "content": "\\boxed{42}"}]
        trajectory, reward = run_episode(ScriptedBackend(script), e, TASK, tool_timeout_s=0.2)
        assert tool_texts(trajectory) == ["42"] and reward.value == 1.0
    finally:
        e.close()


def test_a_start_gives_its_slot_back_once_the_kernel_answers(monkeypatch):
    """The start slot covers the kernel's imports (up to its first answer on the shell channel), not
    the client's IOPub check after it, which is mostly waiting."""
    from jupyter_client.blocking.client import BlockingKernelClient

    from dsv32.envs.interpreter import kernel as kernel_module

    events: list[str] = []

    class Slots(threading.BoundedSemaphore):
        def release(self, n=1):
            events.append("released")
            super().release(n)

    monkeypatch.setattr(kernel_module, "_STARTING", Slots(1))
    answer, ready = kernel_module.SandboxedKernel._answer, BlockingKernelClient.wait_for_ready

    def answering(self, timeout):
        answer(self, timeout)
        events.append("answered")

    def checking(self, timeout=None):
        events.append("ready check")
        return ready(self, timeout)

    monkeypatch.setattr(kernel_module.SandboxedKernel, "_answer", answering)
    monkeypatch.setattr(BlockingKernelClient, "wait_for_ready", checking)
    with SandboxedKernel() as k:
        assert k.execute("print(6 * 7)").text.strip() == "42"
        assert events[:3] == ["answered", "released", "ready check"] and events.count("released") == 1


def test_kernels_starting_together_take_turns_and_a_start_that_cannot_get_one_says_so(monkeypatch):
    from dsv32.envs.interpreter import kernel as kernel_module

    monkeypatch.setattr(kernel_module, "_STARTING", threading.BoundedSemaphore(2))
    launch, lock, now, most = kernel_module.SandboxedKernel._launch, threading.Lock(), [0], [0]

    def counting(self, quota, deadline, answered):  # a start counts from its launch to its first answer
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        done = [False]

        def counted():
            with lock:
                if not done[0]:
                    done[0] = True
                    now[0] -= 1
            answered()

        try:
            return launch(self, quota, deadline, counted)
        finally:
            counted()

    monkeypatch.setattr(kernel_module.SandboxedKernel, "_launch", counting)
    kernels = [SandboxedKernel(start=False, startup_timeout_s=60) for _ in range(5)]
    try:
        results: list = [None] * 5
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, kernels[i].execute(f"print({i} * 2)")))
            for i in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [r.text.strip() for r in results] == ["0", "2", "4", "6", "8"] and most[0] == 2
    finally:
        for k in kernels:
            k.close()
    held = threading.BoundedSemaphore(1)
    held.acquire()  # every start slot taken, for longer than this kernel may wait
    monkeypatch.setattr(kernel_module, "_STARTING", held)
    with SandboxedKernel(start=False, startup_timeout_s=1.5) as k:
        t = time.perf_counter()
        text = k.execute("print(1)").text
        assert "other kernels of this process were starting for all of 1.5 s" in text
        assert time.perf_counter() - t < 10
