"""Bad-input rows of ``dsv32 serve`` (see test_bad_input.py): all fail before a model loads or a port opens."""

CASES = [
    (["serve", "tiny-native", "--port", "99999"], "argument --port: '99999' is not a port number in [0, 65535]"),
    (["serve", "tiny-native", "--max-batch", "0"], "argument --max-batch: '0' is not an integer >= 1"),
    (["serve", "tiny-native", "--host", "203.0.113.9"], "cannot listen on 203.0.113.9:8000"),
    (["serve", "no-such-model", "--port", "0"], "cannot load model 'no-such-model'"),
]  # fmt: skip
