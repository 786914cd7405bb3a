"""Bad input rows of ``dsv32 view`` (see test_bad_input.py)."""

CASES = [
    (["view", "{missing}", "--out", "{out}/page.html"], "missing.json: no such file or directory"),
    (["view", "{tmp}", "--out", "{out}/page.html"], "not a run directory dsv32 view knows"),
    (["view", "{tmp}/broken.json", "--out", "{out}/page.html"], "broken.json: not JSON"),
    (["view", "{tmp}/kv.json", "--out", "{out}/page.html"], "kv.json: not an episode"),
    (["view", "{tmp}/text.txt", "--out", "{out}/page.html"], "a .json or .jsonl file, or a run directory"),
    (["view", "{tmp}/kv.json"], "the following arguments are required: --out"),
]
