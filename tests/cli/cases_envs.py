"""Bad-input rows of ``dsv32 envs`` (see test_bad_input.py)."""

CASES = [
    (["envs", "list", "extra"], "unrecognized arguments: extra"),
    (["envs", "show", "no-such-env"], "unknown environment 'no-such-env'; known:"),
    (["envs", "run", "no-such-env", "--out", "{out}"], "unknown environment 'no-such-env'"),
    (["envs", "run", "code-interpreter", "--n", "0", "--out", "{out}"], "argument --n: '0' is not an integer >= 1"),
    (["envs", "run", "code-interpreter", "--parallel", "0", "--out", "{out}"],
     "argument --parallel: '0' is not an integer >= 1"),
    (["envs", "run", "code-interpreter", "--tasks", "{missing}.jsonl", "--out", "{out}"], "no such file or directory"),
    (["envs", "run", "code-interpreter", "--backend", "openai", "--out", "{out}"],
     "--backend openai needs --base-url and --model"),
    (["envs", "build-swe", "--package", "inflection", "--out", "{out}"], "is not NAME==VERSION"),
    (["envs", "build-swe", "--package", "inflection==0.5.1", "--n", "0", "--out", "{out}"],
     "argument --n: '0' is not an integer >= 1"),
    (["envs", "build-swe", "--package", "inflection==0.5.1"], "the following arguments are required: --out"),
]  # fmt: skip
