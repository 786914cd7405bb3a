"""The issue text of a mined task, written from what a user sees — the failing tests' ids and their
assertion or exception messages — and never from the injected diff."""

from __future__ import annotations

SHOWN_TESTS = 5
MESSAGE_LINES = 3
LINE_CHARS = 200


def issue_text(package: str, version: str, failing: list[str], messages: dict[str, str], total: int) -> str:
    """A bug report: which tests of ``package`` fail (up to ``SHOWN_TESTS``, each with the first
    lines of its message), how many fail out of ``total``, and what a fix must keep."""
    k = len(failing)
    lines = [
        f"{package} {version}: {k} test{'s' if k != 1 else ''} fail{'' if k != 1 else 's'}",
        "",
        f"Running the test suite of {package} {version} (`pytest`), {k} of its {total} tests fail"
        f"{'' if k != 1 else 's'}; the others pass. The failures:",
        "",
    ]
    for tid in failing[:SHOWN_TESTS]:
        lines.append(f"- `{tid}`")
        for msg_line in [m for m in messages.get(tid, "").splitlines() if m.strip()][:MESSAGE_LINES]:
            lines.append(f"    {msg_line[:LINE_CHARS]}")
    if k > SHOWN_TESTS:
        lines.append(f"- ... and {k - SHOWN_TESTS} more")
    lines += [
        "",
        "The tests describe the intended behaviour. Please fix the library code (not the tests) so that "
        "these tests pass and every other test still passes.",
    ]
    return "\n".join(lines)
