"""DeepSeek Sparse Attention (paper §2.1) as a reusable component.

- :class:`LightningIndexer`, :func:`index_scores` — the lightning indexer (Eq. 1);
- :func:`select_topk`, :func:`indexer_topk` — fine-grained token selection (Eq. 2);
- :func:`sparse_attention`, :func:`sparse_mla_attention` — attention over the selection only, for
  MHA/GQA layouts and for MLA's MQA mode, each with a masked-dense ``*_reference``;
- :func:`prefer_dense`, :data:`DENSE_CROSSOVER_RATIO` — the measured length below which masked-dense
  prefill beats the sparse path (``benchmarks/attention.py --crossover``);
- :func:`apply_rotary` — RoPE in the interleaved (MLA) and half-split (indexer) layouts.
"""

from dsv32.dsa.attention import (
    DENSE_CROSSOVER_RATIO,
    dense_attention,
    dense_mla_attention,
    masked_softmax,
    prefer_dense,
    selection_mask,
    sparse_attention,
    sparse_attention_reference,
    sparse_mla_attention,
    sparse_mla_attention_reference,
)
from dsv32.dsa.indexer import (
    IndexerQueries,
    LightningIndexer,
    index_scores,
    indexer_topk,
    select_topk,
    visible_mask,
)
from dsv32.dsa.rope import apply_rotary

__all__ = [
    "DENSE_CROSSOVER_RATIO",
    "IndexerQueries",
    "LightningIndexer",
    "apply_rotary",
    "dense_attention",
    "dense_mla_attention",
    "index_scores",
    "indexer_topk",
    "masked_softmax",
    "prefer_dense",
    "select_topk",
    "selection_mask",
    "sparse_attention",
    "sparse_attention_reference",
    "sparse_mla_attention",
    "sparse_mla_attention_reference",
    "visible_mask",
]
