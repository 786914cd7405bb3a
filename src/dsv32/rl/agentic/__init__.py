"""Agentic GRPO (paper §3.2): episodes of thinking-with-tools in environments as GRPO outputs.

- :mod:`~dsv32.rl.agentic.episodes` — episodes through :mod:`dsv32.agent`, their rows and rewards;
- :mod:`~dsv32.rl.agentic.batcher` — the agent backend that batches the calls of concurrent episodes;
- :mod:`~dsv32.rl.agentic.fanout` — where environments live (threads or Ray actors), an actor that
  dies replaced; :mod:`~dsv32.rl.agentic.actors` — the actor's side (the episode actor, an
  environment held by one); :mod:`~dsv32.rl.agentic.processes` — the cluster's processes here;
- :mod:`~dsv32.rl.agentic.config` — the recipe;
- :mod:`~dsv32.rl.agentic.trainer` — :class:`AgenticTrainer`, the GRPO trainer whose rollout is
  episodes (mixed with single-turn prompts when the recipe asks).
"""
