"""DeepSeek-V3.2's post-training pipeline (paper §3, §3.2.2, Appendix B), above the trainers it runs:

- :mod:`~dsv32.posttrain.recipe` — the post-training recipe (``configs/posttrain-*.toml``): the
  generated tasks, the SFT and agentic GRPO sections, read and checked as one;
- :mod:`~dsv32.posttrain.pipeline` — the proof run, :func:`~dsv32.posttrain.pipeline.run_proof`:
  base → cold start → SFT → GRPO, each evaluated on the same held-out tasks;
- :mod:`~dsv32.posttrain.report` — its ``report.{json,md,png}``;
- :mod:`~dsv32.posttrain.transfer` — the transfer run (paper §4.3, a recipe with ``[synth]``): GRPO on
  synthesized environments against GRPO on the code interpreter alone, from one SFT model, on
  held-out synthesized environments, general-tools and BFCL (:mod:`~dsv32.posttrain.bfcl`), with its
  recipe (:mod:`~dsv32.posttrain.transfer_recipe`) and report (:mod:`~dsv32.posttrain.transfer_report`);
- :mod:`~dsv32.posttrain.data` — cold-start conversations and specialist distillation sets;
- :mod:`~dsv32.posttrain.rl` — mixed agentic GRPO on its own, from either kind of recipe.

The ``dsv32 posttrain`` commands (:mod:`dsv32.cli.posttrain`) parse flags and call these.
"""
