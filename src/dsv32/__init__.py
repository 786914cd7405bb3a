"""dsv32 — an open, runnable implementation of the DeepSeek-V3.2 system.

Packages, lowest first (each imports only the ones below it; siblings never import each other;
the layers, what each package owns and where each equation of the paper lives are in
``docs/architecture.md``):

- ``dsv32.dsa``     DeepSeek Sparse Attention as a component: lightning indexer, exact top-k, sparse
                    attention (torch reference, C and Triton kernels), indexer KL losses, attaching
                    DSA to Hugging Face dense models.
- ``dsv32.model``   the V3.2 network (MLA + DSA + DeepSeekMoE) and its Hugging Face-format checkpoints.
- ``dsv32.chat``    the V3.2 conversation protocol (encode, parse, thinking context); pure Python.
- ``dsv32.engine``  local inference: loading models by name, prefill/decode with a KV cache, batched
                    sampling that records what RL needs (log-probs, kept sets, routing).
- ``dsv32.envs``    verifiable environments for agents and the sandbox for model-written code.
- ``dsv32.agent``   the thinking-with-tools loop, tools and backends; drives ``envs``.
- ``dsv32.train``   LM training: DSA continued pre-training (``train.dsa``: dense warm-up, sparse stage,
                    evaluation) and supervised fine-tuning (``train.sft``).
- ``dsv32.rl``      stable GRPO: the objective, rollouts and the one GRPO trainer (``rl.grpo``), agentic
                    episodes (``rl.agentic``), rollout engines (``rl.engines``).
- ``dsv32.posttrain`` the post-training pipeline: cold start, SFT, GRPO, evaluations and the report.
- ``dsv32.synth``   agentic task and data synthesis.
- ``dsv32.serve``   an OpenAI-compatible HTTP server over a local model.
- ``dsv32.eval``    benchmarks, metrics and reports.
- ``dsv32.view``    a run (episode, evaluation, post-training) as one self-contained HTML page.
- ``dsv32.cli``     the ``dsv32`` command: one module per command group.

Leaf modules any package may import: ``dsv32.errors`` (the root :class:`~dsv32.errors.DSV32Error`),
``dsv32.paths`` (the cache directory), ``dsv32.recipe`` (TOML recipes with type and range checks),
``dsv32.runlog`` (``metrics.jsonl`` and step checkpoints) and ``dsv32.trackers`` (``metrics.jsonl``
mirrored into TensorBoard, W&B, MLflow or trackio).
"""

__version__ = "0.1.0"
