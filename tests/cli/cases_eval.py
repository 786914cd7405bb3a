"""Bad-input rows for ``dsv32 eval list|run|rescore|report`` (see test_bad_input.py)."""

from __future__ import annotations

import json


def files(tmp) -> dict[str, str]:
    (tmp / "aime.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    (tmp / "norows.jsonl").write_text("\n")
    (tmp / "badrow.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": \n')
    (tmp / "nullanswer.jsonl").write_text(json.dumps({"id": "a", "problem": "1+1?", "answer": None}) + "\n")
    both = {"question": "q?", "options": ["x", "y"], "answer": "B", "answer_index": 0}
    (tmp / "conflict.jsonl").write_text(json.dumps(both) + "\n")
    (tmp / "noresults").mkdir()
    (tmp / "broken-results").mkdir()
    (tmp / "broken-results" / "results.json").write_text("{not json")
    return {"aime": str(tmp / "aime.jsonl")}


CASES = [
    (["eval", "list", "extra"], "unrecognized arguments: extra"),
    (["eval", "run", "no-such-bench", "--out", "{out}"], "unknown benchmark 'no-such-bench'"),
    (["eval", "run", "humaneval", "--n", "0", "--out", "{out}"], "argument --n: '0' is not an integer >= 1"),
    (["eval", "run", "humaneval", "--top-p", "0", "--out", "{out}"], "argument --top-p: '0' is not a number in (0, 1]"),
    (["eval", "run", "humaneval", "--temperature", "-1", "--out", "{out}"], "argument --temperature: '-1' is not a number >= 0"),
    (["eval", "run", "humaneval", "--timeout", "0", "--out", "{out}"], "argument --timeout: '0' is not a number > 0"),
    (["eval", "run", "humaneval", "--exec-timeout", "0", "--out", "{out}"], "argument --exec-timeout: '0' is not a number > 0"),
    (["eval", "run", "humaneval", "--max-retries", "-1", "--out", "{out}"], "argument --max-retries: '-1' is not an integer >= 0"),
    (["eval", "run", "humaneval", "--backend", "local", "--out", "{out}"], "local needs the model to load"),
    (["eval", "run", "humaneval", "--backend", "gpu", "--out", "{out}"], "'gpu' is not one of reference, local, openai"),
    (["eval", "run", "--backend", "local", "smollm2", "humaneval", "--out", "{out}"],
     "unexpected 'humaneval' after it (put the benchmark before --backend)"),
    (["eval", "run", "humaneval", "--backend", "openai", "--out", "{out}"], "--backend openai needs --base-url URL and --model NAME"),
    (["eval", "run", "humaneval", "--model", "x", "--out", "{out}"], "--base-url and --model are for --backend openai"),
    (["eval", "run", "humaneval", "--backend", "local", "no-such-model", "--out", "{out}"], "cannot load model 'no-such-model'"),
    (["eval", "run", "humaneval", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
      "--temperature", "0", "--n", "4", "--out", "{out}"], "greedy decoding (temperature 0) gives the same completion 4 times"),
    (["eval", "run", "humaneval", "--backend", "local", "smollm2", "--concurrency", "2", "--out", "{out}"],
     "--concurrency is for endpoints"),
    (["eval", "run", "bfcl", "--subset", "web_search", "--out", "{out}"], "bfcl has no category ['web_search']"),
    (["eval", "run", "reasoning-gym", "--subset", "no_family", "--out", "{out}"], "no task family 'no_family'"),
    (["eval", "run", "agent-code-interpreter", "--subset", "nope", "--out", "{out}"], "has no task set 'nope'"),
    (["eval", "run", "humaneval", "--subset", "nosub", "--out", "{out}"], "humaneval has no subsets to pick with --subset"),
    (["eval", "run", "byo-boxed", "--data", "{aime}", "--subset", "x", "--out", "{out}"], "byo-boxed has no subsets"),
    (["eval", "run", "humaneval", "--data", "{aime}", "--out", "{out}"], "humaneval takes no --data: its problems come from"),
    (["eval", "run", "byo-boxed", "--out", "{out}"], "byo-boxed reads your benchmark file: pass --data FILE.jsonl"),
    (["eval", "run", "byo-boxed", "--data", "{missing}", "--out", "{out}"], "no such file"),
    (["eval", "run", "byo-boxed", "--data", "{tmp}/norows.jsonl", "--out", "{out}"], "holds no rows"),
    (["eval", "run", "byo-boxed", "--data", "{tmp}/badrow.jsonl", "--out", "{out}"], "badrow.jsonl:2: not JSON"),
    (["eval", "run", "byo-mcq", "--data", "{aime}", "--out", "{out}"], "aime.jsonl:1: missing field 'options' or 'choices'"),
    (["eval", "run", "byo-boxed", "--data", "{tmp}/nullanswer.jsonl", "--out", "{out}"],
     "nullanswer.jsonl:1: field 'answer' must be a non-empty string or a number, got null"),
    (["eval", "run", "byo-mcq", "--data", "{tmp}/conflict.jsonl", "--out", "{out}"],
     "conflict.jsonl:1: 'answer' 'B' and 'answer_index' 0 name different options"),
    (["eval", "run", "byo-boxed", "--data", "{aime}", "--paper", "gpqa-diamond", "--out", "{out}"],
     "--paper gpqa-diamond compares with GPQA Diamond, which runs as byo-mcq, not byo-boxed"),
    (["eval", "run", "byo-boxed", "--data", "{aime}", "--paper", "aime-2099", "--out", "{out}"],
     "the paper reports no benchmark 'aime-2099'"),
    (["eval", "run", "humaneval", "--context", "forget", "--out", "{out}"], "argument --context: invalid choice: 'forget'"),
    (["eval", "report"], "the following arguments are required: dirs"),
    (["eval", "report", "{tmp}/noresults"], "noresults: no results.json"),
    (["eval", "report", "{tmp}/broken-results"], "not a results file"),
    (["eval", "rescore"], "the following arguments are required: dir"),
    (["eval", "rescore", "{tmp}/noresults"], "noresults: no results.json"),
    (["eval", "rescore", "{tmp}/broken-results"], "not a results file"),
]  # fmt: skip
