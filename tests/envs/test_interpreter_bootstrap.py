"""The kernel's bootstrap on its own, without a kernel: the import path, the cut of each message's
text (and the host joining it back), the periodic flush, the hooks it installs on a shell, and the
startup file that runs it without adding names to the cells' namespace."""

import ast
import sys
from pathlib import Path

from dsv32.envs.interpreter import bootstrap
from dsv32.envs.interpreter.kernel import _add_text, _Output, _startup_file

KEEP = bootstrap.KEEP


class Stream:
    """A kernel stream as ipykernel's ``OutStream`` looks to the bootstrap."""

    def __init__(self) -> None:
        self.hooks, self.written, self.flushes = [], [], 0
        self.pub_thread = self  # schedule() runs the function at once, as the IOPub thread would

    def schedule(self, fn) -> None:
        fn()

    def register_hook(self, hook) -> None:
        self.hooks.append(hook)

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


class Publisher:
    def __init__(self) -> None:
        self.hooks = []

    def register_hook(self, hook) -> None:
        self.hooks.append(hook)


class Shell:
    def __init__(self) -> None:
        self.history_manager = type("History", (), {"outputs": {1: ["kept"]}})()
        self.displayhook, self.display_pub = Publisher(), Publisher()


def test_the_work_dir_goes_after_the_standard_library_once():
    path = ["/py/lib/python311.zip", "/py/lib/python3.11", "/venv/lib/python3.11/site-packages", "/x"]
    bootstrap.cwd_on_path(path)
    assert path.index("") == 2
    bootstrap.cwd_on_path(path)
    assert path.count("") == 1
    bare = ["/py/lib/python3.11"]
    bootstrap.cwd_on_path(bare)
    assert bare == ["", "/py/lib/python3.11"]


def test_a_long_stream_is_cut_to_its_ends_and_the_host_joins_it_back():
    text = "h" * KEEP + "m" * 1000 + "t" * KEEP
    msg = bootstrap.cut_stream({"content": {"name": "stdout", "text": text}})
    content = msg["content"]
    assert content["text"] == "h" * KEEP + "t" * KEEP and content["dsv32_cut"] == 1000
    output = _Output(40)
    _add_text(output, content["text"], content["dsv32_cut"])
    assert output.total == len(text) and output.truncated
    assert output.text().startswith("h" * 20) and output.text().endswith("t" * 20)
    short = {"content": {"text": "short"}}
    assert bootstrap.cut_stream(short) == {"content": {"text": "short"}}
    assert bootstrap.cut_stream({"content": None}) == {"content": None}  # malformed: left alone


def test_a_display_keeps_only_its_text_cut():
    msg = {"content": {"data": {"text/plain": "v" * (2 * KEEP + 5), "image/png": "AAAA"}}}
    content = bootstrap.cut_data(msg)["content"]
    assert list(content["data"]) == ["text/plain"] and len(content["data"]["text/plain"]) == 2 * KEEP
    assert content["dsv32_cut"] == 5
    assert bootstrap.cut_data({"content": {"data": {"image/png": "AAAA"}}})["content"]["data"] == {}


def test_a_stream_is_flushed_every_flush_characters(monkeypatch):
    monkeypatch.setattr(bootstrap, "FLUSH", 10)
    stream = Stream()
    write = bootstrap.flushing(stream, stream.write)
    assert [write("abcd") for _ in range(6)] == [4] * 6  # 24 characters: past 10 twice
    assert stream.flushes == 2 and "".join(stream.written) == "abcd" * 6


def test_install_hooks_the_streams_and_the_shell_and_forgets_outputs():
    shell, stream, plain, path = Shell(), Stream(), object(), ["/site-packages"]
    bootstrap.install(shell, streams=[stream, plain], path=path)  # a stream without a pub_thread: skipped
    assert path == ["", "/site-packages"]
    assert stream.hooks == [bootstrap.cut_stream]
    assert stream.write("x") == 1 and stream.written == ["x"]  # (the flushing wrapper)
    outputs = shell.history_manager.outputs
    assert isinstance(outputs, bootstrap.Forget) and 1 not in outputs and outputs[1] == []
    assert shell.displayhook.hooks == [bootstrap.cut_data] and shell.display_pub.hooks == [bootstrap.cut_data]


def test_the_startup_file_installs_it_without_adding_names_to_the_cells_namespace(tmp_path, monkeypatch):
    copy = tmp_path / "bootstrap.py"
    copy.write_text(Path(bootstrap.__file__).read_text())
    shell, path = Shell(), list(sys.path)
    monkeypatch.setattr(sys, "path", path)
    cells = {"get_ipython": lambda: shell}
    exec(compile(_startup_file(str(copy)), "00-dsv32.py", "exec"), cells)
    assert set(cells) == {"get_ipython", "__builtins__"}
    assert type(shell.history_manager.outputs).__name__ == "Forget" and "" in path  # (the copy's class)


def test_the_bootstrap_imports_only_the_standard_library():
    tree = ast.parse(Path(bootstrap.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in imported} <= set(sys.stdlib_module_names) | {"__future__"}
