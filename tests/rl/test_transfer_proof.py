"""The transfer recipe (paper §4.3): it reads, its domain split is disjoint and an overlapping one is
refused before any model loads; the whole pipeline on a tiny model (1 GRPO step per arm, a few
tasks per suite, 6 BFCL entries) writes a report with every key, valid intervals and types."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("bfcl_eval")

from dsv32.cli import main
from dsv32.envs.base import load_tasks, resolve_tasks
from dsv32.posttrain import transfer
from dsv32.posttrain.pipeline import run_proof
from dsv32.posttrain.report import wilson
from dsv32.posttrain.transfer_recipe import read_transfer_recipe
from dsv32.posttrain.transfer_report import STAGES
from dsv32.recipe import RecipeError
from dsv32.synth.programmatic import SplitError, cached_set, tasks_of
from dsv32.synth.programmatic.domains import DOMAIN_NAMES

SHIPPED = "configs/posttrain-transfer-smollm2.toml"
KEYS = {
    "envs_synthesized": int, "synth_heldout_tasks": int, "synth_heldout_sft": float, "synth_heldout_rl": float,
    "synth_heldout_intervals_apart": bool, "general_sft": float, "general_rl": float, "bfcl_entries": int,
    "bfcl_base": float, "bfcl_sft": float, "bfcl_rl": float, "bfcl_rl_code": float, "bfcl_mcnemar_p": float,
    "minutes": float,
}  # fmt: skip
HELDOUT = ["airline", "gym", "school", "winery", "zoo"]


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    """One cache (synthesized sets, general-tools bundles) for the module's tests."""
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "transfer-cache"))


# --------------------------------------------------------------------------------------- the recipe
def test_the_shipped_recipe_reads_and_its_split_is_disjoint(tmp_path):
    recipe = read_transfer_recipe(SHIPPED, [], str(tmp_path))
    train, held = set(recipe.split.train), set(recipe.split.heldout)
    assert not train & held and train | held == set(DOMAIN_NAMES) and len(held) == 5
    assert recipe.synth.envs == 600 and recipe.synth.heldout >= 200 and recipe.synth.min_heldout >= 200
    assert len(recipe.bfcl.categories) * recipe.bfcl.per_category >= 400
    assert set(recipe.bfcl.categories) == {"simple_python", "multiple", "parallel"}
    assert recipe.general.sets == ["heldout"] and recipe.prompt == "env"
    # the two arms: the same GRPO settings, the synthesized training tasks against the interpreter alone
    assert [e.name for e in recipe.rl.envs] == ["synth-general"]
    assert [e.name for e in recipe.rl_code.envs] == ["code-interpreter"]
    assert recipe.rl.rl.grpo == recipe.rl_code.rl.grpo and recipe.rl.rl.sampling == recipe.rl_code.rl.sampling
    assert recipe.rl.rl.out_dir != recipe.rl_code.rl.out_dir
    assert all(not e.eval_tasks for e in [*recipe.rl.envs, *recipe.rl_code.envs])
    assert not any(tmp_path.iterdir())  # reading writes nothing


def test_a_synthesized_set_splits_as_the_recipe_says(tmp_path, cache):
    recipe = read_transfer_recipe(SHIPPED, [f"synth.heldout_domains={json.dumps(HELDOUT)}"], str(tmp_path))
    where = cached_set(24, seed=0, heldout=HELDOUT)
    train, heldout = tasks_of(where, "train"), tasks_of(where, "heldout")
    assert {t.domain for t in train} <= set(recipe.split.train)
    assert {t.domain for t in heldout} == set(HELDOUT)
    general = resolve_tasks("general-tools", "heldout")
    shared = transfer.check_never_trained(train, heldout, general)
    assert shared["general_tools_tools_trained"] == 0
    with pytest.raises(SplitError, match="held-out domain"):  # a held-out task among the training ones
        transfer.check_never_trained([*train, heldout[0]], heldout, general)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('synth.train_domains=["zoo", "farm"]', "share \\['zoo'\\]"),  # zoo is held out
        ('synth.train_domains=["gym"]', "are held out"),  # by the split drawn with the seed
        ('synth.heldout_domains=["atlantis"]', "heldout_domains"),
        ("synth.heldout_fraction=1.0", "heldout_fraction"),
        ('rl.envs=[{name = "code-interpreter"}]', "remove \\[\\[rl.envs\\]\\]"),
        ("code.coldstart=64", "leaves none"),
        ("general.sets=[]", "sets is empty"),
        ('bfcl.categories=["simple_python", "simple_python"]', "distinct"),
        ('bfcl.categories=["irrelevance"]', "categories"),
    ],
)
def test_an_overlapping_split_or_a_bad_value_is_refused_before_any_model_loads(
    tmp_path, monkeypatch, override, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(transfer, "prepare_sft_model", no_model)
    drawn = override == 'synth.train_domains=["gym"]'  # the split of heldout_fraction and the seed
    sets = [override] if drawn else [f"synth.heldout_domains={json.dumps(HELDOUT)}", override]
    with pytest.raises(RecipeError, match=message):
        run_proof(SHIPPED, sets, str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


def test_the_synthesized_set_is_checked_before_the_model_loads(tmp_path, monkeypatch, cache):
    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(transfer, "prepare_sft_model", no_model)
    sets = [
        "synth.envs=24",
        f"synth.heldout_domains={json.dumps(HELDOUT)}",
        "synth.heldout=0",
        "synth.coldstart=2",
    ]
    with pytest.raises(RecipeError, match="fewer than min_heldout = 200"):  # 24 environments: too few
        run_proof(SHIPPED, sets, str(tmp_path / "p"))

    def leaking(train, heldout):  # as if a training environment had a held-out tool name
        raise SplitError("the split leaks held-out names into training: x has held-out tool 'y'")

    monkeypatch.setattr(transfer, "check_disjoint", leaking)
    with pytest.raises(SplitError, match="leaks"):
        run_proof(SHIPPED, [*sets, "synth.min_heldout=1"], str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()


def test_posttrain_rl_refuses_the_transfer_recipe():
    from dsv32.posttrain.rl import read_rl_recipe

    with pytest.raises(RecipeError, match="posttrain proof"):
        read_rl_recipe(SHIPPED, [], {})


# --------------------------------------------------------------------------------------- the pipeline
def test_a_tiny_transfer_run_writes_every_key_with_valid_intervals(
    tmp_path, monkeypatch, capsys, cache, one_thread
):
    import torch

    import dsv32.engine.models as models
    import dsv32.rl.agentic.trainer as trainer

    real_config = models.tiny_llama_config  # a window that holds the tools blocks in byte tokens
    monkeypatch.setattr(models, "tiny_llama_config", lambda **o: real_config(**({"max_position_embeddings": 16384} | o)))  # fmt: skip
    starts: list[dict] = []
    real_train = trainer.train_agentic

    def recording_train(cfg, *, policy, **kwargs):  # the weights each arm starts from
        starts.append({k: v.clone() for k, v in policy.model.state_dict().items()})
        return real_train(cfg, policy=policy, **kwargs)

    sampled: list[tuple[str, str]] = []
    real_run = trainer.run_episodes

    def recording_run(policy, jobs, sampling, *args, **kwargs):
        if sampling.temperature > 0:  # GRPO's episodes (every evaluation is greedy)
            sampled.extend((domain, task.domain) for _, task, domain in jobs)
        return real_run(policy, jobs, sampling, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_agentic", recording_train)
    monkeypatch.setattr(trainer, "run_episodes", recording_run)
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=8192", "sft.train.epochs=1",
            "synth.envs=24", "synth.coldstart=2", "synth.heldout=2", "synth.min_heldout=2", "synth.eval_batch=1",
            f"synth.heldout_domains={json.dumps(HELDOUT)}", "code.train=3", "code.coldstart=1", "code.heldout=1",
            "general.tasks=1", "bfcl.per_category=2", "bfcl.max_tokens=4", "rl.grpo.steps=1",
            "rl.grpo.prompts_per_step=1", "rl.grpo.group_size=2", "rl.grpo.mini_batches=1",
            "rl.sampling.max_new_tokens=8", "rl.agentic.max_steps=2"]  # fmt: skip
    out = tmp_path / "p"
    argv = ["posttrain", "proof", SHIPPED, "--out", str(out), "--no-progress"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    report = json.loads((out / "report.json").read_text())
    assert {k: v for k, v in report.items() if k != "details"} == printed
    for key, kind in KEYS.items():
        assert isinstance(report[key], kind) or (kind is float and type(report[key]) is int), key
        if kind is float and key != "minutes":
            assert 0.0 <= report[key] <= 1.0, key
    assert report["envs_synthesized"] == 24 and report["synth_heldout_tasks"] == 2
    assert report["bfcl_entries"] == 6 and report["general_tasks"] == 1
    for name, suite in report["suites"].items():
        for stage in STAGES:
            s = suite[stage]
            lo, hi = s["interval"]
            assert 0.0 <= lo <= s["accuracy"] <= hi <= 1.0, (name, stage)
            assert [lo, hi] == list(wilson(round(s["accuracy"] * s["episodes"]), s["episodes"]))
            assert (s["vs_sft"] is None) == (stage == "sft")
            assert s["vs_sft"] is None or 0.0 <= s["vs_sft"]["mcnemar_p"] <= 1.0
    # every stage ran the same tasks of each suite, the held-out synthesized ones of held-out domains
    held = [t.id for t in load_tasks(out / "synth_heldout.jsonl")]
    assert {t.domain for t in load_tasks(out / "synth_heldout.jsonl")} <= set(HELDOUT)
    for suite in ("synth_heldout", "general", "code_heldout", "bfcl"):
        ids = [[o["id"] for o in json.loads((out / "eval" / f"{suite}_{s}.json").read_text())["outcomes"]]
               for s in STAGES]  # fmt: skip
        assert all(x == ids[0] for x in ids) and ids[0], suite
    synth_rl = json.loads((out / "eval" / "synth_heldout_rl.json").read_text())  # one episode at a time
    assert [o["id"] for o in synth_rl["outcomes"]] == held and synth_rl["episodes"] == 2
    # GRPO sampled training domains only: the synthesized arm, then the code interpreter alone
    assert len(sampled) == 4 and {d for d, _ in sampled[:2]} == {"synth-general"}
    assert {dom for _, dom in sampled[:2]} <= set(DOMAIN_NAMES) - set(HELDOUT)
    assert {d for d, _ in sampled[2:]} == {"code-interpreter"}
    # both arms started from the SFT weights
    from transformers import AutoModelForCausalLM

    sft = AutoModelForCausalLM.from_pretrained(out / "sft" / "model").state_dict()
    assert len(starts) == 2
    for start in starts:
        assert all(torch.equal(start[k], sft[k]) for k in sft)
    cold = report["details"]["cold_start"]
    assert cold["synth"]["kept"] == 2 and cold["code"]["kept"] == 1
    coldstart_ids = [json.loads(x)["id"] for x in (out / "coldstart.jsonl").read_text().splitlines()]
    assert not set(coldstart_ids) & set(held)
    for name in ("report.md", "report.png", "bfcl/rl_code/parallel/results.json", "rl/metrics.jsonl",
                 "rl_code/metrics.jsonl"):  # fmt: skip
        assert (out / name).exists(), name
    text = (out / "report.md").read_text()
    assert "GRPO on the code interpreter only" in text and "BFCL single-turn" in text
