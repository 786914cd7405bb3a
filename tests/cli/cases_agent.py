"""Bad-input rows of ``dsv32 agent`` (see test_bad_input.py)."""

CASES = [
    (["agent", "run", "--task", "q", "--out", "{out}"], "--backend openai needs --base-url URL and --model NAME"),
    (["agent", "run", "--backend", "local", "--task", "q", "--out", "{out}"], "--backend local needs a model"),
    (["agent", "run", "--task", "q", "--context", "discard_all", "--out", "{out}"], "needs context_window"),
    (["agent", "run", "--backend", "local", "no-such-model", "--task", "q", "--out", "{out}"],
     "cannot load model 'no-such-model'"),
    (["agent", "run", "--max-steps", "x"], "argument --max-steps: invalid int value: 'x'"),
]  # fmt: skip
