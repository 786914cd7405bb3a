"""Bad-input rows of ``dsv32 posttrain`` (read by test_bad_input.py)."""

from __future__ import annotations


def files(tmp) -> dict[str, str]:
    from pathlib import Path

    import dsv32

    (tmp / "kept.jsonl").write_text('{"id": "a conversation kept from an earlier run"}\n')
    return {"shipped": str(Path(dsv32.__file__).parent / "configs" / "posttrain-smollm2.toml")}


_C = ["posttrain", "cold-start", "--out", "{out}/cold.jsonl"]
_CI = ["posttrain", "cold-start", "--env", "code-interpreter"]

CASES = [
    ([*_C, "--env", "no-such-env"], "unknown environment 'no-such-env'"),
    ([*_C, "--env", "code-interpreter", "--tasks", "nope"], "has no task set 'nope'"),
    ([*_C, "--env", "code-interpreter", "--tasks", "{tmp}/absent.jsonl"], "no such file or directory"),
    ([*_C, "--env", "code-interpreter", "--teacher", "gpt"], "backend 'gpt': expected"),
    ([*_C, "--env", "code-interpreter", "--prompt", "fancy"], "argument --prompt: invalid choice: 'fancy'"),
    ([*_C, "--env", "code-interpreter", "--limit", "0"], "argument --limit: '0' is not an integer >= 1"),
    (["posttrain", "cold-start", "--env", "code-interpreter"], "the following arguments are required: --out"),
    ([*_CI, "--out", "{tmp}/kept.jsonl"], "kept.jsonl exists; pass --overwrite to replace it"),
    ([*_CI, "--out", "{tmp}/kept.jsonl/out/cold.jsonl", "--overwrite"], "kept.jsonl is not a directory"),
    ([*_CI, "--out", "{tmp}", "--overwrite"], "is a directory; give the path of a JSONL file"),
]  # fmt: skip

CASES += [
    (["posttrain", "rl", "--set", "agentic.prompt=fancy", "--out", "{out}"],
     "[agentic] prompt = \"fancy\": must be one of"),
    (["posttrain", "rl", "--set", "agentic.context=summary", "--out", "{out}"], "needs context_window"),
    (["posttrain", "rl", "{tmp}/broken.toml", "--out", "{out}"], "is not valid TOML"),
    (["posttrain", "rl", "--policy", "tiny-llama", "--steps", "1", "--out", "{out}"], "does not speak V3.2"),
    (["posttrain", "rl", "--policy", "no-such-model", "--out", "{out}"], "cannot load model 'no-such-model'"),
    (["posttrain", "rl", "--set", "colour=blue", "--out", "{out}"],
     "unknown sections ['colour']; accepted: agentic, engine, envs, eval, grpo, log_every, lora, out_dir, policy, "
     "ray, report_to, rewards, sampling, save_every, seed, sources"),
    (["posttrain", "rl", "{shipped}", "--set", "colour=blue", "--out", "{out}"],
     "unknown sections ['colour']; accepted: out_dir, report_to, rl, rl_model, sft, tasks, transfer"),
    (["posttrain", "rl", "{shipped}", "--set", "rl.colour=blue", "--out", "{out}"],
     "unknown sections ['colour'] in [rl]; accepted: agentic, engine, envs, eval, grpo, log_every"),
    (["posttrain", "rl", "{shipped}", "--group-size", "1", "--out", "{out}"], "[grpo] group_size = 1"),
    (["posttrain", "rl", "{shipped}", "--policy", "tiny-llama", "--out", "{out}"], "does not speak V3.2"),
    (["posttrain", "rl", "--eval-tasks", "-1", "--out", "{out}"], "argument --eval-tasks: '-1' is not"),
]  # fmt: skip

_D = ["posttrain", "distill", "--out", "{out}/mix.jsonl"]
CASES += [
    (_D, "no specialists: give at least one --specialist DOMAIN=BACKEND"),
    ([*_D, "--specialist", "code-interpreter"], "--specialist 'code-interpreter' must look like DOMAIN=VALUE"),
    ([*_D, "--specialist", "nowhere=local:smollm2"], "unknown environment 'nowhere'"),
    ([*_D, "--specialist", "code-interpreter=gpt"], "backend 'gpt': expected"),
    ([*_D, "--specialist", "code-interpreter=local:smollm2", "--weight", "search=2"],
     "--tasks/--weight name domains without a --specialist: ['search']"),
    ([*_D, "--specialist", "code-interpreter=local:smollm2", "--weight", "code-interpreter=lots"], "is not a number"),
    ([*_D, "--specialist", "code-interpreter=local:smollm2", "--weight", "code-interpreter=-1"],
     "domain 'code-interpreter': a mix weight must be a finite number >= 0, got -1.0"),
    (["posttrain", "distill", "--specialist", "code-interpreter=openai:m@http://127.0.0.1:9/v1", "--out",
      "{tmp}/kept.jsonl"], "kept.jsonl exists; pass --overwrite to replace it"),
]  # fmt: skip

CASES += [
    (["posttrain", "proof", "--set", "tasks.heldout=zero", "--out", "{out}"], '[tasks] heldout = "zero": must be'),
    (["posttrain", "proof", "--set", "sft.train.lr=0", "--out", "{out}"], "[train] lr = 0: must be > 0"),
    (["posttrain", "proof", "--set", "rl.grpo.group_size=1", "--out", "{out}"], "[grpo] group_size = 1"),
    (["posttrain", "proof", "--set", "colour=blue", "--out", "{out}"],
     "unknown sections ['colour']; accepted: out_dir, report_to, rl, rl_model, sft, tasks, transfer"),
    (["posttrain", "proof", "--set", "rl.agentic.colour=blue", "--out", "{out}"], "unknown keys in [agentic]"),
    (["posttrain", "proof", "{tmp}/broken.toml", "--out", "{out}"], "is not valid TOML"),
]  # fmt: skip
CASES += [
    (["posttrain", "proof", "--set", "tasks.difficulty=9", "--out", "{out}"], "[tasks] difficulty = 9: must be in [0, 5]"),
]  # fmt: skip
CASES += [
    (["posttrain", "proof", "--set", "tasks.categories=['chains']", "--out", "{out}"], "[tasks] categories"),
    (["posttrain", "proof", "--set", "transfer.env='nowhere'", "--out", "{out}"], "[transfer] env = 'nowhere'"),
    (["posttrain", "proof", "--set", "rl_model.train_embeddings='no'", "--out", "{out}"], "[rl_model] train_embeddings"),
]  # fmt: skip
