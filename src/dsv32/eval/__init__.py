"""``dsv32 eval``: the paper's evaluation protocol (§4.1, Appendix D) on real benchmarks, offline,
for a local model, any OpenAI-compatible endpoint, or the benchmarks' own reference answers.

    from dsv32.eval import RunSettings, run
    results = run(RunSettings("humaneval", backend="openai", model="deepseek-reasoner",
                              base_url="https://api.deepseek.com/v1", n=4))
    results["metrics"]["pass@1"]["value"]

Benchmarks (:mod:`dsv32.eval.registry`): HumanEval (:mod:`.humaneval`, programs run in the
``dsv32.envs`` sandbox), BFCL v4 single-turn (:mod:`.bfcl.single`, our AST checker) and multi-turn
(:mod:`.bfcl.multi_turn`, BFCL's API classes in a sandboxed worker, through ``dsv32.agent``),
reasoning-gym (:mod:`.rgym`), every ``dsv32.envs`` environment (:mod:`.agentic`) and bring-your-own
AIME/GPQA/MMLU-Pro/SWE-bench files (:mod:`.byo`). Metrics (:mod:`.metrics`): pass@1 as the mean
over samples, the unbiased pass@k, 95 % intervals. The runner (:mod:`.runner`) resumes from the
per-sample JSONL; reports (:mod:`.report`) write results.json and report.md and put runs side by
side; :mod:`.paper` holds the paper's numbers with their tables. See docs/eval.md.
"""

from dsv32.eval.errors import EvalError, RunDirectoryBusy
from dsv32.eval.metrics import Metric, pass_at_k, summarize
from dsv32.eval.paper import PAPER
from dsv32.eval.registry import get, names
from dsv32.eval.report import side_by_side
from dsv32.eval.runner import rescore, run
from dsv32.eval.settings import DEFAULTS, RunSettings
from dsv32.eval.types import Benchmark, EpisodeResult, Problem, Score

__all__ = [
    "DEFAULTS",
    "PAPER",
    "Benchmark",
    "EpisodeResult",
    "EvalError",
    "Metric",
    "Problem",
    "RunDirectoryBusy",
    "RunSettings",
    "Score",
    "get",
    "names",
    "pass_at_k",
    "rescore",
    "run",
    "side_by_side",
    "summarize",
]
