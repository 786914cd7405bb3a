"""The DeepSeek-V3.2 network (MLA + DSA + DeepSeekMoE) and its checkpoints. No training logic."""

from dsv32.model.cache import KVCache
from dsv32.model.checkpoint import dequantize_fp8_blocks, quantize_fp8_blocks
from dsv32.model.config import ConfigError, ModelConfig
from dsv32.model.params import count_parameters, describe_parameters
from dsv32.model.shards import CheckpointError
from dsv32.model.transformer import DeepseekV32, ModelOutput

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DeepseekV32",
    "KVCache",
    "ModelConfig",
    "ModelOutput",
    "count_parameters",
    "dequantize_fp8_blocks",
    "describe_parameters",
    "quantize_fp8_blocks",
]
