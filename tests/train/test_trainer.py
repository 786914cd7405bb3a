"""The DSA trainer on tiny random models: stage semantics, exact resume, replay, native model."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch

pytest.importorskip("transformers")

from helpers.train import TINY_DSA, token_data

from dsv32.dsa import DSAConfig
from dsv32.train import ModelSpec, StageConfig, load_dsa_model, read_metrics, train_stage
from dsv32.train.dsa.trainer import lr_factor


def load(name="tiny-llama"):
    return load_dsa_model(ModelSpec(name=name), TINY_DSA)


def snapshot(dm):
    return {n: p.detach().clone() for n, p in dm.model.named_parameters()}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_warmup_trains_only_the_indexer_and_sparse_trains_everything(tmp_path, name):
    dm = load(name)
    data = token_data()
    before = snapshot(dm)
    warm = train_stage(
        dm, data, StageConfig(stage="warmup", steps=3, batch_size=2, lr=1e-2), tmp_path / "w", progress=False
    )
    after = snapshot(dm)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".indexer." in n for n in changed)
    assert any(".indexer.wq_b." in n for n in changed) and any(".indexer.wk." in n for n in changed)
    assert len(warm.metrics) == 3 and all(m["loss_indexer"] >= 0 for m in warm.metrics)
    assert (tmp_path / "w" / "loss.png").is_file() and (tmp_path / "w" / "model").is_dir()
    sparse = train_stage(
        dm,
        data,
        StageConfig(stage="sparse", steps=2, batch_size=2, lr=1e-3, index_topk=8),
        tmp_path / "s",
        progress=False,
    )
    final = snapshot(dm)
    assert any(not torch.equal(after[n], final[n]) for n in after if ".indexer." not in n)
    assert all("loss_lm" in m and m["grad_norm_model"] is not None for m in sparse.metrics)
    assert all(p.requires_grad for p in dm.model.parameters())  # restored after training


@pytest.mark.parametrize("stage", ["warmup", "sparse"])
def test_exact_resume_retraces_the_same_loss_curve(tmp_path, stage):
    data = token_data()
    cfg = StageConfig(
        stage=stage,
        steps=6,
        batch_size=2,
        grad_accum=2,
        lr=3e-3,
        warmup_steps=2,
        loss_queries=20,
        save_every=2,
    )
    straight = load()
    train_stage(straight, data, cfg, tmp_path / "a", progress=False)
    first = load()
    train_stage(first, data, cfg, tmp_path / "b", progress=False, stop_after=3)  # "interrupted" after step 3
    assert [m["step"] for m in read_metrics(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3]
    resumed = load()  # a fresh process: model rebuilt, state from the checkpoint
    train_stage(resumed, data, cfg, tmp_path / "b", progress=False)
    a = read_metrics(tmp_path / "a" / "metrics.jsonl")
    b = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, 7))
    for x, y in zip(a, b):
        assert x["loss_indexer"] == y["loss_indexer"] and x.get("loss_lm") == y.get("loss_lm"), (x, y)
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(p, q), n


def test_replayed_activations_give_the_online_gradient(tmp_path):
    data = token_data(n=4)
    online, replayed = load(), load()
    train_stage(
        online,
        data,
        StageConfig(stage="warmup", steps=1, batch_size=4, lr=1e-2),
        tmp_path / "o",
        progress=False,
    )
    cfg = StageConfig(stage="warmup", steps=1, batch_size=4, lr=1e-2, replay=2, replay_pool=4)
    train_stage(replayed, data, cfg, tmp_path / "r", progress=False)
    for (n, p), (_, q) in zip(online.model.named_parameters(), replayed.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=n)
    # Replay reuses each pool: 3 steps of batch 2 over a pool of 2 read 2 distinct sequences.
    cfg = StageConfig(stage="warmup", steps=3, batch_size=2, lr=1e-2, replay=3, replay_pool=2)
    result = train_stage(load(), token_data(n=8), cfg, tmp_path / "r2", progress=False)
    assert result.steps == 3


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = StageConfig(stage="sparse", steps=10, warmup_steps=2, min_lr_ratio=0.1)
    f = [lr_factor(s, cfg) for s in range(10)]
    assert f[0] == 0.5 and f[1] == 1.0 and f[2] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(f[2:])) and f[-1] == pytest.approx(0.1)
    assert StageConfig(stage="warmup").lr == 1e-3 and StageConfig(stage="sparse").lr == 7.3e-6


def test_saved_stage_reloads(tmp_path):
    dm = load()
    data = token_data()
    train_stage(
        dm, data, StageConfig(stage="warmup", steps=2, batch_size=2, lr=1e-2), tmp_path / "w", progress=False
    )
    meta = json.loads((tmp_path / "w" / "model" / "dsa_config.json").read_text())
    assert meta["base"] == "tiny-llama"  # indexers only: the base is unchanged
    again = load_dsa_model(ModelSpec(name=str(tmp_path / "w" / "model")))
    x = data.eval_sequences()[:1]
    dm.set_mode("sparse")
    again.set_mode("sparse")
    with torch.no_grad():
        torch.testing.assert_close(again.logits(x), dm.logits(x))
    train_stage(dm, data, StageConfig(stage="sparse", steps=1, batch_size=2), tmp_path / "s", progress=False)
    full = load_dsa_model(ModelSpec(name=str(tmp_path / "s" / "model")))
    with torch.no_grad():
        torch.testing.assert_close(full.logits(x), dm.logits(x))


def test_native_gradient_isolation():
    dm = load("tiny-native")
    dm.set_mode("sparse", 8)
    dm.collect_losses(True)
    x = token_data(n=2).train_sequences()
    nll, n = dm.lm_loss_sum(x)
    losses = dm.pop_losses()
    assert len(losses) == 2
    idx = {id(p) for _, p in dm.indexer_named_parameters()}
    (nll / n).backward(retain_graph=True)
    assert all(p.grad is None for p in dm.model.parameters() if id(p) in idx)
    dm.model.zero_grad(set_to_none=True)
    sum(losses.values()).backward()
    assert all(p.grad is None for p in dm.model.parameters() if id(p) not in idx)
    assert all(p.grad is not None for _, p in dm.indexer_named_parameters())


def test_a_stage_resumes_only_its_own_run_and_checks_everything_before_writing(tmp_path):
    from dsv32.runlog import CheckpointError
    from dsv32.train import TrainConfigError

    data, out = token_data(), tmp_path / "w"
    run = {"model": {"name": "tiny-llama"}, "data": {"source": "a"}}
    cfg = StageConfig(stage="warmup", steps=2, batch_size=2, lr=1e-2)
    train_stage(load(), data, cfg, out, progress=False, run=run)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(
        CheckpointError, match=r"belongs to another run \(data.source \"a\" → \"b\", warmup.lr"
    ):
        train_stage(load(), data, StageConfig(stage="warmup", steps=4, batch_size=2, lr=0.5), out,
                    progress=False, run={**run, "data": {"source": "b"}})  # fmt: skip
    with pytest.raises(CheckpointError, match=r'stage "warmup" → "sparse"'):
        train_stage(load(), data, StageConfig(stage="sparse", steps=4, batch_size=2, lr=1e-2, index_topk=8),
                    out, progress=False, run=run)  # fmt: skip
    wide = load_dsa_model(
        ModelSpec(name="tiny-llama"), DSAConfig(index_n_heads=2, index_head_dim=32, index_topk=8)
    )
    with pytest.raises(
        CheckpointError, match=r"weights.safetensors does not fit the model \(.* in the checkpoint"
    ):
        train_stage(wide, data, StageConfig(stage="warmup", steps=2, batch_size=2, lr=1e-2), out,
                    progress=False, run=run)  # fmt: skip
    with pytest.raises(TrainConfigError, match="replay_pool=3 must be a multiple of batch_size=2"):
        train_stage(load(), data, StageConfig(stage="warmup", steps=500, batch_size=2, lr=0.9, replay=2,
                    replay_pool=3), out, progress=False, resume=False)  # fmt: skip
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    again = train_stage(load(), data, cfg, out, progress=False, run=run)  # finished: nothing to do
    assert again.steps == 2 and [m["step"] for m in read_metrics(out / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize("stage", ["warmup", "sparse"])
def test_resuming_with_another_number_of_steps_is_refused(tmp_path, stage):
    """``steps`` sets the cosine schedule (and how many sequences a run packs): extending a finished
    run would jump the learning rate back up and re-read data, so it is refused with a clear message."""
    from dsv32.runlog import CheckpointError

    data, out = token_data(), tmp_path / stage
    cfg = StageConfig(
        stage=stage, steps=4, batch_size=2, lr=1e-2, index_topk=8 if stage == "sparse" else None
    )
    train_stage(load(), data, cfg, out, progress=False, stop_after=2)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for steps in (8, 3):
        with pytest.raises(
            CheckpointError,
            match=rf"step_000002 belongs to a 4-step {stage} stage, not {steps}: the number of steps sets the "
            r"learning-rate schedule.*\(--steps 4\)",
        ):
            train_stage(load(), data, replace(cfg, steps=steps), out, progress=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    with pytest.raises(
        CheckpointError, match=rf"another run \({stage}.lr 0.01 → 0.02, {stage}.steps 4 → 8\)"
    ):
        train_stage(load(), data, replace(cfg, steps=8, lr=2e-2), out, progress=False)
    done = train_stage(load(), data, cfg, out, progress=False)  # the same steps resume
    assert [m["step"] for m in done.metrics] == [3, 4]
    fresh = train_stage(load(), data, replace(cfg, steps=8), out, progress=False, resume=False)
    assert fresh.steps == 8


def test_dsa_stages_take_no_resume():
    from dsv32.cli import build_parser

    assert build_parser().parse_args(["dsa", "warmup", "--no-resume"]).no_resume
    assert not build_parser().parse_args(["dsa", "sparse"]).no_resume


def test_the_logged_learning_rates_are_the_ones_the_optimizer_used(tmp_path, monkeypatch):
    from dsv32.train import TrainConfigError
    from dsv32.train.dsa.config import load_run_config

    with pytest.raises(
        TrainConfigError, match=r"\[warmup\] indexer_lr = 0.5: the warm-up trains only the indexer"
    ):
        load_run_config(None, ["warmup.indexer_lr=0.5"])
    with pytest.raises(TrainConfigError, match="indexer_lr is the sparse stage's"):
        StageConfig(stage="warmup", indexer_lr=0.5)
    used, step = [], torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        used.append({g["side"]: g["lr"] for g in self.param_groups})
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    cfg = StageConfig(
        stage="sparse", steps=3, batch_size=2, lr=1e-3, indexer_lr=0.5, warmup_steps=1, index_topk=8
    )
    result = train_stage(load(), token_data(), cfg, tmp_path / "s", progress=False)
    assert [(m["lr"], m["lr_indexer"]) for m in result.metrics] == [(u["model"], u["indexer"]) for u in used]
    assert result.metrics[0]["lr_indexer"] == 0.5 and result.metrics[0]["lr"] == 1e-3
    used.clear()
    warm = train_stage(load(), token_data(), StageConfig(stage="warmup", steps=2, batch_size=2, lr=3e-3), tmp_path / "w",
                       progress=False)  # fmt: skip
    assert [m["lr"] for m in warm.metrics] == [
        u["indexer"] for u in used
    ] and "lr_indexer" not in warm.metrics[0]


def test_the_demo_and_dsa_sparse_train_at_the_same_top_k(tmp_path, monkeypatch):
    """The sparse stage's top-k is ``sparse.index_topk``, else the model's DSA config — in ``dsv32 demo``
    as in ``dsv32 dsa sparse`` — never the evaluation's first top-k."""
    import dsv32.train.dsa.pipeline as pipeline
    from dsv32.train.dsa.config import load_run_config

    (tmp_path / "doc.txt").write_text("text")
    cfg = load_run_config(
        None,
        [
            "model.name=tiny-llama", "dsa.index_n_heads=2", "dsa.index_head_dim=16", "dsa.index_topk=8",
            f"data.source={json.dumps(str(tmp_path / 'doc.txt'))}", "data.seq_len=32", "eval.seq_lens=[32]",
            "eval.topks=[4]", "eval.sequences=1", "warmup.steps=1", "warmup.batch_size=2", "sparse.steps=1",
            "sparse.batch_size=2", f"out_dir={json.dumps(str(tmp_path / 'run'))}",
        ],
    )  # fmt: skip
    monkeypatch.setattr(pipeline, "prepare_data", lambda *a, **k: token_data())
    trained_at, real = {}, pipeline.train_stage

    def train_stage(dm, data, stage_cfg, *args, **kwargs):
        result = real(dm, data, stage_cfg, *args, **kwargs)
        trained_at[stage_cfg.stage] = dm.topk
        return result

    monkeypatch.setattr(pipeline, "train_stage", train_stage)
    pipeline.run_demo(cfg, progress=False)
    assert trained_at["sparse"] == 8  # the model's DSA config, not eval.topks[0] = 4
    pipeline.run_stage(cfg, "sparse", tmp_path / "stage", progress=False)
    assert trained_at["sparse"] == 8
    pipeline.run_demo(replace(cfg, sparse=replace(cfg.sparse, index_topk=6)), progress=False)
    assert trained_at["sparse"] == 6
