"""Checkpoints in Hugging Face format: ``config.json`` + safetensors under the weight names that
transformers' ``DeepseekV32ForCausalLM.save_pretrained`` writes (= the hub checkpoint's names).

- Sharded checkpoints (``model.safetensors.index.json``) load shard by shard.
- FP8 (e4m3) weights with ``weight_scale_inv`` blocks (the hub's format) are dequantized:
  ``w[i, j] = q[i, j] · scale_inv[i // bn, j // bm]``, the block ``[bn, bm]`` being the config's
  ``quantization_config.weight_block_size`` (128×128 without one); a scale grid of another size is
  refused.
- With ``tie_word_embeddings`` the LM head is the embedding matrix: it is not saved, and a stored
  ``lm_head.weight`` is ignored on load (transformers ties the same way).
- Multi-token-prediction layers (index ≥ ``num_hidden_layers``) are skipped with a log line.
- ``e_score_correction_bias`` and the indexer's ``weights_proj`` stay fp32 whatever ``dtype`` is,
  as in the released model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from dsv32.model.config import ConfigError, ModelConfig
from dsv32.model.shards import (
    INDEX_FILE,
    CheckpointError,
    previous_shards,
    shard_files,
    temporary_path,
)
from dsv32.runlog import durable_replace

log = logging.getLogger(__name__)

FP8_BLOCK = 128
_FP32_KEYS = ("e_score_correction_bias", "indexer.weights_proj.weight")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")
# Checkpoints store experts one by one; the model stacks them (see RoutedExperts).
_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_STACKED_RE = re.compile(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$")


def dequantize_fp8_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: int | tuple[int, int] = FP8_BLOCK
) -> torch.Tensor:
    """``weight`` ``[N, M]`` (float8_e4m3fn) and ``scale_inv`` ``[ceil(N/bn), ceil(M/bm)]`` → fp32,
    for blocks of ``block = (bn, bm)`` (an int: square blocks).

    Each block is scaled in place through a broadcast view ``[nb, bn, mb, bm] · [nb, 1, mb, 1]``, so
    no full-size scale matrix is built; the blocks cut short at the right and bottom edges are scaled
    as their own views. A ``scale_inv`` of another shape is a ValueError."""
    bn, bm = (block, block) if isinstance(block, int) else block
    N, M = weight.shape
    nb, mb = -(-N // bn), -(-M // bm)
    if tuple(scale_inv.shape) != (nb, mb):
        raise ValueError(
            f"scale_inv of a [{N}, {M}] weight in {bn}x{bm} blocks must be [{nb}, {mb}], "
            f"got {list(scale_inv.shape)}"
        )
    out = weight.to(torch.float32, copy=True)
    scale = scale_inv.float()
    full_n, full_m = N // bn * bn, M // bm * bm
    for rows, block_rows in ((slice(0, full_n), slice(0, N // bn)), (slice(full_n, N), slice(N // bn, nb))):
        for cols, block_cols in (
            (slice(0, full_m), slice(0, M // bm)),
            (slice(full_m, M), slice(M // bm, mb)),
        ):
            part, s = out[rows, cols], scale[block_rows, block_cols]
            if part.numel():
                part.unflatten(1, (s.shape[1], -1)).unflatten(0, (s.shape[0], -1)).mul_(s[:, None, :, None])
    return out


def quantize_fp8_blocks(
    weight: torch.Tensor, block: int | tuple[int, int] = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`dequantize_fp8_blocks`: per block (128×128 by default), scale so that the
    block's max magnitude maps to e4m3's max (448). Returns ``(weight_fp8, scale_inv)``."""
    bn, bm = (block, block) if isinstance(block, int) else block
    N, M = weight.shape
    nb, mb = -(-N // bn), -(-M // bm)
    padded = weight.float().new_zeros(nb * bn, mb * bm)
    padded[:N, :M] = weight.float()
    blocks = padded.view(nb, bn, mb, bm)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12)
    scale_inv = amax / torch.finfo(torch.float8_e4m3fn).max
    q = (blocks / scale_inv[:, None, :, None]).view(nb * bn, mb * bm)[:N, :M]
    return q.to(torch.float8_e4m3fn), scale_inv


def fp8_block_shape(path: Path) -> tuple[int, int]:
    """The FP8 block shape of the checkpoint at ``path``: its config.json's
    ``quantization_config.weight_block_size``, else 128×128."""
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    quant = raw.get("quantization_config")
    size = quant.get("weight_block_size") if isinstance(quant, dict) else None
    if size is None:
        return FP8_BLOCK, FP8_BLOCK
    if not (
        isinstance(size, list)
        and len(size) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in size)
    ):
        raise ConfigError(
            f"quantization_config.weight_block_size={size!r} in {path / 'config.json'}: must be two "
            "positive ints, e.g. [128, 128]"
        )
    return size[0], size[1]


@contextlib.contextmanager
def _open_shard(file: Path):
    """``safe_open`` of one shard; a file that is not safetensors is a :class:`CheckpointError`. The
    mapping is closed on exit, so no tensor the model keeps may be a view of it (they are copied)."""
    try:
        handle = safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file} is not a safetensors file ({err})") from None
    with handle as f:
        yield f


def iter_checkpoint_tensors(
    path: str | Path, config: ModelConfig, dtype: torch.dtype, block: tuple[int, int] | None = None
):
    """Yield ``(name, tensor)`` for the model's weights: FP8 dequantized (in ``block``-shaped
    blocks; default: :func:`fp8_block_shape`), MTP layers skipped, cast to ``dtype`` (fp32 for the
    keys the released model keeps in fp32)."""
    path = Path(path)
    block = block or fp8_block_shape(path)
    skipped_mtp = 0
    for file in shard_files(path):
        with _open_shard(file) as f:
            names = set(f.keys())
            for name in sorted(names):
                if name.endswith("_scale_inv"):
                    continue
                m = _LAYER_RE.match(name)
                if m and int(m.group(1)) >= config.num_hidden_layers:
                    skipped_mtp += 1
                    continue
                tensor = f.get_tensor(name)  # a view of the file's mapping (safetensors)
                if tensor.dtype == torch.float8_e4m3fn:
                    scale_name = f"{name}_scale_inv"
                    if scale_name not in names:
                        raise CheckpointError(
                            f"{file.name}: FP8 tensor {name} has no {scale_name} in the same shard"
                        )
                    if tensor.dim() != 2:
                        raise CheckpointError(f"{file.name}: FP8 tensor {name} is not a matrix")
                    try:
                        tensor = dequantize_fp8_blocks(tensor, f.get_tensor(scale_name), block)
                    except ValueError as err:
                        raise CheckpointError(f"{file.name}: {scale_name}: {err}") from None
                elif not tensor.is_floating_point() or tensor.element_size() == 1:
                    raise CheckpointError(
                        f"{file.name}: {name} is {str(tensor.dtype).removeprefix('torch.')}; weights are "
                        "read as floats, or as float8_e4m3fn with block scales (weight_scale_inv)"
                    )
                target = torch.float32 if name.endswith(_FP32_KEYS) else dtype
                converted = tensor.to(target)
                if converted.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
                    converted = converted.clone()  # memory of its own, not a view of the mapped file
                yield name, converted
    if skipped_mtp:
        log.info(
            "skipped %d multi-token-prediction tensors (layers >= %d)", skipped_mtp, config.num_hidden_layers
        )


def load_pretrained(cls, path: str | Path, dtype: torch.dtype, device: str | torch.device) -> nn.Module:
    config = ModelConfig.from_pretrained(path)
    with torch.device("meta"):
        model = cls(config)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        del shapes["lm_head.weight"]  # the embedding; a stored head is ignored
    state: dict[str, torch.Tensor] = {}
    experts_seen: dict[str, set[int]] = {}
    unexpected: list[str] = []
    for name, tensor in iter_checkpoint_tensors(path, config, dtype):
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        m = _EXPERT_RE.match(name)
        if m and f"{m[1]}.{m[3]}" in shapes:
            key, e = f"{m[1]}.{m[3]}", int(m[2])
            num_experts, *expert_shape = shapes[key]
            if e >= num_experts:
                raise CheckpointError(
                    f"{name}: expert {e} in the checkpoint {path}; its config has n_routed_experts="
                    f"{num_experts} (experts 0..{num_experts - 1})"
                )
            if list(tensor.shape) != expert_shape:
                raise CheckpointError(
                    f"{name} has shape {list(tensor.shape)} in the checkpoint {path}; "
                    f"its config needs {expert_shape}"
                )
            if e in experts_seen.setdefault(key, set()):
                raise CheckpointError(f"{name} is stored twice in the checkpoint {path}")
            if key not in state:
                state[key] = torch.empty(shapes[key], dtype=dtype, device=device)
            state[key][e] = tensor
            experts_seen[key].add(e)
        elif name not in shapes:
            unexpected.append(name)  # reported with the missing ones, below
        elif name in state:
            raise CheckpointError(f"{name} is stored twice in the checkpoint {path}")
        elif tensor.shape != shapes[name]:
            raise CheckpointError(
                f"{name} has shape {list(tensor.shape)} in the checkpoint {path}; "
                f"its config needs {list(shapes[name])}"
            )
        else:  # a tensor read from the file is the model's own memory: no view of a mapped file
            state[name] = tensor.to(device)
    missing = sorted(shapes.keys() - state.keys())
    missing += [
        f"{key} (experts {sorted(set(range(shapes[key][0])) - seen)[:4]}…)"
        for key, seen in experts_seen.items()
        if len(seen) != shapes[key][0]
    ]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its config: missing {missing[:8]}"
            f"{'…' if len(missing) > 8 else ''}, unexpected {sorted(unexpected)[:8]}"
        )
    # Every expected tensor is in ``state`` (checked above) but a tied head, which shares the embedding.
    model.load_state_dict(state, assign=True, strict=False)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def checkpoint_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under checkpoint names (stacked experts split into ``experts.{e}.*``)."""
    state = {}
    for name, tensor in model.state_dict().items():
        m = _STACKED_RE.match(name)
        if m:
            for e in range(tensor.shape[0]):
                state[f"{m[1]}.{e}.{m[2]}.weight"] = tensor[e].detach().contiguous()
        else:
            state[name] = tensor.detach().contiguous()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_pretrained(model: nn.Module, path: str | Path, max_shard_size: int = 4 << 30) -> None:
    """Write ``config.json`` and the weights (one file, or shards and an index above
    ``max_shard_size`` bytes) into ``path``. Every file is written under a temporary name and renamed
    into place once all are written, each synced to disk before and after its rename, so a failed save
    or a power loss leaves the previous checkpoint whole; then the previous checkpoint's shards the new
    one does not use are removed (other files stay)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = checkpoint_state_dict(model)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = state[name]
        size += nbytes
    if len(shards) == 1:
        files = {"model.safetensors": shards[0]}
    else:
        files = {f"model-{i:05d}-of-{len(shards):05d}.safetensors": s for i, s in enumerate(shards, 1)}
    stale = previous_shards(path) - files.keys()
    staged: dict[str, Path] = {}  # final name -> temporary file
    try:
        for name, shard in files.items():
            staged[name] = temporary_path(path, name)
            save_file(shard, str(staged[name]), metadata={"format": "pt"})
        if len(files) > 1:
            weight_map = {tensor: name for name, shard in files.items() for tensor in shard}
            total = sum(t.numel() * t.element_size() for t in state.values())
            staged[INDEX_FILE] = temporary_path(path, INDEX_FILE)
            _write_json(staged[INDEX_FILE], {"metadata": {"total_size": total}, "weight_map": weight_map})
        staged["config.json"] = temporary_path(path, "config.json")
        _write_json(staged["config.json"], model.config.to_hf_dict())
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    # Shards first, then the index that names them (or, for one file, the old index goes), then the config.
    for name, tmp in staged.items():
        durable_replace(tmp, path / name)  # synced before and after: a power loss keeps a whole file
        if name == "model.safetensors":
            (path / INDEX_FILE).unlink(missing_ok=True)
    for name in stale:
        (path / name).unlink(missing_ok=True)


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
