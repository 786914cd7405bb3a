"""DeepSeek Sparse Attention (paper §2.1) as a reusable component.

- :class:`LightningIndexer`, :func:`index_scores` — the lightning indexer (Eq. 1);
- :func:`select_topk`, :func:`indexer_topk` — fine-grained token selection (Eq. 2);
  :func:`fp8_indexer_queries`, :func:`fp8_indexer_keys` (+ :func:`hadamard`, :func:`quantize_e4m3`)
  — the released model's FP8 indexer scoring (``indexer_topk(..., fp8="ue8m0")``);
- :func:`sparse_attention`, :func:`sparse_mla_attention` — attention over the selection only, for
  MHA/GQA layouts and for MLA's MQA mode, each with a masked-dense ``*_reference``; in the GQA layout
  blocks of neighbouring queries with overlapping selections run over their union
  (:mod:`dsv32.dsa.union`); :func:`sparse_mla_attention_absorbed` adds MLA's ``W_UK`` / ``W_UV``
  around the MQA-mode path (in query chunks on the CPU kernel's path);
- :func:`prefer_dense`, :data:`DENSE_CROSSOVER_RATIO`, :data:`MLA_KERNEL_CROSSOVER_RATIO`,
  :data:`GQA_KERNEL_CROSSOVER_RATIO` — the measured length below which masked-dense prefill beats the
  sparse path (``benchmarks/attention.py --crossover``, ``benchmarks/attention_gqa.py``);
  :data:`TRAIN_DENSE_CROSSOVER_RATIO`, :data:`MASKED_TRAIN_MAX_PAIRS` — the same for training
  (forward and backward), bounded by the masked path's memory;
- :mod:`dsv32.dsa.kernels` — fused kernels behind the fast paths: C for the CPU (built at first use),
  Triton for CUDA;
- :func:`indexer_kl_loss`, :func:`indexer_kl_loss_chunked` — the indexer's KL objective (Eq. 3/4);
  :func:`attention_recall` — share of the dense attention mass kept by a selection (and the oracle's);
  :func:`oracle_topk` — the best possible selection (head-summed dense attention), for evaluation;
- :func:`attach_dsa` (+ :func:`save_dsa`, :func:`load_dsa`, :func:`get_dsa`) — DSA on Hugging Face
  Llama / Mistral / Qwen2 / Qwen3 models, with ``off`` / ``dense`` (warm-up) / ``sparse`` modes;
- :func:`apply_rotary` — RoPE in the interleaved (MLA) and half-split (indexer) layouts.
"""

from dsv32.dsa.attention import (
    DENSE_CROSSOVER_RATIO,
    GQA_KERNEL_CROSSOVER_RATIO,
    MASKED_TRAIN_MAX_PAIRS,
    MLA_KERNEL_CROSSOVER_RATIO,
    SPARSE_IMPLS,
    TRAIN_DENSE_CROSSOVER_RATIO,
    dense_attention,
    dense_mla_attention,
    gqa_kernel_would_run,
    masked_softmax,
    mla_kernel_would_run,
    nonempty_rows,
    prefer_dense,
    selection_mask,
    sparse_attention,
    sparse_attention_reference,
    sparse_mla_attention,
    sparse_mla_attention_absorbed,
    sparse_mla_attention_reference,
)
from dsv32.dsa.fp8 import fp8_indexer_keys, fp8_indexer_queries, hadamard, quantize_e4m3
from dsv32.dsa.hf import (
    DSAConfig,
    DSAError,
    DSAHandle,
    LayerView,
    attach_dsa,
    detach_dsa,
    get_dsa,
    has_dsa,
    load_dsa,
    save_dsa,
)
from dsv32.dsa.indexer import (
    IndexerQueries,
    LightningIndexer,
    index_scores,
    indexer_topk,
    select_topk,
    visible_mask,
)
from dsv32.dsa.loss import (
    RecallSums,
    attention_recall,
    indexer_kl_loss,
    indexer_kl_loss_chunked,
    oracle_topk,
)
from dsv32.dsa.rope import apply_rotary

__all__ = [
    "DENSE_CROSSOVER_RATIO",
    "GQA_KERNEL_CROSSOVER_RATIO",
    "MASKED_TRAIN_MAX_PAIRS",
    "MLA_KERNEL_CROSSOVER_RATIO",
    "SPARSE_IMPLS",
    "TRAIN_DENSE_CROSSOVER_RATIO",
    "DSAConfig",
    "DSAError",
    "DSAHandle",
    "IndexerQueries",
    "LayerView",
    "LightningIndexer",
    "RecallSums",
    "apply_rotary",
    "attach_dsa",
    "attention_recall",
    "dense_attention",
    "dense_mla_attention",
    "detach_dsa",
    "fp8_indexer_keys",
    "fp8_indexer_queries",
    "get_dsa",
    "gqa_kernel_would_run",
    "hadamard",
    "has_dsa",
    "index_scores",
    "indexer_kl_loss",
    "indexer_kl_loss_chunked",
    "indexer_topk",
    "load_dsa",
    "masked_softmax",
    "mla_kernel_would_run",
    "nonempty_rows",
    "oracle_topk",
    "prefer_dense",
    "quantize_e4m3",
    "save_dsa",
    "select_topk",
    "selection_mask",
    "sparse_attention",
    "sparse_attention_reference",
    "sparse_mla_attention",
    "sparse_mla_attention_absorbed",
    "sparse_mla_attention_reference",
    "visible_mask",
]
