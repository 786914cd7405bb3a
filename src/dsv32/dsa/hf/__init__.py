"""DeepSeek Sparse Attention on Hugging Face dense models (Llama / Mistral / Qwen2 / Qwen3 families).

:func:`attach_dsa` gives every chosen attention layer a lightning indexer (``self_attn.indexer``, the
V3.2 parameter names) and replaces the layer's ``forward`` by one that supports three modes:

- ``"off"`` — the original forward, untouched (the dense model);
- ``"dense"`` — dense attention through the model's own attention function (outputs identical to
  ``"off"``) while the indexer runs beside it: the warm-up stage (paper §2.1.1, Eq. 3);
- ``"sparse"`` — the indexer's top-k selection drives attention (Eq. 2) through
  :func:`~dsv32.dsa.sparse_attention` (GQA layout); a query that sees at most ``index_topk`` keys
  selects all of them, so such forwards take the dense path and are identical to ``"off"``.

The four families share one structure (``q_proj``/``k_proj``/``v_proj``/``o_proj``, RoPE applied by
the modeling module's ``apply_rotary_pos_emb`` from ``position_embeddings``; Qwen3 adds ``q_norm`` /
``k_norm``), so one replacement forward serves them all, calling the modeling module's own functions.
Sliding windows (Mistral, Qwen2/3 ``use_sliding_window``) are honoured in ``"dense"`` mode; ``"sparse"``
mode attends over the selection among *all* earlier keys.

The indexer (Eq. 1): ``q_I`` is a projection of the layer's (detached) input hidden state — these
models have no q LoRA — and ``k_I = LayerNorm(wk(h))``; the first ``index_rope_head_dim`` dims of both
get half-split RoPE with the model's own rotary angles (every m-th frequency when the indexer rotates
fewer dims than a head). Indexer parameters are kept in fp32 whatever the model dtype.

Training hooks: with ``handle.collect_loss`` each DSA layer stores its indexer KL loss (Eq. 3 in
``"dense"``, Eq. 4 over the selection in ``"sparse"``) in ``handle.losses``; ``handle.observer`` (a
callable) receives a :class:`LayerView` of every DSA layer in a cache-free forward — what the trainer
caches for the warm-up and the evaluator uses for attention recall.

Generation with a KV cache works in all modes: the indexer keys of past tokens are kept on the cache
object (greedy/sampling ``generate``; beam search, which reorders caches, is not supported), appended
in place by a :class:`~.growing.GrowingTensor` when autograd is off (concatenated when it is on);
:func:`cut_index_keys` cuts them back with the cache.

Modules: :mod:`~.config` (settings), :mod:`~.layer` (the layer's indexer and view), :mod:`~.handle`
(a converted model's state), :mod:`~.forward` (the replacement forward), :mod:`~.attach`,
:mod:`~.io` (save/load), :mod:`~.growing` (the append-in-place buffer of the cached keys).
"""

from dsv32.dsa.hf.attach import attach_dsa, detach_dsa, random_indexers
from dsv32.dsa.hf.config import CONFIG_FILE, MODES, SUPPORTED_MODEL_TYPES, WEIGHTS_FILE, DSAConfig, DSAError
from dsv32.dsa.hf.forward import INDEX_KEYS_ATTR, cut_index_keys
from dsv32.dsa.hf.growing import GrowingTensor
from dsv32.dsa.hf.handle import DSAHandle, get_dsa, has_dsa, sparse_dsa
from dsv32.dsa.hf.io import indexer_state_dict, load_dsa, read_dsa_config, save_dsa, without_indexers
from dsv32.dsa.hf.layer import HFIndexer, LayerView

__all__ = [
    "CONFIG_FILE",
    "INDEX_KEYS_ATTR",
    "MODES",
    "SUPPORTED_MODEL_TYPES",
    "WEIGHTS_FILE",
    "DSAConfig",
    "DSAError",
    "DSAHandle",
    "GrowingTensor",
    "HFIndexer",
    "LayerView",
    "attach_dsa",
    "cut_index_keys",
    "detach_dsa",
    "get_dsa",
    "has_dsa",
    "indexer_state_dict",
    "load_dsa",
    "random_indexers",
    "read_dsa_config",
    "save_dsa",
    "sparse_dsa",
    "without_indexers",
]
