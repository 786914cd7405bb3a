"""SFT on conversations: the loss mask is exactly the assistant tokens of multi-turn tool
conversations, packing computes what unpacked rows compute, resume is bit-exact, the CLI writes a
reloadable model; one fast SmolLM2 smoke test."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from dsv32.chat import EOS, chat_template, messages_for_template, tokenize_conversation
from dsv32.cli import main
from dsv32.engine.models import load_model
from dsv32.runlog import read_metrics
from dsv32.train.sft import load_sft_config, loss_sum, train_sft
from dsv32.train.sft.data import (
    IGNORE,
    SFTDataError,
    collate,
    conversation_messages,
    encode_example,
    encode_file,
    make_rows,
    pack,
)
from dsv32.train.sft.model import prepare_sft_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


def tool_conversation(a: int, b: int, tools: bool = True) -> dict:
    """Two tool rounds, then an answer; a second user turn with its own tool round and answer
    (``tools`` False: no tool schemas in the system message, a short conversation for training)."""
    call = lambda i, code: {  # noqa: E731
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})},
    }
    row = {
        "messages": [
            {"role": "system", "content": "You can run Python."},
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "reasoning_content": "Compute it.", "tool_calls": [call(0, f"print({a}*{b})")]},
            {"role": "tool", "tool_call_id": "c0", "content": f"TOOL-OUT-{a * b}"},
            {"role": "assistant", "content": "", "reasoning_content": "Check it.", "tool_calls": [call(1, f"print({b}*{a})")]},
            {"role": "tool", "tool_call_id": "c1", "content": f"TOOL-OUT-{b * a}"},
            {"role": "assistant", "content": f"\\boxed{{{a * b}}}", "reasoning_content": "Both agree."},
            {"role": "user", "content": "And plus one?"},
            {"role": "assistant", "content": "", "reasoning_content": "Add one.", "tool_calls": [call(2, f"print({a * b}+1)")]},
            {"role": "tool", "tool_call_id": "c2", "content": f"TOOL-OUT-{a * b + 1}"},
            {"role": "assistant", "content": f"\\boxed{{{a * b + 1}}}", "reasoning_content": "Done."},
        ],
    }  # fmt: skip
    return {"tools": TOOLS, **row} if tools else row


def short_conversation(a: int, b: int) -> dict:
    """One tool round and an answer, no schemas: a short conversation for the training tests."""
    return {
        "messages": [
            {"role": "user", "content": f"{a}*{b}?"},
            {"role": "assistant", "content": "", "reasoning_content": "py", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "python", "arguments": {"code": f"{a}*{b}"}}}]},
            {"role": "tool", "tool_call_id": "c", "content": str(a * b)},
            {"role": "assistant", "content": f"\\boxed{{{a * b}}}", "reasoning_content": "ok"},
        ]
    }  # fmt: skip


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------------------- loss masks
@pytest.mark.parametrize("train_on", ["all", "last_round"])
def test_targets_are_exactly_the_assistant_tokens(tokenizer, train_on):
    row = tool_conversation(123, 456)
    ex = encode_example(tokenizer, row, "thinking", train_on)
    ids, mask = tokenize_conversation(tokenizer, conversation_messages(row), "thinking", train_on=train_on)
    assert ex.ids == ids
    # target at t is token t + 1 exactly where token t + 1 is an assistant token
    assert [t != IGNORE for t in ex.targets[:-1]] == [bool(m) for m in mask[1:]]
    assert all(t == ids[i + 1] for i, t in enumerate(ex.targets) if t != IGNORE)
    trained = tokenizer.decode([ids[i + 1] for i, t in enumerate(ex.targets) if t != IGNORE])
    assert "TOOL-OUT" not in trained and "What is" not in trained and "You can run" not in trained
    assert "Done." in trained and "print(56088+1)" in trained and EOS in trained
    # earlier rounds: trained (without their dropped reasoning, §3.2.1) only with train_on="all"
    assert "Compute it." not in trained
    assert ("print(123*456)" in trained) == (train_on == "all")
    # every assistant turn ends with the end token, and each one is trained
    assert trained.count(EOS) == (5 if train_on == "all" else 2)


def test_mask_equals_the_chat_templates_generation_mask(tokenizer):
    """The V3.2 Jinja template marks assistant turns with {% generation %}: the same tokens."""
    row = tool_conversation(77, 88)
    tokenizer.chat_template = chat_template()
    out = tokenizer.apply_chat_template(
        messages_for_template(row["messages"]),
        tools=row["tools"],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = tokenize_conversation(tokenizer, conversation_messages(row), "thinking")
    assert out["input_ids"] == ids
    assert out["assistant_masks"] == mask
    assert sum(mask) > 0


def test_overlong_conversations_are_dropped_cut_or_an_error(tokenizer, tmp_path):
    path = _write(tmp_path / "c.jsonl", [tool_conversation(1, 2), tool_conversation(10**30, 3)])
    n = [
        len(encode_example(tokenizer, r).ids) for r in (tool_conversation(1, 2), tool_conversation(10**30, 3))
    ]
    limit = (n[0] + n[1]) // 2
    examples, counts = encode_file(tokenizer, path, seq_len=limit)
    assert len(examples) == 1 and counts["dropped"] == 1
    examples, counts = encode_file(tokenizer, path, seq_len=limit, overlong="truncate")
    assert counts["truncated"] == 1 and max(len(e.ids) for e in examples) == limit
    assert examples[1].targets[-1] == IGNORE
    with pytest.raises(SFTDataError, match=r"raise data\.seq_len"):
        encode_file(tokenizer, path, seq_len=limit, overlong="error")


def test_bad_rows_name_the_line(tmp_path, tokenizer):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(tool_conversation(1, 2)) + "\n" + json.dumps({"msgs": []}) + "\n")
    with pytest.raises(SFTDataError, match=r"bad\.jsonl:2"):
        encode_file(tokenizer, path, seq_len=4096)


# --------------------------------------------------------------------------------------- packing
def test_best_fit_decreasing_packs_whole_examples():
    bins = pack([5, 9, 3, 7, 1, 4], 10)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum([5, 9, 3, 7, 1, 4][i] for i in b) <= 10 for b in bins)
    assert len(bins) == 3


def test_a_packed_row_computes_what_its_conversations_compute_alone():
    sm = prepare_sft_model("tiny-llama", device="cpu")
    rows_data = [tool_conversation(a, b, False) for a, b in ((1, 2), (345, 6789), (12, 12))]
    examples = [encode_example(sm.tokenizer, r) for r in rows_data]
    seq_len = sum(len(e.ids) for e in examples)
    with torch.no_grad():
        packed, n_packed = loss_sum(
            sm, collate(examples, make_rows(examples, seq_len, True), sm.pad_id), True
        )
        alone = [loss_sum(sm, collate(examples, [[i]], sm.pad_id), False) for i in range(3)]
        padded, _ = loss_sum(sm, collate(examples, make_rows(examples, seq_len, False), sm.pad_id), False)
    assert len(make_rows(examples, seq_len, True)) == 1
    assert n_packed == sum(n for _, n in alone)
    torch.testing.assert_close(packed, sum(s for s, _ in alone), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(padded, packed, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------------------- training
def _cfg(tmp_path, model="tiny-llama", **over):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = _write(tmp_path / "train.jsonl", [short_conversation(a, a + 7) for a in range(3, 11)])
    held = _write(tmp_path / "held.jsonl", [short_conversation(a, 2 * a) for a in (91, 92)])
    sets = {
        "model.name": model,
        "model.device": "cpu",
        "data.path": str(data),
        "data.eval_path": str(held),
        "data.seq_len": 512,
        "train.batch_size": 2,
        "train.grad_accum": 2,
        "train.lr": 3e-3,
        "train.steps": 4,
        "train.eval_every": 2,
        "out_dir": str(tmp_path / "run"),
    } | over
    return load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-native"])
def test_resume_is_bit_exact(tmp_path, model):
    full = train_sft(_cfg(tmp_path / "a", model), progress=False)
    cfg = _cfg(tmp_path / "b", model)
    part = train_sft(cfg, progress=False, stop_after=2)
    assert part.model_dir is None and part.steps == 2
    rest = train_sft(cfg, progress=False)
    assert rest.steps == 4
    a, b = read_metrics(full.out_dir / "metrics.jsonl"), read_metrics(rest.out_dir / "metrics.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r.get("eval_loss") for r in a] == [r.get("eval_loss") for r in b]
    wa = load_model(str(full.model_dir), device="cpu").model.state_dict()
    wb = load_model(str(rest.model_dir), device="cpu").model.state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a[-1]["loss"] < a[0]["loss"]
    assert (full.out_dir / "sft.png").is_file()


def test_packed_training_and_the_saved_model_speak_v32(tmp_path):
    result = train_sft(_cfg(tmp_path, **{"data.packing": True, "train.steps": 3}), progress=False)
    assert result.data["rows"] < result.data["conversations"]
    loaded = load_model(str(result.model_dir), device="cpu")
    tok = loaded.tokenizer
    from dsv32.chat import missing_special_tokens

    assert not missing_special_tokens(tok)
    assert loaded.model.get_input_embeddings().weight.shape[0] == len(tok) == 264
    assert tok.convert_tokens_to_ids(EOS) in loaded.model.generation_config.eos_token_id
    assert "generation" in tok.chat_template


def test_packing_on_a_native_model_is_a_typed_error(tmp_path):
    from dsv32.train.sft.model import SFTModelError

    with pytest.raises(SFTModelError, match="packing needs a Hugging Face model"):
        train_sft(_cfg(tmp_path, "tiny-native", **{"data.packing": True}), progress=False)
    assert not (tmp_path / "run").exists()


def test_cli_trains_and_writes_metrics(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    code = main(
        ["sft", "--model", "tiny-llama", "--data", cfg.data.path, "--out", str(tmp_path / "cli"), "--steps", "2",
         "--set", "model.device=cpu", "--set", "train.batch_size=4", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    assert "dsv32 sft: 2 steps" in capsys.readouterr().out
    assert len(read_metrics(tmp_path / "cli" / "metrics.jsonl")) == 2
    assert (tmp_path / "cli" / "model" / "tokenizer.json").is_file()


def test_smollm2_gets_the_v32_tokens_and_one_step_lowers_nothing_to_nan(tmp_path):
    """Real model smoke test: tokens added, embeddings resized, one SFT step on a tool conversation."""
    sm = prepare_sft_model("smollm2", device="cpu")
    assert len(sm.added_tokens) == 7
    assert sm.model.get_input_embeddings().weight.shape[0] == len(sm.tokenizer)
    example = encode_example(sm.tokenizer, tool_conversation(12, 34))
    with torch.no_grad():
        s, n = loss_sum(sm, collate([example], [[0]], sm.pad_id), False)
    assert n == example.loss_tokens and torch.isfinite(s)


def test_frozen_lower_layers_keep_their_weights(tmp_path):
    sm = prepare_sft_model("tiny-llama", device="cpu")
    before = {k: v.clone() for k, v in sm.model.state_dict().items()}
    train_sft(_cfg(tmp_path, **{"train.freeze_layers": 1, "train.steps": 1}), model=sm, progress=False)
    after = sm.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert not any(k.startswith("model.layers.0.") for k in changed)
    assert any(k.startswith("model.layers.1.") for k in changed) and "model.embed_tokens.weight" in changed


def test_new_token_lr_moves_only_the_added_rows(tmp_path):
    from dsv32.train.sft.model import input_embeddings

    sm = prepare_sft_model("tiny-llama", device="cpu")
    assert sm.base_vocab == 257 and len(sm.tokenizer) == 264
    before = input_embeddings(sm.model).detach().clone()
    train_sft(_cfg(tmp_path, **{"train.new_token_lr": 1e-2, "train.steps": 2}), model=sm, progress=False)
    after = input_embeddings(sm.model).detach()
    assert torch.equal(before[:257], after[:257])  # pretrained rows (and the tied head) unchanged
    assert (after[257:] - before[257:]).abs().min() > 1e-3  # every new token's row moved


def test_the_shipped_recipes_load(tmp_path):
    from pathlib import Path

    import dsv32

    configs = Path(dsv32.__file__).parent / "configs"
    data = _write(tmp_path / "c.jsonl", [short_conversation(1, 2)])
    cfg = load_sft_config(configs / "sft-smollm2.toml", [f"data.path={data}"])
    assert cfg.data.packing and cfg.train.new_token_lr == 5e-3
    from dsv32.recipe import read_recipe

    proof = read_recipe(configs / "posttrain-smollm2.toml")
    assert (
        proof["sft"]["train"]["freeze_layers"] == 22 and proof["rl"]["envs"][0]["name"] == "code-interpreter"
    )


def test_new_token_lr_moves_the_added_rows_of_a_padded_embedding(tmp_path, monkeypatch):
    """Embeddings with more rows than the tokenizer has tokens (padded to a multiple): the added
    tokens take ids inside the existing rows, and those rows are the ones that learn."""
    import dsv32.train.sft.model as sft_model

    def padded(name, **kwargs):
        loaded = load_model(name, **kwargs)
        loaded.model.resize_token_embeddings(320, mean_resizing=False)
        return loaded

    monkeypatch.setattr(sft_model, "load_model", padded)
    sm = prepare_sft_model("tiny-llama", device="cpu")
    assert sm.base_vocab == 257 and len(sm.tokenizer) == 264
    before = sft_model.input_embeddings(sm.model).detach().clone()
    assert before.shape[0] == 320
    train_sft(_cfg(tmp_path, **{"train.new_token_lr": 1e-2, "train.steps": 2}), model=sm, progress=False)
    after = sft_model.input_embeddings(sm.model).detach()
    assert torch.equal(before[:257], after[:257])
    assert (after[257:264] - before[257:264]).abs().min() > 1e-3  # every added token's row moved


def test_new_token_lr_leaves_nothing_on_the_model(tmp_path):
    """After SFT with ``new_token_lr`` the model trains every embedding row again (a later GRPO
    stage on the same model is not held to the new rows)."""
    from dsv32.train.sft.model import input_embeddings

    sm = prepare_sft_model("tiny-llama", device="cpu")
    train_sft(_cfg(tmp_path, **{"train.new_token_lr": 1e-2, "train.steps": 1}), model=sm, progress=False)
    sm.model.zero_grad(set_to_none=True)
    ids = torch.tensor([[5, 6, 7, 258]])
    sm.model(input_ids=ids, labels=ids).loss.backward()
    grad = input_embeddings(sm.model).grad
    assert grad[[5, 6, 7]].abs().sum() > 0  # pretrained rows get their gradient


def test_resuming_with_other_data_or_model_is_refused_before_anything_is_written(tmp_path):
    from dsv32.runlog import CheckpointError

    cfg = _cfg(tmp_path, **{"train.steps": 2, "train.eval_every": 0})
    train_sft(cfg, progress=False)
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    other = _write(tmp_path / "other.jsonl", [short_conversation(a, a + 1) for a in range(3, 11)])
    with pytest.raises(CheckpointError, match=r"belongs to another run \(data.sha256 .*--no-resume"):
        train_sft(_cfg(tmp_path, **{"data.path": str(other), "train.steps": 4}), progress=False)
    with pytest.raises(CheckpointError, match=r'model.name "tiny-llama" → "tiny-native"'):
        train_sft(_cfg(tmp_path, "tiny-native", **{"train.steps": 4}), progress=False)
    _write(tmp_path / "train.jsonl", [short_conversation(a, a + 9) for a in range(3, 11)])  # edited in place
    with pytest.raises(CheckpointError, match=r"\(data.sha256 "):
        train_sft(cfg, progress=False)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_more_steps_extend_a_run_and_no_resume_replaces_it(tmp_path):
    run = tmp_path / "run"
    train_sft(_cfg(tmp_path, **{"train.steps": 2, "train.eval_every": 0}), progress=False)
    longer = train_sft(_cfg(tmp_path, **{"train.steps": 3, "train.eval_every": 0}), progress=False)
    assert longer.steps == 3 and [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    again = _cfg(tmp_path, **{"train.steps": 1, "train.eval_every": 0})
    train_sft(again, progress=False, resume=False)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]
    assert json.loads((run / "data.json").read_text())["steps"] == 1


def test_a_run_keeps_its_two_newest_checkpoints_by_default(tmp_path):
    """Two, so a machine crash while the newest is written still leaves one to resume from."""
    cfg = _cfg(tmp_path, **{"train.save_every": 1})
    assert cfg.train.keep_checkpoints == 2
    result = train_sft(cfg, progress=False)
    names = sorted(p.name for p in (result.out_dir / "checkpoints").iterdir())
    assert names == ["step_000003", "step_000004"]


SFT_LORA = {"lora.enabled": True, "lora.r": 4, "lora.target_modules": ["q_proj", "v_proj"], "train.lr": 1e-2}


def test_lora_sft_checkpoints_the_adapter_resumes_exactly_and_exports_both_ways(tmp_path):
    pytest.importorskip("peft")
    from peft import PeftModel
    from safetensors.torch import load_file

    from dsv32.engine.lora import is_adapter_parameter

    full = train_sft(_cfg(tmp_path / "a", **SFT_LORA), progress=False)
    cfg = _cfg(tmp_path / "b", **SFT_LORA)
    train_sft(cfg, progress=False, stop_after=2)
    (ckpt,) = (tmp_path / "b" / "run" / "checkpoints").glob("step_*")
    saved = load_file(str(ckpt / "weights.safetensors"))
    assert saved and all(is_adapter_parameter(n) and ("q_proj" in n or "v_proj" in n) for n in saved)
    rest = train_sft(cfg, progress=False)
    a, b = read_metrics(full.out_dir / "metrics.jsonl"), read_metrics(rest.out_dir / "metrics.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and a[-1]["loss"] < a[0]["loss"]
    wa = load_model(str(full.model_dir), device="cpu").model
    wb = load_model(str(rest.model_dir), device="cpu").model
    sa, sb = wa.state_dict(), wb.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not any("lora" in k for k in sa)  # model/: merged full weights

    base = load_model("tiny-llama", device="cpu").model
    base.resize_token_embeddings(wa.get_input_embeddings().weight.shape[0])
    with torch.no_grad():  # the base as SFT prepared it: the added V3.2 tokens' rows
        base.get_input_embeddings().weight.copy_(wa.get_input_embeddings().weight)
    adapted = PeftModel.from_pretrained(base, full.out_dir / "adapter")
    x = torch.randint(0, 200, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(adapted(x).logits, wa(x).logits, rtol=1e-4, atol=1e-5)
