"""DeepSeek-V3.2's own numbers for the benchmarks a user can run here as bring-your-own files.

Each number is the paper's, with the table it is in (``/work/shared/reference`` holds the paper):
Table 2 (DeepSeek-V3.2-Thinking column; the same reasoning numbers, with output-token counts, are in
Table 3) and Table 9 (non-thinking vs thinking, agentic benchmarks). ``--paper KEY`` puts the number
beside the run's score; with ``--no-thinking`` the Table 9 non-thinking number is used where there is one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsv32.eval.errors import EvalError


@dataclass(frozen=True)
class PaperNumber:
    key: str
    benchmark: str
    metric: str
    value: float  # percent
    source: str
    formats: tuple[str, ...]  # the bring-your-own benchmarks whose files can hold this benchmark
    non_thinking: float | None = None
    non_thinking_source: str | None = None

    def for_mode(self, thinking: bool) -> dict:
        """The row for a run in thinking mode or not."""
        row = asdict(self)
        if not thinking and self.non_thinking is not None:
            row["value"], row["source"] = self.non_thinking, self.non_thinking_source
        elif not thinking:
            row["source"] += " (thinking mode; the paper gives no non-thinking number)"
        del row["non_thinking"], row["non_thinking_source"]
        return row


_T2 = "Table 2, DeepSeek-V3.2-Thinking"
PAPER: dict[str, PaperNumber] = {
    p.key: p
    for p in (
        PaperNumber("mmlu-pro", "MMLU-Pro", "EM", 85.0, _T2, ("byo-mcq",)),
        PaperNumber(
            "gpqa-diamond", "GPQA Diamond", "Pass@1", 82.4, _T2 + " (Table 3: 82.4, 7k tokens)", ("byo-mcq",)
        ),
        PaperNumber(
            "hle",
            "HLE (text-only, no tools)",
            "Pass@1",
            25.1,
            _T2 + " (Table 3: 25.1, 21k tokens)",
            ("byo-boxed", "byo-mcq"),
        ),
        PaperNumber(
            "aime-2025", "AIME 2025", "Pass@1", 93.1, _T2 + " (Table 3: 93.1, 16k tokens)", ("byo-boxed",)
        ),
        PaperNumber(
            "hmmt-feb-2025",
            "HMMT Feb 2025",
            "Pass@1",
            92.5,
            _T2 + " (Table 3: 92.5, 19k tokens)",
            ("byo-boxed",),
        ),
        PaperNumber(
            "hmmt-nov-2025",
            "HMMT Nov 2025",
            "Pass@1",
            90.2,
            _T2 + " (Table 3: 90.2, 18k tokens)",
            ("byo-boxed",),
        ),
        PaperNumber(
            "imo-answerbench",
            "IMOAnswerBench",
            "Pass@1",
            78.3,
            _T2 + " (Table 3: 78.3, 27k tokens)",
            ("byo-boxed",),
        ),
        PaperNumber(
            "swe-verified",
            "SWE Verified",
            "Resolved",
            73.1,
            _T2 + " (Table 9 thinking: 73.1)",
            ("byo-swe",),
            72.1,
            "Table 9, non-thinking",
        ),
        PaperNumber(
            "swe-multilingual",
            "SWE Multilingual",
            "Resolved",
            70.2,
            _T2 + " (Table 9 thinking: 70.2)",
            ("byo-swe",),
            68.9,
            "Table 9, non-thinking",
        ),
    )
}


def paper_number(key: str, benchmark: str, thinking: bool) -> dict:
    """The paper's row for ``key``, checked against the benchmark it is compared with."""
    if key not in PAPER:
        raise EvalError(f"the paper reports no benchmark {key!r}; known: {', '.join(PAPER)}")
    number = PAPER[key]
    if benchmark not in number.formats:
        raise EvalError(
            f"--paper {key} compares with {number.benchmark}, which runs as {' or '.join(number.formats)}, "
            f"not {benchmark}"
        )
    return number.for_mode(thinking)
