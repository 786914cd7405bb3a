"""Bad-input rows for ``dsv32 synth general|search|filter|envs`` (read by test_bad_input.py)."""

from __future__ import annotations

import json

URL = "openai:m@http://127.0.0.1:9/v1"  # never contacted: every row fails before a model call


def files(tmp) -> dict[str, str]:
    rows = [{"id": f"d{i}", "title": f"d{i}", "text": "common words"} for i in range(2)]
    (tmp / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, files in {
        "mine": {"tasks.jsonl": json.dumps({"id": "t", "prompt": "p", "info": {"bundle": str(tmp)}})},
        "listed": {"run.json": "[1, 2]"},
        "foreign": {
            "run.json": json.dumps({"kind": "filter", "provenance": {}}),
            "results.jsonl": '{"foo": 1}',
        },
    }.items():
        (tmp / name).mkdir()
        for file, text in files.items():
            (tmp / name / file).write_text(text + "\n")
    return {}


_S = ["synth", "search", "--entities", "2"]
_G = ["synth", "general", "--category", "trip planning"]
_F = ["synth", "filter", "--env", "search", "--policy", URL]
_E = ["synth", "envs", "--n", "2"]

CASES = [
    ([*_G, "--generator", "nonsense", "--out", "{out}"], "backend 'nonsense': expected openai:MODEL@BASE_URL"),
    ([*_G, "--generator", URL, "--corpus", "{missing}", "--out", "{out}"], "the search corpus must be 'stdlib' or"),
    (["synth", "general", "--category", " ", "--generator", URL, "--out", "{out}"], "the task category is empty"),
    ([*_G, "--generator", URL, "--episodes", "0", "--out", "{out}"], "argument --episodes: '0' is not an integer >= 1"),
    ([*_G, "--category", "Trip planning!", "--generator", URL, "--out", "{out}"],
     "the categories 'trip planning' and 'Trip planning!' have the same job name 'trip-planning'"),
    ([*_G, "--generator", "local:no-such-model", "--out", "{out}"], "cannot load model 'no-such-model'"),
    ([*_G, "--generator", "local:smollm2", "--workers", "2", "--out", "{out}"],
     "a local model runs one episode at a time"),
    ([*_S, "--constructor", "openai:m@ftp://x", "--answerer", URL, "--verifier", URL, "--out", "{out}"],
     "an endpoint is openai:MODEL@http(s)://HOST/v1"),
    ([*_S, "--constructor", URL, "--answerer", URL + ",temp=1", "--verifier", URL, "--out", "{out}"],
     "unknown option 'temp=1'"),
    ([*_S, "--constructor", URL, "--answerer", URL + ",prompt=chatty", "--verifier", URL, "--out", "{out}"],
     "prompt='chatty' is not one of"),
    ([*_S, "--constructor", URL, "--answerer", URL, "--verifier", URL, "--corpus", "{missing}", "--out", "{out}"],
     "does not exist"),
    ([*_S, "--constructor", URL, "--answerer", URL, "--verifier", URL, "--corpus", "{tmp}/tiny.jsonl",
      "--max-mentions", "1", "--out", "{out}"], "long-tail documents"),
    ([*_S, "--constructor", URL, "--answerer", URL, "--verifier", URL, "--breadth", "21", "--out", "{out}"],
     "breadth must be at most 20 (the most results one search returns)"),
    (["synth", "search", "--entities", "2", "--constructor", URL, "--verifier", URL, "--out", "{out}"],
     "the following arguments are required: --answerer"),
    (["synth", "filter", "--env", "nowhere", "--policy", URL, "--out", "{out}"], "unknown environment 'nowhere'"),
    ([*_F, "--k", "8", "--n", "4", "--out", "{out}"], "n >= k samples per task, got k=8, n=4"),
    ([*_F, "--tasks", "{tmp}/absent.jsonl", "--out", "{out}"], "no such file or directory"),
    ([*_F, "--env-option", "bogus=1", "--k", "1", "--out", "{out}"], "does not take the option(s) ['bogus']"),
    ([*_F, "--env-option", "nonsense", "--out", "{out}"], "must look like key=value"),
    (["synth", "filter", "--env", "search", "--policy", URL + ",temperature=hot", "--out", "{out}"],
     "temperature='hot' must be float"),
    (["synth", "filter", "--env", "search", "--policy", URL + ",temperature=-1", "--out", "{out}"],
     "temperature='-1' must be a number in [0, 2]"),
    (["synth", "filter", "--env", "search", "--policy", URL + ",top_p=nan", "--out", "{out}"],
     "top_p='nan' must be a number in (0, 1]"),
    (["synth", "filter", "--env", "search", "--policy", URL + ",price_in=-2", "--out", "{out}"],
     "price_in='-2' must be a price >= 0"),
    ([*_F, "--k", "1", "--out", "{tmp}/mine"], "mine holds tasks.jsonl but no run.json"),
    ([*_F, "--k", "1", "--out", "{tmp}/listed"], "listed/run.json: not a synthesis run record"),
    ([*_F, "--k", "1", "--out", "{tmp}/foreign"],
     "foreign holds a filter run with other settings (policy None -> 'm@http://127.0.0.1:9/v1'; "),
    ([*_G, "--generator", URL, "--out", "{tmp}/foreign"], "foreign holds a 'filter' run, not 'general'"),
    (["synth", "envs", "--n", "0", "--out", "{out}"], "argument --n: '0' is not an integer >= 1"),
    ([*_E, "--tasks-per-env", "9", "--out", "{out}"], "tasks per environment must be 1..4, got 9"),
    ([*_E, "--heldout-domain", "moon base", "--out", "{out}"], "held-out domains ['moon base'] are not among"),
    ([*_E, "--heldout-domain", "zoo", "--heldout-domain", "farm", "--out", "{tmp}/listed"],
     "listed holds files that `dsv32 synth envs` did not write"),
    ([*_E, "--heldout-fraction", "1", "--out", "{out}"], "the held-out fraction must be in (0, 1), got 1.0"),
    ([*_E, "--sandbox", "-1", "--out", "{out}"], "argument --sandbox: '-1' is not an integer >= 0"),
]  # fmt: skip
