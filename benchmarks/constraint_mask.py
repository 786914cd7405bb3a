"""What a grammar costs per decoding step (structured outputs, ``dsv32.engine.constraint``), on SmolLM2's
49,152-token vocabulary.

- one-time costs: the vocabulary (token bytes for llguidance, once per model) and compiling a request's
  grammar (three tools' calls in the hermes format; a JSON schema);
- per step, along replies that follow the grammar: the token mask (llguidance's bitmask turned into a
  ``[V]`` bool tensor), advancing the matcher, and what applying the mask adds to ``sample_next`` at
  temperature 1 without truncation (the masked fill and the kept-set filter), each the median over
  the steps;
- end to end: SmolLM2 decoding 48 tokens for one row with and without a constraint, interleaved (the
  difference per token is the mask's share of a real step).

    python benchmarks/constraint_mask.py [--quick] [--max-wait S]

Writes ``runs/bench/constraint_mask.json``. Other processes' share of the CPU is recorded beside each
timing (see ``_timing.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from _timing import Meter, add_max_wait, wait_budget

from dsv32.agent.backends import grammars
from dsv32.agent.backends.toolparsers import tool_parser
from dsv32.engine import SamplingParams, generate, sample_next
from dsv32.engine.constraint import Grammar, vocabulary
from dsv32.engine.models import load_model

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "hours": {"type": "integer"}}, "required": ["city", "hours"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]  # fmt: skip
CALLS = (
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Buenos Aires", "hours": -3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
        },
    },
    "required": ["name", "age"],
}
DOCUMENT = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"], "address": {"street": "St James", "zip": "SW1"}}'


def _median_us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 1)


def _per_step(grammar: Grammar, ids: list[int], logits: torch.Tensor) -> dict:
    """Median µs per step of the mask, the advance and the masked sampling's extra time."""
    mask_s, advance_s, extra_s = [], [], []
    params, generator = SamplingParams(1.0), torch.Generator().manual_seed(0)  # no truncation to compare
    constraint = grammar.constraint()
    for token in ids:
        t0 = time.perf_counter()
        allowed = constraint.allowed()
        t1 = time.perf_counter()
        constraint.advance(token)
        t2 = time.perf_counter()
        sample_next(logits, params, generator)
        t3 = time.perf_counter()
        sample_next(logits, params, generator, allowed[None])
        t4 = time.perf_counter()
        mask_s.append(t1 - t0)
        advance_s.append(t2 - t1)
        extra_s.append((t4 - t3) - (t3 - t2))
    return {
        "steps": len(ids),
        "mask_us": _median_us(mask_s),
        "mask_p90_us": round(sorted(mask_s)[int(0.9 * len(mask_s))] * 1e6, 1),
        "advance_us": _median_us(advance_s),
        "sampling_extra_us": _median_us(extra_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and tokens")
    ap.add_argument("--out", default="runs/bench", help="output directory")
    add_max_wait(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    meter = Meter(max_wait=wait_budget(args))

    loaded = load_model("smollm2", device="cpu")
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    eos = [int(tokenizer.eos_token_id)]
    V = model.config.vocab_size
    t0 = time.perf_counter()
    voc = vocabulary(tokenizer, V, eos, grammars.TEMPLATE_MARKUP)
    vocab_s = time.perf_counter() - t0
    hermes = tool_parser("hermes")
    t0 = time.perf_counter()
    calls = Grammar(grammars.reply(lambda r: grammars.template_calls(r, hermes, TOOLS, True)), voc)
    calls_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    document = Grammar(grammars.reply(lambda r: grammars.json_reply(r, SCHEMA)), voc)
    schema_s = time.perf_counter() - t0

    logits = torch.randn(1, V)
    meter.wait_quiet()
    with meter.window() as steps_window:
        steps = {
            "tool_calls": _per_step(calls, tokenizer.encode(CALLS, add_special_tokens=False) + eos, logits),
            "json_schema": _per_step(
                document, tokenizer.encode(DOCUMENT, add_special_tokens=False) + eos, logits
            ),
        }

    # end to end: one row decoding N tokens, with and without the JSON grammar (never stopping: after
    # the document the grammar allows only the end token, which the call does not stop at)
    messages = [{"role": "user", "content": "Describe Ada Lovelace as JSON."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    n = 16 if args.quick else 48
    reps = 2 if args.quick else 4

    def free():
        generate(model, [prompt], n, 0.0, eos_token_id=[])

    def constrained():
        generate(model, [prompt], n, 0.0, eos_token_id=[], constraints=[document.constraint()])

    free(), constrained()  # warm-up
    times: dict[str, list[float]] = {"free": [], "constrained": []}
    others: list[float | None] = []
    for _ in range(reps):
        for name, fn in (("free", free), ("constrained", constrained)):
            seconds, share = meter.run(fn)
            times[name].append(seconds / n)
            others.append(share)
    free_ms = statistics.median(times["free"]) * 1e3
    constrained_ms = statistics.median(times["constrained"]) * 1e3
    result = {
        "machine": f"{platform.machine()} · {os.cpu_count()} CPUs · torch {torch.__version__} on 1 thread",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "llguidance": __import__("llguidance").__version__,
        "vocab_size": V,
        "vocabulary_s": round(vocab_s, 3),
        "compile_ms": {"tool_calls": round(calls_s * 1e3, 1), "json_schema": round(schema_s * 1e3, 1)},
        "per_step": steps,
        "per_step_others": steps_window["others"],
        "decode": {
            "tokens": n,
            "free_ms_per_token": round(free_ms, 2),
            "constrained_ms_per_token": round(constrained_ms, 2),
            "overhead_ms_per_token": round(constrained_ms - free_ms, 2),
            "others": others,
        },
    }
    out = Path(args.out) / "constraint_mask.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
