"""dsv32 — an open, runnable implementation of the DeepSeek-V3.2 system.

Subpackages (dependencies point downward only, see ARCHITECTURE.md):

- ``dsv32.model``  the V3.2 network (MLA + DSA + DeepSeekMoE), checkpoints in Hugging Face format.
- ``dsv32.dsa``    DeepSeek Sparse Attention as a reusable component (indexer, top-k, sparse attention,
                   indexer KL losses, attaching DSA to Hugging Face dense models).
- ``dsv32.chat``   the V3.2 conversation protocol (pure Python).
- ``dsv32.engine`` local inference: prefill/decode with a sparse KV cache, sampling.
- ``dsv32.train``  DSA warm-up and sparse training.
"""

__version__ = "0.1.0"
