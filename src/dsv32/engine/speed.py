"""Prefill and decode throughput of a model, and the tiny end-to-end demo built on it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dsv32.engine.generate import generate, pad_prompts


@dataclass
class Throughput:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prefill_s: float
    decode_s_per_token: float


@torch.no_grad()
def measure_throughput(
    model, prompt_len: int, new_tokens: int, batch_size: int = 1, seed: int = 0
) -> Throughput:
    """Time one prefill of ``prompt_len`` tokens into a fresh cache, then ``new_tokens`` greedy decode
    steps (each reads the cache through the indexer's selection)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len), generator=g)
    cache = model.new_cache(batch_size, prompt_len + new_tokens)
    t0 = time.perf_counter()
    out = model(ids, cache=cache, logits_to_keep=1)
    prefill = time.perf_counter() - t0
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        tok = model(tok, cache=cache).logits[:, -1].argmax(-1, keepdim=True)
    decode = (time.perf_counter() - t0) / max(new_tokens, 1)
    return Throughput(batch_size * prompt_len / prefill, batch_size / decode, prefill, decode)


def tiny_config(index_topk: int = 64):
    """A small random V3.2 (MLA + DSA + MoE) that runs in seconds on a laptop CPU."""
    from dsv32.model import ModelConfig

    return ModelConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
        first_k_dense_replace=1, num_attention_heads=8, n_routed_experts=16, n_group=4, topk_group=2,
        num_experts_per_tok=4, n_shared_experts=1, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, index_n_heads=4, index_head_dim=32, index_topk=index_topk,
        max_position_embeddings=16384, rope_scaling=None,
    )  # fmt: skip


def run_tiny_demo(
    out_dir: str | Path = "runs/tiny-model", prompt_len: int = 1024, new_tokens: int = 32
) -> dict:
    """Build a tiny random V3.2, save it in HF format, reload it, generate, and time prefill/decode
    with the sparse (gather) path against the masked-dense reference. Returns the numbers printed."""
    from dsv32.model import DeepseekV32, describe_parameters

    torch.manual_seed(0)
    config = tiny_config()
    print(describe_parameters(config))
    model = DeepseekV32(config).eval()
    model.save_pretrained(out_dir)
    model = DeepseekV32.from_pretrained(out_dir, dtype=torch.float32)
    print(f"saved and reloaded {out_dir} (config.json + model.safetensors, HF weight names)")
    prompt = torch.randint(2, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    out = generate(model, prompt, max_new_tokens=16, temperature=0.0)
    print(f"greedy continuation of a random 24-token prompt: {out.tokens[0].tolist()}")
    results = {}
    for impl in ("gather", "masked"):
        model.set_dsa_mode("sparse", impl)
        measure_throughput(model, 64, 2)  # warm-up
        results[impl] = measure_throughput(model, prompt_len, new_tokens)
    g, m = results["gather"], results["masked"]
    print(
        f"prompt {prompt_len} tokens, index_topk {config.index_topk}:\n"
        f"  sparse (gather):  prefill {g.prefill_tokens_per_s:8.0f} tok/s   decode {g.decode_tokens_per_s:6.1f} tok/s\n"
        f"  masked reference: prefill {m.prefill_tokens_per_s:8.0f} tok/s   decode {m.decode_tokens_per_s:6.1f} tok/s"
    )
    return {"tokens": out.tokens[0].tolist(), **{k: vars(v) for k, v in results.items()}}


@dataclass
class GenerateSpeed:
    """Generated tokens (EOS included, padding not) and wall time of one or more ``generate`` calls."""

    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@torch.no_grad()
def compare_generate_speed(
    model,
    prompts: list[list[int]],
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 0.95,
    top_k: int = 0,
    stop_at_eos: bool = True,
    repeats: int = 2,
    seed: int = 0,
) -> dict[str, GenerateSpeed]:
    """Sampling throughput of :func:`generate` against transformers' own ``model.generate`` on the same
    left-padded prompts of a Hugging Face causal LM, in the same process, runs alternated (a shared
    machine's speed drifts). ``stop_at_eos=False`` generates ``max_new_tokens`` for every row in both.
    Returns ``{"dsv32": ..., "transformers": ...}``."""
    import copy

    from dsv32.engine.backends import HFBackend, eos_ids

    backend = HFBackend(model)
    eos = eos_ids(backend.eos_token_id, backend.device) if stop_at_eos else eos_ids([], backend.device)
    pad = backend.pad_token_id if backend.pad_token_id is not None else int(eos[0]) if len(eos) else 0
    ids, mask = pad_prompts(prompts, pad, backend.device)
    hf_config = copy.deepcopy(model.generation_config)
    hf_config.update(
        eos_token_id=eos.tolist() or None, pad_token_id=pad, max_new_tokens=max_new_tokens, do_sample=True,
        temperature=temperature, top_p=top_p, top_k=top_k,
    )  # fmt: skip
    speeds = {"dsv32": GenerateSpeed(), "transformers": GenerateSpeed()}
    for r in range(repeats):
        t0 = time.perf_counter()
        out = generate(
            model, ids, max_new_tokens, temperature, top_p, top_k, attention_mask=mask,
            eos_token_id=eos.tolist(), pad_token_id=pad, generator=torch.Generator().manual_seed(seed + r),
        )  # fmt: skip
        speeds["dsv32"].seconds += time.perf_counter() - t0
        speeds["dsv32"].tokens += int(out.lengths.sum())
        torch.manual_seed(seed + r)
        t0 = time.perf_counter()
        new = model.generate(ids, attention_mask=mask, generation_config=hf_config)[:, ids.shape[1] :]
        speeds["transformers"].seconds += time.perf_counter() - t0
        stopped = torch.isin(new, eos).long()
        # a row's tokens run up to its first EOS, included (or to the end)
        speeds["transformers"].tokens += int((stopped.cumsum(1) - stopped == 0).sum())
    return speeds
