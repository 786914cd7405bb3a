"""What several test modules share, importable as ``helpers`` (pytest puts ``tests/`` on ``sys.path``:
``pythonpath`` in pyproject.toml).

- ``agent``: scripted replies, a counting backend, a stub Chat Completions server, the Counter env.
- ``agentic``: the echo environment (registered as ``echo-test``), its tasks and sampling, the tiny
  tool user (a model SFT-memorized to call the tool) and the agentic GRPO recipe of the tests.
- ``browser``: headless Chromium driven through its DevTools protocol.
- ``disk``: the disk-quota program and measure of the sandbox and interpreter tests.
- ``engine``: tiny random transformers causal LMs and a tiny native V3.2 model.
- ``eval_stub``: a scripted OpenAI-compatible endpoint.
- ``hf_reference``: a tiny random transformers ``DeepseekV32ForCausalLM``.
- ``launch``, ``worker``: ``torchrun`` launches of training jobs for the distributed tests.
- ``model``: a tiny V3.2 config, random token ids, an indexer top-k recorder.
- ``puppet``: forcing the tokens a model samples next.
- ``record``: the machine a trainer record was written on.
- ``remote``: ``dsv32 serve`` in a subprocess.
- ``rl``: the JSONL-sourced GRPO recipe, the letter reward and the toy prompts it is trained on.
- ``serve``: an ``openai`` client for a test server, waiting for a condition.
- ``swe``: a package's source in a private cache.
- ``tolerances``: the numeric tolerances several modules assert with.
- ``trackers``: what each experiment tracker wrote, read back and compared with ``metrics.jsonl``.
- ``train``: the tiny DSA config and random token data.
- ``v32_model``: the tiny random V3.2 model speaking the V3.2 format, for the server tests.
"""
