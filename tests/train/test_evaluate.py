"""DSA evaluation (perplexities, recall) and its report on a tiny random model."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers.train import TINY_DSA

from dsv32.dsa import DSAConfig, get_dsa, oracle_topk
from dsv32.train import ModelSpec, load_dsa_model
from dsv32.train.dsa.evaluate import EvalPoint, evaluate_dsa
from dsv32.train.dsa.report import report_dict, write_report


def test_eval_grid_report_and_consistency(tmp_path):
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    g = torch.Generator().manual_seed(0)
    seqs = {48: torch.randint(0, 257, (2, 48), generator=g), 24: torch.randint(0, 257, (2, 24), generator=g)}
    points = evaluate_dsa(dm, seqs, [8, 64], progress=False)
    assert [(p.seq_len, p.topk) for p in points] == [(48, 8), (48, 64), (24, 8), (24, 64)]
    head = points[0]
    assert 0 < head.attention_recall <= head.attention_recall_oracle <= 1 + 1e-6
    assert head.ppl_dsa != head.ppl_dense and head.ppl_dsa_untrained is not None
    assert len(head.per_layer) == 2 and head.recall_queries == 2 * (48 - 8)
    full = points[1]  # top-k >= L: DSA is the dense model
    assert full.ppl_dsa == pytest.approx(full.ppl_dense, rel=1e-6) and full.attention_recall == 1.0
    assert full.ppl_dsa_oracle == pytest.approx(full.ppl_dense, rel=1e-6)
    assert head.ppl_dsa_oracle is not None and head.ppl_dsa_oracle != head.ppl_dsa
    # Under selecting_oracle() the sparse layers attend to the oracle top-k of their own q/k.
    handle = get_dsa(dm.model)
    views = []
    dm.set_mode("sparse", 8)
    with handle.selecting_oracle(), handle.observing(views.append), torch.no_grad():
        dm.logits(seqs[48])
    assert len(views) == 2 and not handle.oracle
    for view in views:
        expected = oracle_topk(view.q, view.k, 8, scale=view.scale)
        assert torch.equal(view.topk_indices.sort(-1).values, expected.sort(-1).values)
    dm.set_mode("dense")
    assert get_dsa(dm.model).mode == "dense" and dm.topk == 8  # restored
    # Selecting with the trained indexer beats nothing in expectation, but a random indexer's recall
    # must sit between the trivial recency baseline and the oracle on every layer.
    for row in head.per_layer:
        assert 0 <= row["untrained"] <= row["oracle"] + 1e-6
    report = report_dict(points, model="tiny-llama")
    for key in ("seq_len", "topk", "attention_recall", "attention_recall_oracle", "ppl_dense", "ppl_dsa"):
        assert key in report
    assert report["ppl_dsa_untrained"] == head.ppl_dsa_untrained
    md = write_report(tmp_path, report, points)
    assert json.loads((tmp_path / "dsa_report.json").read_text())["topk"] == 8
    assert (tmp_path / "dsa_recall.png").is_file()
    text = md.read_text()
    assert "| dense |" in text and "oracle" in text and "## All lengths and top-k" in text


def test_native_model_eval_reports_perplexities_only():
    dm = load_dsa_model(ModelSpec(name="tiny-native"), DSAConfig(index_topk=8))
    seqs = {32: torch.randint(0, 257, (1, 32), generator=torch.Generator().manual_seed(1))}
    (point,) = evaluate_dsa(dm, seqs, [8], progress=False)
    assert point.attention_recall is None and point.ppl_dsa_untrained is None and point.ppl_dsa_oracle is None
    assert point.ppl_dense > 1 and point.ppl_dsa > 1


def test_without_the_untrained_baseline_no_untrained_recall_is_reported():
    dm = load_dsa_model(ModelSpec(name="tiny-llama"), TINY_DSA)
    seqs = {24: torch.randint(0, 257, (1, 24), generator=torch.Generator().manual_seed(2))}
    short, full = evaluate_dsa(dm, seqs, [8, 64], untrained=False, progress=False)
    assert short.attention_recall_untrained is None and full.attention_recall_untrained is None
    assert full.attention_recall == full.attention_recall_oracle == 1.0  # k >= L: complete selections
    (with_baseline,) = evaluate_dsa(dm, seqs, [64], progress=False)
    assert with_baseline.attention_recall_untrained == 1.0


def test_the_report_names_the_indexer_it_evaluated(tmp_path):
    from dsv32.train.dsa.pipeline import STAGE_LABELS, indexer_label
    from dsv32.train.dsa.report import INDEXER, markdown_report

    for stage in ("warmup", "sparse"):
        (tmp_path / stage / "model").mkdir(parents=True)
        (tmp_path / stage / "stage.json").write_text(json.dumps({"model": "smollm2", "stage": stage}))
    assert indexer_label(str(tmp_path / "sparse" / "model")) == STAGE_LABELS["sparse"]
    assert indexer_label(str(tmp_path / "warmup" / "model")) == "indexer after the warm-up"
    assert indexer_label("smollm2") == INDEXER == "the model's indexer"
    point = EvalPoint(seq_len=16, topk=4, sequences=1, tokens=15, ppl_dense=2.0, ppl_dsa=2.5)
    text = markdown_report(report_dict([point], indexer=indexer_label(str(tmp_path / "sparse" / "model"))))
    assert "| DSA, model and indexer after the sparse stage | 2.5000 | +25.00% |" in text
    assert "warmed-up" not in markdown_report(report_dict([point]))
