"""The long DSA recipe's evaluation: paired (length, top-k) points, text held out whole, where the
gap sits (query positions, layers) and the report's headline keys — on a tiny random model."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from importlib.resources import files

import pytest
import torch

pytest.importorskip("transformers")

from helpers.train import TINY_DSA, token_data

from dsv32.train import ModelSpec, load_dsa_model
from dsv32.train.dsa.config import DataConfig, EvalConfig, TrainConfigError, load_run_config
from dsv32.train.dsa.data import exclude_documents, list_documents, stdlib_docs
from dsv32.train.dsa.evaluate import evaluate_dsa, position_buckets


def test_stdlib_docs_is_the_language_reference_prose_and_training_can_leave_it_out():
    docs = list_documents(DataConfig(source="stdlib-docs"))
    assert docs == stdlib_docs() and len(docs) > 50
    assert len({d.name for d in docs}) == len(docs) and all(d.name.startswith("stdlib-docs/") for d in docs)
    text = "".join(d.read("text") for d in docs)
    assert len(text) > 200_000 and "the" in text.split()  # English prose, not escaped Python strings
    words = text.split()
    assert sum(w.isalpha() for w in words) / len(words) > 0.5
    code = list_documents(DataConfig(source="stdlib"))
    kept = exclude_documents(code, docs)
    assert [d.name for d in code if d not in kept] == ["stdlib/pydoc_data/topics.py"]
    assert DataConfig(source="stdlib,stdlib-docs").source == "stdlib,stdlib-docs"


def test_paired_points_token_budget_and_bad_settings():
    ev = EvalConfig(seq_lens=[2048, 8192], topks=[256, 512], pairs=True, tokens=16384)
    assert ev.grid() == [(2048, [256]), (8192, [512])]
    assert [ev.sequences_at(n) for n in (2048, 8192, 32768)] == [8, 2, 1]
    assert EvalConfig(seq_lens=[64, 32], topks=[8, 16]).grid() == [(64, [8, 16]), (32, [8, 16])]
    assert EvalConfig(sequences=3).sequences_at(2048) == 3
    with pytest.raises(TrainConfigError, match="same length"):
        EvalConfig(seq_lens=[2048, 8192], topks=[256], pairs=True)
    with pytest.raises(TrainConfigError, match="after_warmup"):
        load_run_config(None, ["eval.after_warmup='some'"])
    with pytest.raises(TrainConfigError, match="off_domain"):
        load_run_config(None, ["eval.off_domain='/no/such/dir'"])


def test_position_buckets_start_where_dsa_stops_being_exact():
    assert position_buckets(2048, 256) == [(0, 256), (256, 512), (512, 1024), (1024, 2047)]
    assert position_buckets(8192, 512) == [(0, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 8191)]
    assert position_buckets(32, 64) == [(0, 31)]
    for L, k in ((2048, 256), (100, 7), (33, 32)):
        b = position_buckets(L, k)
        assert b[0][0] == 0 and b[-1][1] == L - 1 and all(x[1] == y[0] for x, y in itertools.pairwise(b))


def test_the_gap_by_position_is_zero_before_k_and_adds_up_to_the_whole():
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    seqs = torch.randint(0, 257, (3, 48), generator=torch.Generator().manual_seed(0))
    (p,) = evaluate_dsa(dm, {48: seqs}, [8], untrained=False, progress=False)
    rows = p.by_position
    assert [(r["start"], r["end"]) for r in rows] == position_buckets(48, 8)
    first = rows[0]  # queries 0..7 see at most 8 keys: every selection is complete
    assert first["ppl_dsa"] == pytest.approx(first["ppl_dense"], rel=1e-6)
    assert first["ppl_dsa_oracle"] == pytest.approx(first["ppl_dense"], rel=1e-6)
    assert any(abs(r["ppl_gap"]) > 1e-4 for r in rows[1:])
    assert sum(r["tokens"] for r in rows) == p.tokens == 3 * 47
    for key in ("ppl_dense", "ppl_dsa", "ppl_dsa_oracle"):  # token-weighted log-perplexities add up
        whole = sum(r["tokens"] * math.log(r[key]) for r in rows) / p.tokens
        assert whole == pytest.approx(math.log(getattr(p, key)), rel=1e-6)


def _tiny_cfg(tmp_path, *extra):
    (tmp_path / "doc.txt").write_text("text")
    return load_run_config(
        None,
        [
            "model.name=tiny-llama", "dsa.index_n_heads=2", "dsa.index_head_dim=16", "dsa.index_topk=8",
            f"data.source={json.dumps(str(tmp_path / 'doc.txt'))}", "data.seq_len=32", "eval.seq_lens=[32, 64]",
            "eval.topks=[8, 16]", "eval.pairs=true", "eval.tokens=128", "warmup.steps=1", "warmup.batch_size=2",
            "sparse.steps=1", "sparse.batch_size=2", f"out_dir={json.dumps(str(tmp_path / 'run'))}", *extra,
        ],
    )  # fmt: skip


def test_the_long_recipe_reports_every_point_of_both_texts_after_the_sparse_stage(tmp_path, monkeypatch):
    import dsv32.train.dsa.pipeline as pipeline

    off_dir = tmp_path / "other"
    off_dir.mkdir()
    (off_dir / "prose.txt").write_text("words")
    cfg = _tiny_cfg(tmp_path, f"eval.off_domain={json.dumps(str(off_dir))}", "eval.after_warmup='first'")
    g = torch.Generator().manual_seed(1)
    held = {32: torch.randint(0, 257, (4, 32), generator=g), 64: torch.randint(0, 257, (2, 64), generator=g)}
    other = {32: torch.randint(0, 257, (4, 32), generator=g), 64: torch.randint(0, 257, (2, 64), generator=g)}
    monkeypatch.setattr(pipeline, "prepare_data", lambda *a, **k: token_data())
    monkeypatch.setattr(pipeline, "eval_sequences", lambda data, c: held)
    seen = {}

    def off_domain(c, dm, docs):
        seen["docs"] = [d.name for d in docs]
        return other

    monkeypatch.setattr(pipeline, "off_domain_sequences", off_domain)
    report = pipeline.run_demo(cfg, progress=False)
    assert seen["docs"] == ["prose.txt"]
    domains = report["domains"]
    assert set(domains) == {"in_domain", "off_domain"} and domains["off_domain"]["source"] == str(off_dir)
    # after the warm-up only the adaptation domain's first point; after the sparse stage everything
    assert [(p["seq_len"], p["topk"]) for p in domains["in_domain"]["after_warmup"]] == [(32, 8)]
    assert domains["off_domain"]["after_warmup"] == []
    for d in domains.values():
        assert [(p["seq_len"], p["topk"]) for p in d["after_sparse"]] == [(32, 8), (64, 16)]
        assert all(p["per_layer"] and p["by_position"] and p["ppl_dsa_oracle"] for p in d["after_sparse"])
    final = domains["in_domain"]["after_sparse"]
    assert (
        report["final_ppl_gap_same_model"]
        == final[0]["ppl_gap"]
        == report["after_sparse"]["ppl_gap_same_model"]
    )
    assert report["final_ppl_gap_same_model_64"] == final[1]["ppl_gap"]
    assert report["final_attention_recall"] == final[0]["attention_recall"]
    assert report["oracle_ppl_gap"] == pytest.approx(final[0]["ppl_dsa_oracle"] / final[0]["ppl_dense"] - 1)
    off = domains["off_domain"]["after_sparse"]
    assert report["final_ppl_gap_same_model_off_domain"] == off[0]["ppl_gap"]
    assert report["final_ppl_gap_same_model_64_off_domain"] == off[1]["ppl_gap"]
    assert report["minutes"] == pytest.approx(report["timings"]["total"] / 60)
    saved = json.loads((tmp_path / "run" / "dsa_report.json").read_text())
    assert saved["final_ppl_gap_same_model_64"] == report["final_ppl_gap_same_model_64"]
    md = (tmp_path / "run" / "dsa_report.md").read_text()
    assert "## After the sparse stage" in md and "by query position" in md and "recall per layer" in md
    assert "| 64 | 16 |" in md and "![recall per layer and gap by position" in md
    assert (tmp_path / "run" / "dsa_final.png").stat().st_size > 10_000


def test_text_held_out_whole_never_trains_and_may_not_take_all_of_it(tmp_path):
    import dsv32.train.dsa.pipeline as pipeline

    cfg = _tiny_cfg(tmp_path)
    cfg = replace(cfg, eval=replace(cfg.eval, off_domain=cfg.data.source))
    with pytest.raises(TrainConfigError, match="nothing is left to train on"):
        pipeline.run_demo(cfg, progress=False)


def test_the_shipped_long_recipe():
    cfg = load_run_config(files("dsv32") / "configs" / "smollm2-dsa-long.toml")
    assert cfg.eval.grid() == [(2048, [256]), (8192, [512])]
    assert cfg.eval.off_domain == "stdlib-docs" and cfg.out_dir == "runs/dsa-long"
    assert cfg.model.name == "smollm2" and cfg.dsa.index_topk == 256
    assert cfg.warmup.steps > 240 and cfg.sparse.steps > 2  # longer than the demo's stages


def test_a_stage_trains_at_its_own_length(tmp_path):
    from dsv32.train.dsa.config import StageConfig
    from dsv32.train.dsa.trainer import train_stage

    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    data = token_data(n=12, T=32)  # packed at 32; the stage reads 64-token sequences of the same stream
    cfg = StageConfig(stage="warmup", steps=2, batch_size=2, lr=1e-3, seq_len=64)
    result = train_stage(dm, data, cfg, tmp_path / "w", progress=False)
    assert [m["tokens"] for m in result.metrics] == [2 * 64, 4 * 64]
    with pytest.raises(TrainConfigError, match=r"warmup\.seq_len = 4096: the training text has 384 tokens"):
        train_stage(dm, data, replace(cfg, seq_len=4096), tmp_path / "x", progress=False)
