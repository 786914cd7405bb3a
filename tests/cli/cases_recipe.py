"""Bad-input rows of recipes and their data files, read before anything loads (read by
test_bad_input.py): RL task rows against the rewards, ``[rewards]`` tables, optimizer betas, DSA
shapes, environment options, text encodings, output directories."""

from __future__ import annotations

import json

MATH = {"prompt": "1+1?", "answer": "2", "domain": "math"}
TASKS = {
    "nodomain": {"prompt": "1+1?", "answer": "2"},
    "typo": {**MATH, "domain": "mth"},
    "noanswer": {"prompt": "1+1?", "domain": "math"},
    "domainlist": {**MATH, "domain": ["math"]},
    "answerlist": {**MATH, "answer": [2]},
    "answerbool": {**MATH, "answer": True},
    "rubricdict": {**MATH, "rubric": {"a": 1}},
    "systemint": {**MATH, "system": 5},
}
CONVERSATION = {
    "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add"},
    ]
}


def files(tmp) -> dict[str, str]:
    for name, row in TASKS.items():
        (tmp / f"{name}.jsonl").write_text(json.dumps(MATH) + "\n" + json.dumps(row) + "\n")
    (tmp / "latin1.toml").write_bytes(b"[grpo]\n# caf\xe9\nsteps = 2\n")
    bad_first = {"messages": [{"role": "tool", "content": "x"}, *CONVERSATION["messages"][1:]]}
    (tmp / "blank-first.jsonl").write_text("\n\n\n" + json.dumps(bad_first) + "\n")
    (tmp / "conv.jsonl").write_text(json.dumps(CONVERSATION) + "\n")
    (tmp / "a-file").write_text("not a directory\n")
    return {}


def _rl_tasks(name: str) -> list[str]:
    source = f'sources=[{{{{kind="jsonl",path="{{tmp}}/{name}.jsonl"}}}}]'  # argv is str.format-ed
    return ["rl", "train", "--policy", "tiny-llama", "--steps", "1", "--set", source, "--out", "{out}"]


_RL = ["rl", "train", "--policy", "tiny-llama", "--steps", "1", "--out", "{out}"]
_SFT = ["sft", "--model", "tiny-llama", "--data", "{tmp}/conv.jsonl", "--out", "{out}"]

CASES = [
    (_rl_tasks("nodomain"), "nodomain.jsonl:2: domain 'general' is scored by a generative reward model"),
    (_rl_tasks("typo"), "typo.jsonl:2: domain 'mth' has no reward; domains with one: ['exact', 'math']"),
    (_rl_tasks("noanswer"), "noanswer.jsonl:2: domain 'math' is scored against a reference answer"),
    (_rl_tasks("domainlist"), "domainlist.jsonl:2: 'domain' must be a string, got [\"math\"]"),
    (_rl_tasks("answerlist"), "answerlist.jsonl:2: 'answer' must be a string or a number"),
    (_rl_tasks("answerbool"), "answerbool.jsonl:2: 'answer' must be a string or a number"),
    (_rl_tasks("rubricdict"), "rubricdict.jsonl:2: 'rubric' must be a string"),
    (_rl_tasks("systemint"), "systemint.jsonl:2: 'system' must be a string, got 5"),
    ([*_RL, "--set", 'sources=[{{kind="arithmetic",domain="mth"}}]'], "[sources.0] domain 'mth' has no reward"),
    ([*_RL, "--set", "rewards.math={{weights={{math=1.0}},foo=1}}"], "[rewards.math] unknown RewardSpec keys ['foo']"),
    ([*_RL, "--set", "rewards.math={{weights={{mathh=1.0}}}}"], "[rewards.math] unknown reward components ['mathh']"),
    ([*_RL, "--set", 'rewards.judge={{local="tiny-llama",foo=1}}'], "unknown keys in [rewards.judge]: ['foo']"),
    ([*_RL, "--set", "rewards.judge={{scale=2}}"], "[rewards.judge] needs either local"),
    (["rl", "eval", "--set", "rewards.exact={{weights={{}}}}", "--out", "{out}"], "[rewards.exact] a RewardSpec needs"),
    ([*_RL, "--set", "grpo.betas=[0.9]"], "[grpo] betas = [0.9]: must be two numbers"),
    ([*_RL, "--set", "grpo.betas=[0.9,0.99,0.999]"], "[grpo] betas = [0.9, 0.99, 0.999]: must be two numbers"),
    (["dsa", "warmup", "--set", "warmup.betas=[0.9]", "--out", "{out}"], "[warmup] betas = [0.9]: must be two"),
    ([*_SFT, "--set", "train.betas=[0.9,0.9,0.9]"], "[train] betas = [0.9, 0.9, 0.9]: must be two numbers"),
    (["dsa", "warmup", "--set", "dsa.index_head_dim=7", "--out", "{out}"], "[dsa] index_head_dim = 7: must be even"),
    (["dsa", "sparse", "--set", "dsa.index_rope_head_dim=3", "--out", "{out}"], "[dsa] index_rope_head_dim = 3"),
    (["posttrain", "rl", "--set", 'envs=[{{name="code-interpreter",options={{foo=1}}}}]', "--out", "{out}"],
     "[envs.0] options = {\"foo\": 1}: environment 'code-interpreter' does not take them"),
    (["posttrain", "rl", "--set", 'envs=[{{name="code-interp"}}]', "--out", "{out}"],
     "[envs.0] name = 'code-interp': unknown environment"),
    (["dsa", "warmup", "--model", "tiny-llama", "--out", "{out}"],
     "[model] name = 'tiny-llama': a random test model without a tokenizer cannot read text data"),
    (["rl", "train", "{tmp}/latin1.toml", "--out", "{out}"], "latin1.toml: line 2: not UTF-8 text (byte 0xe9"),
    (["sft", "--model", "tiny-llama", "--data", "{tmp}/blank-first.jsonl", "--out", "{out}"],
     "blank-first.jsonl:4: message 0: tool result with no preceding assistant tool call"),
    (["rl", "train", "--out", "{tmp}/a-file/out"], "[top level] out_dir = "),
    (["sft", "--data", "{tmp}/conv.jsonl", "--out", "{tmp}/a-file/out"], "a-file is not a directory"),
    (["dsa", "warmup", "--out", "{tmp}/a-file/out"], "cannot be the output directory:"),
    # an unknown section is named with every section the command accepts
    (["rl", "train", "--set", "colour=1", "--out", "{out}"], "unknown sections ['colour']; accepted: engine, "
     "eval, grpo, log_every, lora, out_dir, policy, ray, report_to, rewards, sampling, save_every, seed, sources"),
    (["sft", "--data", "{tmp}/conv.jsonl", "--set", "colour=1", "--out", "{out}"],
     "unknown sections ['colour']; accepted: data, lora, model, out_dir, report_to, train"),
    (["dsa", "sparse", "--set", "colour=1", "--out", "{out}"],
     "unknown sections ['colour']; accepted: data, dsa, eval, model, out_dir, report_to, sparse, warmup"),
]  # fmt: skip
