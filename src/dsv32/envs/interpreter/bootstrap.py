"""What the sandboxed IPython kernel runs once it has started, before the first cell.

``kernel.py`` copies this file into each start's fresh run directory and its startup file runs it
with ``runpy.run_path`` in a namespace of its own, then calls :func:`install` with the shell, so the
cells' namespace gains no names. It runs inside the sandbox, where this project is not importable:
standard library only, no imports of ``dsv32``.

:func:`install` puts the work dir on the import path where IPython puts the current directory, and
keeps what the kernel sends and holds bounded: the text of each message cut to its first and last
:data:`KEEP` characters (``dsv32_cut`` counts the rest), displays sent as text only, a stream
flushed every :data:`FLUSH` characters, and no cell's output kept for the history.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

KEEP = 32768  # characters kept at each end of a message's text
FLUSH = 16 << 20  # characters a stream holds before it is sent


def cwd_on_path(path: list[str]) -> None:
    """Put ``""`` (the current directory) on ``path`` where IPython puts it: after the standard
    library, before site-packages."""
    if "" not in path:
        at = [i for i, p in enumerate(path) if p.endswith(("site-packages", "dist-packages"))]
        path.insert(at[0] if at else 0, "")


def cut(content: dict, holder: dict, key: str) -> None:
    """Keep the first and last :data:`KEEP` characters of ``holder[key]`` and count the rest in
    ``content["dsv32_cut"]``."""
    text = holder.get(key)
    if isinstance(text, str) and len(text) > 2 * KEEP:
        holder[key], content["dsv32_cut"] = text[:KEEP] + text[-KEEP:], len(text) - 2 * KEEP


def cut_stream(msg: dict) -> dict:
    """A stream message with its text cut (an IOPub hook)."""
    if isinstance(msg.get("content"), dict):
        cut(msg["content"], msg["content"], "text")
    return msg


def cut_data(msg: dict) -> dict:
    """A display or result message with only its ``text/plain``, cut; other formats (images) are
    never read, so they are not sent."""
    content = msg.get("content")
    if isinstance(content, dict) and isinstance(content.get("data"), dict):
        data = content["data"]
        content["data"] = {"text/plain": data["text/plain"]} if "text/plain" in data else {}
        cut(content, content["data"], "text/plain")
    return msg


def flushing(stream, write: Callable[[str], int]) -> Callable[[str], int]:
    """``write`` that flushes ``stream`` every :data:`FLUSH` characters, so its buffer stays bounded."""
    pending = 0

    def write_and_flush(text: str) -> int:
        nonlocal pending
        written = write(text)
        pending += len(text)
        if pending > FLUSH:
            pending = 0
            stream.flush()  # waits for the IOPub thread to send it
        return written

    return write_and_flush


class Forget(dict):
    """A history of cells' outputs that holds none (IPython 9 keeps every cell's output in memory)."""

    def __contains__(self, key) -> bool:
        return False

    def __getitem__(self, key) -> list:
        return []


def install(shell, streams=None, path: list[str] | None = None) -> None:
    """Set up the kernel whose shell is ``shell``: the work dir on ``path`` (default ``sys.path``),
    the cut and flush on ``streams`` (default the kernel's ``sys.stdout`` and ``sys.stderr``), no
    output history, and the cut on what the shell displays."""
    cwd_on_path(sys.path if path is None else path)
    for stream in (sys.stdout, sys.stderr) if streams is None else streams:
        with contextlib.suppress(AttributeError):  # hooks apply in the thread that sends: the IOPub thread
            stream.pub_thread.schedule(lambda stream=stream: stream.register_hook(cut_stream))
            stream.write = flushing(stream, stream.write)
    shell.history_manager.outputs = Forget()
    for publisher in (shell.displayhook, shell.display_pub):  # these send from the cell's thread
        with contextlib.suppress(AttributeError):
            publisher.register_hook(cut_data)
