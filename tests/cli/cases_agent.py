"""Bad-input rows of ``dsv32 agent`` (see test_bad_input.py)."""

CASES = [
    (["agent", "run", "--task", "q", "--out", "{out}"], "--backend openai needs --base-url URL and --model NAME"),
    (["agent", "run", "--backend", "local", "--task", "q", "--out", "{out}"], "local needs the model to load: --backend local CKPT"),
    (["agent", "run", "--backend", "local", "smollm2", "--model", "x", "--task", "q"],
     "--base-url and --model are for --backend openai"),
    (["agent", "run", "--backend", "openai", "smollm2", "--task", "q"], "argument --backend: unexpected 'smollm2'"),
    (["agent", "run", "--task", "q", "--context", "discard_all", "--out", "{out}"], "needs context_window"),
    (["agent", "run", "--task", "q", "--context", "forget"], "unknown context strategy 'forget'"),
    (["agent", "run", "--backend", "reference", "--task", "q"], "give --env NAME"),
    (["agent", "run", "--task", "q", "--env", "x"], "exactly one of --task TEXT and --env NAME"),
    (["agent", "run", "--task", "q", "--tool", "nomodule"], "write it as module:function"),
    (["agent", "run", "--task", "q", "--tool", "no_such_module_x:f"], "No module named 'no_such_module_x'"),
    (["agent", "run", "--backend", "local", "no-such-model", "--task", "q", "--out", "{out}"],
     "cannot load model 'no-such-model'"),
    (["agent", "run", "--max-steps", "x"], "argument --max-steps: invalid int value: 'x'"),
    (["agent", "run", "--top-p", "2"], "argument --top-p: '2' is not a number in (0, 1]"),
    (["agent", "run", "--max-tokens", "0"], "argument --max-tokens: '0' is not an integer >= 1"),
    (["agent", "run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--task", "q", "--out", "{tmp}/kv.json/out"],
     "cannot write the output directory"),
]  # fmt: skip
