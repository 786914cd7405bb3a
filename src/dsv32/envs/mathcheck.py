"""Final answers of math tasks, read and judged one way for the environments, the RL rewards and
the evaluation harness: :func:`last_boxed` reads the answer, :func:`answers_equal` compares it.

**Reading.** :func:`last_boxed` is the content of the last ``\\boxed{…}`` (also ``\\fbox{…}`` and
``\\boxed {…}``), nested and escaped braces kept, surrounding whitespace stripped. A completion whose
last box is cut off before its closing brace has no final answer (None), even if an earlier box is
complete: the last box is the final answer, and a truncated one is not an answer.

**Comparing.** math-verify (LaTeX → SymPy → compare). It can spend unbounded time on adversarial
LaTeX, and on some (``9^{9^{9^{9}}}``: integer arithmetic in SymPy) it holds the interpreter lock,
so every thread of the process stalls, not only the caller. math-verify's own timeout uses ``signal.alarm``,
which works only in the main thread (anywhere else it raises ``ValueError``). :func:`answers_equal`
therefore picks the guard by thread:

- **main thread (POSIX)**: math-verify's own timeout (``parse(parsing_timeout=…)``,
  ``verify(timeout_seconds=…)``, whole seconds, applied to each parse and each comparison). No extra
  process. It installs a SIGALRM handler for the duration of the call and cancels any pending alarm.
- **any other thread** (or no SIGALRM, e.g. Windows): the check runs in a worker subprocess (this
  file run as a script with ``-P``, so its folder is not on ``sys.path``; it imports only the
  standard library and math-verify) with math-verify's
  timeouts disabled (``None``), and the caller waits at most ``timeout_seconds`` for the whole check.
  A worker that overruns is killed and the answer counts as not equal; workers start on first use
  (about a second: SymPy import), one per concurrent caller up to the CPU count (further callers
  wait for a free one; the timeout counts from when the worker has the check), and are reused.
- ``timeout_seconds=None``: no timeout at all, in-process in every thread — guard it yourself.

Errors: called with ``raise_on_error=False`` (its default), math-verify turns every parsing or
comparison error, and its own ``TimeoutException``, into an empty parse or ``False``; the only error
it re-raises is the ``ValueError`` for signals off the main thread, which the routing above never
triggers. So nothing is caught here: garbage in gives ``False``, not an exception.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading

logger = logging.getLogger(__name__)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (skipped) or a brace

WORKER_STARTUP_TIMEOUT_S = 120.0  # importing SymPy on a loaded machine; a failed start raises


def boxes(text: str | None) -> list[tuple[int, str | None]]:
    """``(start, content)`` of every ``\\boxed{…}`` / ``\\fbox{…}`` in order; content None when
    unterminated. One pass over the braces (escaped ones, ``\\{``, do not count), so a text of many
    unclosed boxes costs no more than its length."""
    text = text or ""
    return [(start, None if end is None else text[begin:end]) for start, begin, end, _ in _scan(text)]


def _scan(text: str) -> list[tuple[int, int, int | None, int | None]]:
    """Per box in order: its start, its content's start and end (None: unterminated), and the number
    of the box it opened inside (None: at top level)."""
    found: list[list] = []
    box_at: dict[int, int] = {}  # index of a box's "{" -> the box's number in found
    for match in _BOX_OPEN.finditer(text):
        box_at[match.end() - 1] = len(found)
        found.append([match.start(), match.end(), None, None])
    open_boxes: list[tuple[int, int]] = []  # (box number, depth inside its "{")
    depth = 0
    for token in _BRACE.finditer(text, min(box_at, default=len(text))):
        if token[0] == "{":
            depth += 1
            if token.start() in box_at:
                box = box_at[token.start()]
                found[box][3] = open_boxes[-1][0] if open_boxes else None
                open_boxes.append((box, depth))
        elif token[0] == "}":
            if open_boxes and open_boxes[-1][1] == depth:
                found[open_boxes.pop()[0]][2] = token.start()
            depth -= 1
    return [tuple(box) for box in found]


def last_boxed(text: str | None) -> str | None:
    """Content of the last box, stripped (``"so \\boxed{\\frac{3}{4}}."`` → ``"\\frac{3}{4}"``); None
    when there is no box or the last one is cut off. A box inside a closed box is part of that box's
    answer: ``\\boxed{\\boxed{5}}`` reads ``5``, ``\\boxed{6 \\boxed{5}}`` reads ``6 {5}`` (the
    inner box's braces kept, so no reader picks ``5`` out of it)."""
    text = text or ""
    found = _scan(text)
    outer = [i for i, (*_, parent) in enumerate(found) if parent is None or found[parent][2] is None]
    if not outer or found[outer[-1]][2] is None:
        return None
    box = outer[-1]
    _, begin, end, _ = found[box]
    while box + 1 < len(found) and found[box + 1][3] == box:  # \boxed{ \boxed{x} }: x
        inner_start, inner_begin, inner_end, _ = found[box + 1]  # the first box inside this one
        if inner_end is None or text[begin:inner_start].strip() or text[inner_end + 1 : end].strip():
            break
        box, begin, end = box + 1, inner_begin, inner_end
    return _BOX_OPEN.sub("{", text[begin:end].strip())


# Math-mode delimiters: inside one answer they would let math-verify read one of several values.
_MATH_DELIMITERS = re.compile(r"\$|\\[()\[\]]")


def as_latex(answer: str) -> str:
    """A bare answer (``3/4``, ``\\frac{1}{2}``, ``1,000``) wrapped in ``\\boxed{}``, so that math-verify's
    LaTeX extractor reads it whole (a bare ``\\sqrt{2}`` or ``(1,2)`` is otherwise not recognised).
    Math delimiters (``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]``) are dropped first: ``6 $5$`` is read
    as a whole, not as its delimited ``5``."""
    text = answer.strip()
    if "\\boxed" in text:
        return text
    return "\\boxed{" + _MATH_DELIMITERS.sub(" ", text).strip() + "}"


def answers_equal_in_process(pred: str, gold: str, timeout_seconds: int | None) -> bool:
    """math-verify in this thread: ``parse`` both, ``verify(gold, pred)``. ``timeout_seconds`` is passed
    to math-verify as is (``None`` disables its signal-based timeout)."""
    from math_verify import parse, verify

    gold_parsed = parse(as_latex(gold), parsing_timeout=timeout_seconds)
    pred_parsed = parse(as_latex(pred), parsing_timeout=timeout_seconds)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_seconds))


def answers_equal(pred: str, gold: str, *, timeout_seconds: float | None = 5) -> bool:
    """True when the answer ``pred`` is mathematically equal to the reference ``gold`` (both LaTeX or
    plain text: ``\\frac{3}{4}`` equals ``0.75``, ``1,000`` equals ``1000``). Never raises on odd
    text; an answer whose check runs past ``timeout_seconds`` is not equal (see the module doc)."""
    if timeout_seconds is None:
        return answers_equal_in_process(pred, gold, None)
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be > 0 or None (no timeout), got {timeout_seconds}")
    if hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread():
        return answers_equal_in_process(pred, gold, max(1, math.ceil(timeout_seconds)))
    return _POOL.check(pred, gold, timeout_seconds)


class _Worker:
    """One subprocess running :func:`_serve`; a reader thread moves its reply lines into a queue so the
    caller can wait with a timeout."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-P", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            env=env,
        )
        self.replies: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True, name="math-verify-reader").start()
        try:
            ready = self.replies.get(timeout=WORKER_STARTUP_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if ready != "ready\n":
            self.kill()
            raise RuntimeError(
                f"the math-verify worker did not start (got {ready!r}); run `{sys.executable} {__file__}` "
                "to see its error (is math-verify installed in this environment?)"
            )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)  # end of output: the worker exited or was killed

    def ask(self, pred: str, gold: str, timeout_seconds: float) -> bool | None:
        """The worker's verdict, or None when it overran the timeout or died."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps([pred, gold]) + "\n")
            self.proc.stdin.flush()
            reply = self.replies.get(timeout=timeout_seconds)
        except (BrokenPipeError, OSError, queue.Empty):
            return None
        return None if reply is None else reply.strip() == "1"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class _WorkerPool:
    """Workers shared by all threads, at most ``size`` of them: a caller takes an idle one, starts one
    while fewer than ``size`` exist, or waits for one to come back. A check's timeout counts from
    when its worker has it, so a hundred episodes ending together queue for two workers instead of
    starting a hundred (each a SymPy import) and timing out on the CPU they took from each other."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size if size is not None else max(2, os.cpu_count() or 2)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0  # workers being started (they count toward size)
        self._cond = threading.Condition()

    def _take(self) -> _Worker:
        with self._cond:
            while not self._idle and len(self._all) + self._starting >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._starting += 1
        try:
            worker = _Worker()
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._all.add(worker)
        return worker

    def check(self, pred: str, gold: str, timeout_seconds: float) -> bool:
        worker = self._take()
        verdict = worker.ask(pred, gold, timeout_seconds)
        if verdict is None:
            logger.warning(
                "math-verify check ran past %.1f s (or its worker died): scored as not equal", timeout_seconds
            )
            worker.kill()
            with self._cond:
                self._all.discard(worker)
                self._cond.notify()
            return False
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()
        return verdict

    def close(self) -> None:
        """Kill every worker (registered at interpreter exit)."""
        with self._cond:
            workers, self._all, self._idle = list(self._all), set(), []
            self._cond.notify_all()
        for worker in workers:
            worker.kill()


_POOL = _WorkerPool()
atexit.register(_POOL.close)


def _serve() -> None:
    """Worker loop: one JSON ``[pred, gold]`` per input line → ``1`` or ``0`` per output line."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" is intended here
    import math_verify  # noqa: F401  (import before announcing readiness: it is the slow part)

    print("ready", flush=True)
    for line in sys.stdin:
        pred, gold = json.loads(line)
        print("1" if answers_equal_in_process(pred, gold, None) else "0", flush=True)


if __name__ == "__main__":
    _serve()
