"""Recipes (TOML + overrides) and the data pipeline (documents, split, packing, order)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dsv32.train.dsa.config import DataConfig, StageConfig, TrainConfigError, load_run_config
from dsv32.train.dsa.data import is_held_out, list_documents, load_token_data, sequence_order
from dsv32.train.dsa.pipeline import config_from_cli, demo_config

ROOT = Path(__file__).resolve().parents[2]


class CharTokenizer:
    """A stand-in tokenizer: one id per byte, 256 = end of text."""

    eos_token_id = 256

    def get_vocab(self):
        return {"<|endoftext|>": 256}

    def __call__(self, text, add_special_tokens=False, verbose=False):
        return {"input_ids": list(text.encode())}


def test_recipes_in_configs_load_and_the_demo_recipe_matches_the_built_in_one():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        if path.name.startswith(("rl-", "sft-", "posttrain-")):
            continue  # GRPO, SFT and post-training recipes are tested with their packages
        cfg = load_run_config(path)
        assert cfg.warmup.stage == "warmup" and cfg.sparse.stage == "sparse", path
    demo = demo_config()  # the shipped recipe file, as `dsv32 demo` reads it
    assert demo.model.name == "smollm2" and demo.dsa.index_topk == 256 and demo.out_dir == "runs/demo"
    assert demo.warmup.steps == 240 and demo.warmup.replay == 10 and demo.sparse.steps == 2


def test_overrides_defaults_and_errors(tmp_path):
    source = f"data.source={json.dumps(str(tmp_path))}"
    cfg = load_run_config(None, ["warmup.steps=7", "dsa.layers=[0, 2]", source, "sparse.lr=1e-5"])
    assert cfg.warmup.steps == 7 and cfg.dsa.layers == [0, 2] and cfg.data.source == str(tmp_path)
    assert cfg.warmup.lr == 1e-3 and cfg.sparse.lr == 1e-5  # unset lr → the paper's value for the stage
    with pytest.raises(TrainConfigError, match="unknown keys"):
        load_run_config(None, ["warmup.stepz=3"])
    with pytest.raises(TrainConfigError, match="unknown sections"):
        load_run_config(None, ["optim.lr=3"])
    with pytest.raises(TrainConfigError, match="replay"):
        StageConfig(stage="sparse", replay=2)
    bad = tmp_path / "bad.toml"
    bad.write_text("[warmup\n")
    with pytest.raises(TrainConfigError, match="not valid TOML"):
        load_run_config(bad)
    cfg, out = config_from_cli(
        "eval", {"model": "m", "seq_len": 512, "topk": 64, "set": ["eval.sequences=3"], "out": str(tmp_path)}
    )
    assert (
        cfg.model.name == "m"
        and cfg.eval.seq_lens == [512]
        and cfg.eval.topks == [64]
        and cfg.eval.sequences == 3
    )
    assert out == tmp_path


def test_sparse_and_eval_pick_up_the_previous_stage(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="dsv32.train.dsa.pipeline"):
        cfg, _ = config_from_cli("sparse", {"set": [f"out_dir={json.dumps(str(tmp_path))}"]})
    assert "no warmup/model under" in caplog.text and "untrained indexers" in caplog.text
    assert cfg.model.name == "smollm2"
    caplog.clear()
    (tmp_path / "warmup" / "model").mkdir(parents=True)
    cfg, _ = config_from_cli("sparse", {"set": [f"out_dir={json.dumps(str(tmp_path))}"]})
    assert cfg.model.name == str(tmp_path / "warmup" / "model")
    (tmp_path / "sparse" / "model").mkdir(parents=True)
    cfg, _ = config_from_cli("eval", {"set": [f"out_dir={json.dumps(str(tmp_path))}"]})
    assert cfg.model.name == str(tmp_path / "sparse" / "model")
    assert "untrained" not in caplog.text


def test_documents_split_by_name_and_pack(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):
        (corpus / f"doc{i}.txt").write_text(f"document {i} " * 20)
    (corpus / "skip.bin").write_bytes(b"\x00")
    jsonl = tmp_path / "extra.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": f"record {i} " * 10}) for i in range(5)) + "\n")
    cfg = load_run_config(
        None, [f"data.source={json.dumps(f'{corpus},{jsonl}')}", "data.seq_len=64", "data.eval_percent=20"]
    ).data
    docs = list_documents(cfg)
    assert len(docs) == 65 and {d.name for d in docs if d.line is not None} == {
        f"extra.jsonl:{i}" for i in range(5)
    }
    held = [d.name for d in docs if is_held_out(d.name, 20.0)]
    assert 3 < len(held) < 25  # ~20 %
    assert held == [d.name for d in docs if is_held_out(d.name, 20.0)]  # deterministic
    data = load_token_data(cfg, CharTokenizer(), 10_000, 2_000)
    seqs = data.train_sequences()
    assert seqs.shape[1] == 64 and seqs.dtype == torch.long and (seqs == 256).any()  # separators
    assert data.eval_sequences(32).shape[1] == 32
    again = load_token_data(cfg, CharTokenizer(), 10_000, 2_000)
    assert torch.equal(again.train_stream, data.train_stream)
    with pytest.raises(TrainConfigError, match="existing files"):  # checked when the recipe is read
        load_run_config(None, ["data.source=/no/such/path"])
    with pytest.raises(TrainConfigError, match="neither"):  # and by the reader itself
        list_documents(DataConfig(source="/no/such/path"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(TrainConfigError, match="text_field"):
        load_token_data(
            load_run_config(None, [f"data.source={json.dumps(str(bad))}"]).data, CharTokenizer(), 100, 100
        )


def test_stdlib_corpus_is_found_and_split():
    cfg = load_run_config(None).data
    docs = list_documents(cfg)
    assert len(docs) > 300 and all(d.name.startswith("stdlib/") for d in docs)
    assert not any("site-packages" in d.name for d in docs)
    held = sum(is_held_out(d.name, cfg.eval_percent) for d in docs)
    assert 0.02 < held / len(docs) < 0.09


def test_sequence_order_is_a_permutation_per_pass_and_resumable():
    order = sequence_order(5, seed=3, start=0, count=15)
    for p in range(3):
        assert sorted(order[5 * p : 5 * p + 5]) == list(range(5))
    assert sequence_order(5, seed=3, start=7, count=4) == order[7:11]


def test_a_jsonl_source_line_that_is_not_utf8_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n\n{"text": "b"}\r{"text": "c\xff"}\n')
    with pytest.raises(TrainConfigError, match=r"docs\.jsonl:4: not UTF-8 text \(byte 0xff at column 12\)"):
        list_documents(DataConfig(source=str(path)))


def test_jsonl_records_are_numbered_as_text_lines_and_read_from_their_own_bytes(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [
        b'{"text": "a"}\r\n',
        b"\n",
        b'{"text": "b\xc3\xa9"}\r',
        b"  \n",
        b'{"text": "c"}\n',
        b'{"text": "d"}',
    ]
    path.write_bytes(b"".join(lines))
    docs = list_documents(DataConfig(source=str(path)))
    assert [(d.name, d.read("text")) for d in docs] == [
        ("docs.jsonl:0", "a"), ("docs.jsonl:2", "bé"), ("docs.jsonl:4", "c"), ("docs.jsonl:5", "d"),
    ]  # fmt: skip
    # A record is read by its byte range: the lines before it are not read again (they are garbage now).
    path.write_bytes(b"\xff" * sum(map(len, lines[:4])) + b"".join(lines[4:]))
    assert docs[2].read("text") == "c" and docs[3].read("text") == "d"


def test_a_bad_data_source_fails_before_the_model_is_loaded(tmp_path, monkeypatch):
    from dsv32.train.dsa import pipeline

    bad = tmp_path / "docs.jsonl"
    bad.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    cfg = load_run_config(
        None, [f"data.source={json.dumps(str(bad))}", f"out_dir={json.dumps(str(tmp_path / 'out'))}"]
    )

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the data source was checked")

    monkeypatch.setattr(pipeline, "load_dsa_model", no_model)
    for run in (
        lambda: pipeline.run_stage(cfg, "warmup"),
        lambda: pipeline.run_eval(cfg),
        lambda: pipeline.run_demo(cfg),
    ):
        with pytest.raises(TrainConfigError, match=r"docs\.jsonl:2: not UTF-8"):
            run()


def test_a_recipe_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "r.toml"
    path.write_bytes(b"[warmup]\nsteps = 2\n# caf\xe9\n")
    with pytest.raises(TrainConfigError, match=r"r\.toml: line 3: not UTF-8 text \(byte 0xe9 at column 6\)"):
        load_run_config(path)


@pytest.mark.parametrize(
    ("dsa", "message"),
    [
        ({"index_head_dim": 7}, "index_head_dim = 7: must be even"),
        ({"index_head_dim": 16, "index_rope_head_dim": 5}, "index_rope_head_dim = 5: must be even"),
        ({"index_head_dim": 16, "index_rope_head_dim": 32}, "index_rope_head_dim = 32: must be even"),
    ],
)
def test_dsa_shapes_that_rope_cannot_rotate_are_recipe_errors(tmp_path, dsa, message):
    from dsv32.train.dsa.config import run_config_from_dict

    with pytest.raises(TrainConfigError, match=re.escape(f"[dsa] {message}")):
        run_config_from_dict({"dsa": dsa, "out_dir": str(tmp_path / "out")})
    run_config_from_dict({"dsa": {"index_head_dim": 7, "index_rope_head_dim": 6}, "out_dir": str(tmp_path)})


def test_stage_betas_and_unwritable_out_dirs_are_recipe_errors(tmp_path):
    from dsv32.train.dsa.config import run_config_from_dict

    with pytest.raises(TrainConfigError, match=r"\[warmup\] betas = \[0\.9\]: must be two numbers"):
        run_config_from_dict({"warmup": {"betas": [0.9]}})
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainConfigError, match="file is not a directory"):
        run_config_from_dict({"out_dir": str(tmp_path / "file" / "out")})
    if Path("/proc/self").is_dir():  # a place that refuses new directories
        with pytest.raises(TrainConfigError, match="no directory can be made in /proc"):
            run_config_from_dict({"out_dir": "/proc/dsv32-out"})
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # the probe left nothing behind


def test_tiny_models_without_a_tokenizer_are_refused_by_the_commands(tmp_path):
    with pytest.raises(TrainConfigError, match="'tiny-llama': a random test model without a tokenizer"):
        config_from_cli("warmup", {"model": "tiny-llama", "out": str(tmp_path / "out")})


def test_a_single_text_file_is_split_by_position_and_trains(tmp_path):
    """One file cannot be split by its name: each 20,000-character block holds out its last
    eval_percent % instead, deterministically."""
    from dsv32.train.dsa.data import SPLIT_BLOCK_CHARS, position_split

    text = "".join(f"line {i}: some text of the corpus\n" for i in range(3000))  # ~100K characters
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    cfg = load_run_config(None, [f"data.source={json.dumps(str(corpus))}", "data.seq_len=256"]).data
    data = load_token_data(cfg, CharTokenizer(), 50_000, 2_000)
    assert data.train_sequences().shape[0] > 0 and data.eval_sequences().shape[0] > 0
    pieces = position_split(text, 5.0)
    assert "".join(p for _, p in pieces) == text  # every character in exactly one split, in order
    held = "".join(p for h, p in pieces if h)
    assert len(held) == round(len(text) * 0.05)
    assert held[:1000] == text[SPLIT_BLOCK_CHARS - 1000 : SPLIT_BLOCK_CHARS]  # the first block's tail
    first = bytes(data.eval_stream[:1000].tolist()).decode()
    assert first == held[:1000]  # the held-out stream is that text
    assert bytes(data.train_stream[:100].tolist()).decode() == text[:100]
    again = load_token_data(cfg, CharTokenizer(), 50_000, 2_000)  # a resume reads the same splits
    assert torch.equal(again.train_stream, data.train_stream)
    assert torch.equal(again.eval_stream, data.eval_stream)
    more = load_run_config(None, [f"data.source={json.dumps(str(corpus))}", "data.eval_percent=20"]).data
    assert load_token_data(more, CharTokenizer(), 10**6, 10**6).eval_stream.numel() > 3 * len(held)
    with pytest.raises(TrainConfigError, match="eval_percent = 0: must be in"):
        load_run_config(None, ["data.eval_percent=0"])


def test_a_multi_document_source_keeps_its_split_by_name(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"doc{i}.txt").write_text(f"document {i} " * 30)
    source = f"data.source={json.dumps(str(corpus))}"
    cfg = load_run_config(None, [source, "data.seq_len=64", "data.eval_percent=20"]).data
    data = load_token_data(cfg, CharTokenizer(), 10**6, 10**6)
    held = {d.name for d in list_documents(cfg) if is_held_out(d.name, 20.0)}
    assert 2 <= len(held) <= 20  # the name split gives each side text: whole documents are held out
    text = bytes(t for t in data.eval_stream.tolist() if t != 256).decode()
    assert sorted(text.split("document ")[1:]) == sorted(
        f"{n.removeprefix('doc').removesuffix('.txt')} " for n in held for _ in range(30)
    )


def test_stage_seeds_are_range_checked_when_the_recipe_is_read():
    from dsv32.train.dsa.config import MAX_SEED
    from dsv32.train.dsa.trainer import _query_rows

    for bad in (2**62, -1):
        with pytest.raises(TrainConfigError, match=rf"\[warmup\] seed = {bad}: must be in \[0, {MAX_SEED}\]"):
            config_from_cli("warmup", {"set": [f"warmup.seed={bad}"]})
    with pytest.raises(TrainConfigError, match=r"StageConfig\.seed = -5"):
        StageConfig(stage="sparse", seed=-5)
    cfg = load_run_config(None, [f"sparse.seed={MAX_SEED}", "sparse.loss_queries=4"]).sparse
    assert len(sequence_order(20, cfg.seed, 10**6, 2)) == 2  # the largest seed makes valid generators
    assert _query_rows(cfg, 10**7, 3, 16, "cpu").numel() == 4
