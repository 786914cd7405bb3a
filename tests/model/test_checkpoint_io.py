"""Checkpoint I/O beyond the plain round trip: tied embeddings, malformed checkpoints, memory
ownership of the loaded weights, safe saving, FP8 scale grids."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.hf_reference import make_hf_model
from helpers.model import tiny_config
from safetensors.torch import load_file, save_file

from dsv32.model import (
    CheckpointError,
    ConfigError,
    DeepseekV32,
    dequantize_fp8_blocks,
    quantize_fp8_blocks,
)


def _same_state(a: DeepseekV32, b: DeepseekV32) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tied_embeddings_round_trip_and_stay_tied(tmp_path):
    torch.manual_seed(0)
    model = DeepseekV32(tiny_config(tie_word_embeddings=True)).eval()
    model.save_pretrained(tmp_path)
    loaded = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert _same_state(model, loaded)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_transformers_tied_checkpoint_loads_tied(tmp_path):
    hf = make_hf_model(seed=0, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    ours = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max() < 1e-4


EXPERT = "model.layers.1.mlp.experts.0.gate_proj.weight"


def _saved(path, **config) -> dict[str, torch.Tensor]:
    """Save a tiny random model (one file) to ``path``; return its tensors by checkpoint name."""
    torch.manual_seed(0)
    DeepseekV32(tiny_config(**config)).save_pretrained(path)
    return load_file(path / "model.safetensors")


def _load_error(path) -> str:
    with pytest.raises(CheckpointError) as err:
        DeepseekV32.from_pretrained(path, dtype=torch.float32)
    return str(err.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s.update({"model.norm.weight": torch.ones(31)}), r"model\.norm\.weight .*\[31\].*\[32\]"),
        (lambda s: s.pop("model.norm.weight"), r"missing \['model\.norm\.weight'\]"),
        (lambda s: s.update({"model.foo.weight": torch.ones(3)}), r"unexpected \['model\.foo\.weight'\]"),
        (lambda s: s.update({"model.norm.weight": torch.ones(32, dtype=torch.int8)}), "norm.weight is int8"),
        # a routed expert's tensor is checked before it goes into the stacked expert weight
        (
            lambda s: s.update({EXPERT: torch.full((1, 32), 7.0)}),
            rf"{EXPERT} has shape \[1, 32\].*\[16, 32\]",
        ),
        (lambda s: s.update({EXPERT: torch.arange(32.0)}), rf"{EXPERT} has shape \[32\].*\[16, 32\]"),
        (lambda s: s.update({EXPERT: torch.tensor(5.0)}), rf"{EXPERT} has shape \[\].*\[16, 32\]"),
        (
            lambda s: s.update({EXPERT.replace(".0.", ".9."): torch.zeros(16, 32)}),
            "expert 9 .*n_routed_experts=4",
        ),
    ],
)
def test_tensors_that_do_not_fit_the_config_are_a_checkpoint_error(tmp_path, change, expected):
    state = _saved(tmp_path)
    change(state)
    save_file(state, tmp_path / "model.safetensors")
    assert re.search(expected, _load_error(tmp_path))


def test_malformed_files_are_a_checkpoint_error(tmp_path):
    _saved(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "not a safetensors file" in _load_error(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    assert "no *.safetensors" in _load_error(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))
    assert "has no weight_map" in _load_error(tmp_path)
    index.write_text("not json")
    assert "not a JSON index file" in _load_error(tmp_path)
    index.write_text(json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}))
    assert "model-00001-of-00002.safetensors" in _load_error(tmp_path)


def test_cli_prints_a_checkpoint_error_as_one_line(tmp_path, capsys):
    from dsv32.cli import main

    state = _saved(tmp_path)
    state["model.norm.weight"] = torch.ones(31)
    save_file(state, tmp_path / "model.safetensors")
    assert main(["generate", str(tmp_path), "--prompt-ids", "1,2", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsv32 generate: model.norm.weight has shape [31]") and err.count("\n") == 1


@pytest.mark.parametrize(
    "where", ["../outside/x.safetensors", "{tmp}/outside/x.safetensors", "sub/x.safetensors", ".."]
)
def test_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, where):
    where = where.format(tmp=tmp_path)  # an absolute path to a real file
    torch.manual_seed(0)
    DeepseekV32(tiny_config()).save_pretrained(tmp_path / "ckpt", max_shard_size=20_000)
    (tmp_path / "outside").mkdir()
    index_file = tmp_path / "ckpt" / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / "ckpt" / first).rename(tmp_path / "outside" / "x.safetensors")
    index["weight_map"] = {k: where if v == first else v for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    assert f"{where!r}, which is not a file name inside the checkpoint directory" in _load_error(
        tmp_path / "ckpt"
    )


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(128, 128), (129, 257), (300, 100), (1, 1), (127, 385), (256, 384)])
def test_fp8_dequantization_equals_the_blockwise_product(shape, scale_dtype):
    """Bit for bit ``q[i, j] · scale_inv[i // 128, j // 128]``, edge blocks included."""
    torch.manual_seed(0)
    q, scale_inv = quantize_fp8_blocks(torch.randn(shape) * torch.rand(shape[0], 1) * 5)
    scale_inv = scale_inv.to(scale_dtype)
    expected = torch.empty(shape)
    for bi in range(scale_inv.shape[0]):
        for bj in range(scale_inv.shape[1]):
            rows, cols = slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128)
            expected[rows, cols] = q[rows, cols].float() * scale_inv[bi, bj].float()
    assert torch.equal(dequantize_fp8_blocks(q, scale_inv), expected)


@pytest.mark.parametrize("grid", [(5, 5), (1, 2), (2, 1)])
def test_fp8_scale_grid_of_the_wrong_size_is_refused(grid):
    q = torch.zeros(32, 16).to(torch.float8_e4m3fn)  # one 128x128 block: scale_inv must be [1, 1]
    with pytest.raises(ValueError, match=r"must be \[1, 1\]"):
        dequantize_fp8_blocks(q, torch.ones(grid))


def _fp8_checkpoint(path, block=(128, 128)) -> dict[str, torch.Tensor]:
    """A tiny checkpoint whose matrices are FP8 in ``block``-shaped blocks (config.json saying so)."""
    state, fp8 = _saved(path), {}
    for name, t in state.items():
        if t.dim() == 2 and "embed" not in name:
            fp8[name], fp8[name + "_scale_inv"] = quantize_fp8_blocks(t, block)
        else:
            fp8[name] = t
    save_file(fp8, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block)}
    (path / "config.json").write_text(json.dumps(config))
    return fp8


def test_fp8_block_size_comes_from_the_quantization_config(tmp_path):
    fp8 = _fp8_checkpoint(tmp_path, block=(16, 8))
    name = "model.layers.0.self_attn.q_a_proj.weight"  # [24, 32]: a 2 x 4 grid of 16x8 blocks
    assert fp8[name + "_scale_inv"].shape == (2, 4)
    loaded = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    expected = dequantize_fp8_blocks(fp8[name], fp8[name + "_scale_inv"], (16, 8))
    assert torch.equal(loaded.model.layers[0].self_attn.q_a_proj.weight, expected)


@pytest.mark.parametrize("grid", [(5, 5), (2, 1)])
def test_fp8_checkpoint_with_a_scale_grid_of_the_wrong_size_is_refused(tmp_path, grid):
    fp8 = _fp8_checkpoint(tmp_path)
    name = "model.layers.0.self_attn.q_a_proj.weight_scale_inv"
    fp8[name] = torch.ones(grid)
    save_file(fp8, tmp_path / "model.safetensors")
    assert re.search(rf"{name}: .*must be \[1, 1\], got \[{grid[0]}, {grid[1]}\]", _load_error(tmp_path))


def test_malformed_weight_block_size_is_a_config_error(tmp_path):
    _fp8_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [128]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="weight_block_size"):
        DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaded_weights_own_their_memory(tmp_path, dtype):
    """No loaded tensor is a view of the checkpoint file: rewriting the file in place (as a save over
    it may) leaves the model's weights as they were, and no mapping of the file stays open."""
    torch.manual_seed(0)
    DeepseekV32(tiny_config()).save_pretrained(tmp_path)
    model = DeepseekV32.from_pretrained(tmp_path, dtype=dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    file = tmp_path / "model.safetensors"
    header = 8 + int.from_bytes(file.read_bytes()[:8], "little")
    with open(file, "r+b") as f:
        f.seek(header)
        f.write(bytes(file.stat().st_size - header))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    maps = Path("/proc/self/maps")
    if maps.exists():
        assert str(file) not in maps.read_text()


def test_truncated_file_is_a_checkpoint_error(tmp_path):
    _saved(tmp_path)
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    assert "model.safetensors is not a safetensors file" in _load_error(tmp_path)


def test_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    import dsv32.model.checkpoint as checkpoint

    torch.manual_seed(0)
    old = DeepseekV32(tiny_config())
    old.save_pretrained(tmp_path, max_shard_size=20_000)
    (tmp_path / "model_ema.safetensors").write_bytes(b"not ours")
    before = sorted(p.name for p in tmp_path.iterdir())
    calls, real = [], checkpoint.save_file

    def disk_full_at_second_shard(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", disk_full_at_second_shard)
    with pytest.raises(OSError, match="No space left"):
        DeepseekV32(tiny_config()).save_pretrained(tmp_path, max_shard_size=20_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left either
    assert _same_state(old, DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32))


def test_save_replaces_only_the_previous_checkpoints_shards(tmp_path):
    torch.manual_seed(0)
    DeepseekV32(tiny_config()).save_pretrained(tmp_path, max_shard_size=20_000)
    for other in ("model_ema.safetensors", "tokenizer.json"):
        (tmp_path / other).write_text("not ours")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    # The previous index may name its shards differently (the hub's model-00001-of-000163...).
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    renamed = {name: f"part-{i}.safetensors" for i, name in enumerate(shards)}
    for name, new in renamed.items():
        (tmp_path / name).rename(tmp_path / new)
    index["weight_map"] = {k: renamed[v] for k, v in index["weight_map"].items()}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32)
    loaded.save_pretrained(tmp_path)  # one file, into the directory it was loaded from
    names = {"config.json", "model.safetensors", "model_ema.safetensors", "tokenizer.json"}
    assert {p.name for p in tmp_path.iterdir()} == names
    assert _same_state(loaded, DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32))
    loaded.save_pretrained(tmp_path, max_shard_size=20_000)  # and back to shards
    assert not (tmp_path / "model.safetensors").exists() and (tmp_path / "model_ema.safetensors").exists()
    assert _same_state(loaded, DeepseekV32.from_pretrained(tmp_path, dtype=torch.float32))


def test_every_saved_file_is_synced_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    import os

    events, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append((str(a), str(b))), real_replace(a, b)))
    DeepseekV32(tiny_config()).save_pretrained(tmp_path, max_shard_size=20_000)
    renames = [e for e in events if isinstance(e, tuple)]
    assert {Path(dst).name for _, dst in renames} == {p.name for p in tmp_path.iterdir()}
    for src, dst in renames:
        i = events.index((src, dst))
        assert src in events[:i] and str(tmp_path) in events[:i]  # the file, and its folder, first
        assert str(tmp_path) in events[i + 1 :]  # the folder again: the rename is on disk
