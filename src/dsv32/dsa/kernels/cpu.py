"""Fused C kernels for DSA's CPU hot paths (``cpu_kernels.c``): MLA's MQA-mode sparse attention (and
the GQA layout, each KV head an MQA problem with its own value rows) and the lightning indexer's
scores with their exact top-k; and, for the engine's decode step of dense models, attention of one
query token per row over its whole cache (:func:`decode_gqa_attention_cpu`).

On the CPU the torch path of :func:`dsv32.dsa.sparse_mla_attention` spends more time moving data than
multiplying: it gathers every query's selected latents into a buffer, then runs two batched matmuls
and a softmax over it, a few queries per Python iteration. The C kernel reads each query's selected
rows straight from the cache in L2-sized blocks and keeps the scores, an online softmax and the
value accumulator in cache, so each selected latent crosses memory once. The indexer kernel scores a
block of queries per key tile in registers and selects coarse to fine (see the C source). Inputs may
be fp32 or bf16 (read as they are: bf16 halves the bytes moved); the arithmetic is fp32.

The library is compiled at first use with the system's C compiler (``$CC``, else ``cc``/``gcc``/
``clang``) at ``-O3 -march=native`` into ``$DSV32_CACHE_DIR/kernels`` (see :mod:`dsv32.paths`), keyed by
the source, the compiler and the CPU, and loaded with :mod:`ctypes`. Without a working compiler — or
with ``DSV32_CPU_KERNELS=0`` — :func:`available` is false and the torch path runs instead (the
reference the tests hold the kernels to). Work is split across ``torch.get_num_threads()`` Python
threads; each C call releases the GIL. The dense decode kernel instead runs its (row, KV head)
problems on OpenMP threads where the compiler has ``-fopenmp``: the library then uses the OpenMP
runtime torch has loaded (``libgomp.so.1``), whose threads are still awake from torch's last op;
inside a decode step, between torch's matrix products, a split across Python threads ran no faster
than one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dsv32.paths import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -fopenmp: the decode-attention kernel's threads (its libgomp.so.1 is the one torch has loaded)
_FLAG_SETS = (
    ["-O3", "-march=native", "-fopenmp"],
    ["-O3", "-march=native"],
    ["-O3", "-mcpu=native"],
    ["-O3"],
)
_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# ctypes signatures of the C entry points (see the comments above them in cpu_kernels.c).
_ARGTYPES = (
    [_I64] * 6
    + [_F32]  # n, H, Cl, Cr, V, K, scale
    + [_PTR, _I64, _I64] * 2  # q, qr: pointer and strides (query, head)
    + [_PTR, _I64] * 4  # kv, rope, val, idx: pointer and row stride
    + [_PTR, _I64, _I64, _PTR]  # out and its strides, scratch
)
_INDEXER_ARGTYPES = (
    [_I64] * 4  # n, H, D, K
    + [_PTR, _I64, _I64, _PTR, _I64]  # q and its strides, gates and their stride
    + [_PTR, _I64, _PTR, _I64, _I64]  # keys, key stride, their transposed tiles (or NULL), S, visible0
    + [_PTR, _PTR, _I64, _PTR]  # padding, out, out stride, scratch
)
_TRANSPOSE_ARGTYPES = [_PTR, _I64, _I64, _I64, _I64, _I64, _PTR]  # keys, stride, S, D, tiles t0..t1, out
_DECODE_GQA_ARGTYPES = (
    [_I64] * 7  # threads, B, H_kv, G, D, D_v, S
    + [_F32]  # scale
    + [_PTR, _I64, _I64]  # q and its strides (row, head)
    + [_PTR, _I64, _I64, _I64] * 2  # k, v and their strides (row, KV head, key)
    + [_PTR, _I64]  # mask (or NULL) and its row stride
    + [_PTR, _I64, _I64, _PTR]  # out and its strides (row, head), scratch
)
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the kernels' input types
DTYPES = tuple(_SUFFIX)


def _compilers() -> list[str]:
    names = [os.environ["CC"]] if os.environ.get("CC") else []
    return [c for c in (*names, "cc", "gcc", "clang") if shutil.which(c)]


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU model and its feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(lines))
    except OSError:
        return platform.processor() or platform.machine()


def _build(flag_sets: tuple[list[str], ...] | None = None) -> Path | None:
    """Compile ``cpu_kernels.c`` (once per source × compiler × flags × CPU) with the first of
    ``flag_sets`` (default :data:`_FLAG_SETS`) that works and return the library's path.
    ``$DSV32_CPU_KERNELS_CFLAGS`` adds flags (e.g. ``-fsanitize=address -g`` to debug)."""
    source = SOURCE.read_bytes()
    extra = os.environ.get("DSV32_CPU_KERNELS_CFLAGS", "").split()
    errors = []
    for cc in _compilers():
        for base in _FLAG_SETS if flag_sets is None else flag_sets:
            flags = [*base, *extra]
            key = hashlib.sha256(source + cc.encode() + " ".join(flags).encode() + _cpu_id().encode())
            lib = cache_dir("kernels") / f"dsv32_cpu_{key.hexdigest()[:16]}.so"
            if lib.exists():
                return lib
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
                tmp_lib = Path(tmp) / lib.name
                cmd = [cc, *flags, "-shared", "-fPIC", "-o", str(tmp_lib), str(SOURCE), "-lm"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode == 0:
                    os.replace(tmp_lib, lib)  # atomic: concurrent builders race harmlessly
                    return lib
                errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
    why = "\n".join(errors) if errors else "no C compiler found (set $CC, or install gcc or clang)"
    warnings.warn(f"dsv32: could not build the CPU kernels; using the torch path.\n{why}", stacklevel=3)
    return None


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("DSV32_CPU_KERNELS", "1") == "0":
        return None
    try:
        path = _build()
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:  # an OpenMP runtime that does not load next to torch's: build without it
            path = _build(tuple(f for f in _FLAG_SETS if "-fopenmp" not in f))
            if path is None:
                return None
            lib = ctypes.CDLL(str(path))
    except OSError as err:  # pragma: no cover - a broken toolchain or a read-only cache
        warnings.warn(f"dsv32: could not load the CPU kernels ({err}); using the torch path.", stacklevel=3)
        return None
    for suffix in ("f32", "bf16"):
        getattr(lib, f"dsv32_sparse_mqa_{suffix}").argtypes = _ARGTYPES
        getattr(lib, f"dsv32_sparse_mqa_{suffix}").restype = None
        getattr(lib, f"dsv32_indexer_topk_{suffix}").argtypes = _INDEXER_ARGTYPES
        getattr(lib, f"dsv32_indexer_topk_{suffix}").restype = None
        getattr(lib, f"dsv32_indexer_transpose_{suffix}").argtypes = _TRANSPOSE_ARGTYPES
        getattr(lib, f"dsv32_indexer_transpose_{suffix}").restype = None
        getattr(lib, f"dsv32_decode_gqa_{suffix}").argtypes = _DECODE_GQA_ARGTYPES
        getattr(lib, f"dsv32_decode_gqa_{suffix}").restype = None
    lib.dsv32_decode_gqa_scratch_bytes.argtypes = [_I64] * 4
    lib.dsv32_decode_gqa_scratch_bytes.restype = _I64
    lib.dsv32_decode_gqa_openmp.argtypes = []
    lib.dsv32_decode_gqa_openmp.restype = _I64
    lib.openmp = bool(lib.dsv32_decode_gqa_openmp())  # read once: a property of this build
    lib.dsv32_sparse_mqa_scratch_bytes.argtypes = [_I64] * 5
    lib.dsv32_sparse_mqa_scratch_bytes.restype = _I64
    lib.dsv32_indexer_scratch_bytes.argtypes = [_I64, _I64, _I64]
    lib.dsv32_indexer_scratch_bytes.restype = _I64
    for name in ("dsv32_indexer_key_tile", "dsv32_indexer_query_block"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = _I64
    return lib


def _require_library() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("the CPU kernels are not available (see dsv32.dsa.kernels.cpu)")
    return lib


_enabled = True


def available() -> bool:
    """Whether the compiled kernels can be used in this process (builds them on the first call)."""
    return _enabled and _library() is not None


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Turn the C kernels on or off inside a ``with`` block (process-wide): e.g. ``enabled(False)``
    runs the torch paths, to compare against them."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def mla_supported(
    q: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor | None,
    v_dim: int,
    q_rope: torch.Tensor | None = None,
) -> bool:
    """Inputs :func:`sparse_mla_attention_cpu` takes: CPU tensors all fp32 or all bf16, the keys' last
    dim contiguous, the query, key and value widths multiples of 8."""
    keys = (latent,) if rope is None else (latent, rope)
    tensors = (q, *keys) if q_rope is None else (q, q_rope, *keys)
    widths = (q.shape[-1], latent.shape[-1], v_dim, *(t.shape[-1] for t in (rope, q_rope) if t is not None))
    return (
        q.dtype in _SUFFIX
        and all(t.device.type == "cpu" and t.dtype == q.dtype for t in tensors)
        and all(t.stride(-1) == 1 for t in keys)
        and all(w % 8 == 0 for w in widths)
        and v_dim <= latent.shape[-1]
        and available()
    )


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = 0
_pool_lock = threading.Lock()


def _executor(workers: int) -> ThreadPoolExecutor:
    """A process-wide thread pool with at least ``workers`` threads (a new one in a forked child,
    whose copy of the parent's pool has no threads)."""
    global _pool, _pool_size, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_size < workers or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsv32-cpu")
            _pool_size, _pool_pid = workers, os.getpid()
        return _pool


def sparse_mla_attention_cpu(
    q: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor | None,
    topk_indices: torch.Tensor,
    scale: float,
    v_dim: int,
    *,
    q_rope: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MQA-mode attention over the selected latents with the C kernel.

    Queries: ``q`` ``[B, T, H, C]`` (absorbed: latent part, then rope part), or its latent part with
    ``q_rope`` ``[B, T, H, R]`` beside it. Keys: ``latent`` ``[B, S, Cl]`` (its first ``v_dim`` dims are
    the value) with ``rope`` ``[B, S, R]``, or one ``[B, S, C]`` tensor with ``rope`` None.
    ``topk_indices`` ``[B, T, K]`` (-1 = empty) → ``[B, T, H, v_dim]``, by default a heads-major view
    (storage ``[B, H, T, v_dim]``, what a per-head ``W_UV`` matmul reads without a copy), or written
    into ``out``. Every input may be a strided view (cache slices, the permuted result of an einsum):
    only the last dim must be contiguous. Check :func:`mla_supported` first."""
    lib = _require_library()
    B, T, H, Cq = q.shape
    C = Cq + (0 if q_rope is None else q_rope.shape[-1])
    if rope is None:  # one [B, S, C] key tensor: split it where the query splits (if it does)
        if latent.shape[-1] != C:
            raise ValueError(f"q has {C} dims per head but the keys have {latent.shape[-1]}")
        if q_rope is not None:
            latent, rope = latent[..., :Cq], latent[..., Cq:]
    Cl = latent.shape[-1]
    Cr = 0 if rope is None else rope.shape[-1]
    if Cl + Cr != C or (q_rope is not None and Cq != Cl):
        raise ValueError(f"q has {Cq} + {C - Cq} dims per head but the keys have {Cl} + {Cr}")
    # The kernel reads every batch row, key row and query head it is told of: the shapes must agree.
    if latent.shape[0] != B or (rope is not None and rope.shape[:2] != latent.shape[:2]):
        raise ValueError(f"keys {tuple(latent.shape)} (rope {None if rope is None else tuple(rope.shape)}) "
                         f"do not match q's batch of {B} and each other's rows")  # fmt: skip
    if q_rope is not None and q_rope.shape[:3] != (B, T, H):
        raise ValueError(f"q_rope {tuple(q_rope.shape)} does not match q {tuple(q.shape)}")
    if Cr and q_rope is None:
        q_rope = q[..., Cl:]
    qr = q if q_rope is None else q_rope
    q, qr = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, qr))
    idx = _kernel_indices(topk_indices, (B, T), latent.shape[1])
    K = idx.shape[-1]
    if out is None:
        out = q.new_empty(B, H, T, v_dim).transpose(1, 2)
    elif out.shape != (B, T, H, v_dim) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out must be [B, T, H, v_dim] = {(B, T, H, v_dim)} in {q.dtype}, its last dim contiguous"
        )
    if T == 0:
        return out
    # Queries are split across threads; a decode step (one query) runs on this thread: splitting its
    # selection across threads and merging by log-sum-exp is slower end to end, because the other
    # thread wakes late after torch's parallel ops (docs/dsa.md).
    workers = max(1, min(torch.get_num_threads(), T))
    jobs = []
    step = -(-T // workers)
    scratch = _scratch(workers, lib.dsv32_sparse_mqa_scratch_bytes(H, Cl, Cr, v_dim, K))
    for b in range(B):
        for start in range(0, T, step):
            jobs.append(_mqa_job(q, qr, latent, rope, idx, out, b, start, min(step, T - start), scale, v_dim))
    _run(getattr(lib, f"dsv32_sparse_mqa_{_SUFFIX[q.dtype]}"), jobs, scratch)
    return out


def _kernel_indices(topk_indices: torch.Tensor, batch_queries: tuple[int, int], S: int) -> torch.Tensor:
    """``topk_indices`` ``[B, T, K]`` as the kernels read them (int64, rows contiguous), checked: the
    kernels read row ``r`` of the keys for every ``r >= 0`` (-1 = empty slot), so nothing may reach
    ``S``."""
    if topk_indices.dim() != 3 or tuple(topk_indices.shape[:2]) != batch_queries:
        raise ValueError(
            f"topk_indices must be [B, T, K] with (B, T) = {batch_queries}, got {tuple(topk_indices.shape)}"
        )
    idx = topk_indices if topk_indices.dtype == torch.int64 else topk_indices.to(torch.int64)
    if idx.stride(-1) != 1:
        idx = idx.contiguous()
    if idx.numel() and int(idx.max()) >= S:
        raise IndexError(f"topk_indices selects key {int(idx.max())} but there are only {S} keys")
    return idx


def _at(t: torch.Tensor | None, b: int, start: int = 0) -> int | None:
    """Address of ``t[b, start]`` (None for None)."""
    if t is None:
        return None
    return t.data_ptr() + (b * t.stride(0) + start * t.stride(1)) * t.element_size()


def _mqa_job(q, qr, latent, rope, idx, out, b, start, n, scale, v_dim) -> tuple:
    """Arguments of one ``dsv32_sparse_mqa_*`` call: queries ``start .. start + n`` of batch row ``b``."""
    H, Cl = q.shape[2], latent.shape[-1]
    Cr = 0 if rope is None else rope.shape[-1]
    return (
        n, H, Cl, Cr, v_dim, idx.shape[-1], scale,
        _at(q, b, start), q.stride(1), q.stride(2),
        _at(qr, b, start), qr.stride(1), qr.stride(2),
        _at(latent, b), latent.stride(1),
        _at(rope, b), 0 if rope is None else rope.stride(1),
        None, 0,  # no separate value rows: the value is the latent's first v_dim dims
        _at(idx, b, start), idx.stride(1),
        _at(out, b, start), out.stride(1), out.stride(2),
    )  # fmt: skip


def gqa_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Inputs :func:`sparse_gqa_attention_cpu` takes: CPU tensors all fp32 or all bf16, the last dim
    contiguous, head dims multiples of 8, query heads a multiple of the KV heads, K and V of one shape
    but their widths, q as wide as K."""
    return (
        q.dtype in _SUFFIX
        and q.dim() == k.dim() == v.dim() == 4
        and all(t.device.type == "cpu" and t.dtype == q.dtype and t.stride(-1) == 1 for t in (q, k, v))
        and q.shape[-1] == k.shape[-1]
        and k.shape[:3] == v.shape[:3]
        and q.shape[0] == k.shape[0]
        and q.shape[-1] % 8 == 0
        and v.shape[-1] % 8 == 0
        and q.shape[2] % k.shape[2] == 0
        and available()
    )


def sparse_gqa_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    topk_indices: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """GQA attention over the selected keys with the MQA kernel: the ``G = H / H_kv`` query heads of
    one KV head share its key rows (the kernel's latent, scored over all ``D`` dims) and its value
    rows. ``q`` ``[B, T, H, D]``, ``k`` ``[B, S, H_kv, D]``, ``v`` ``[B, S, H_kv, D_v]`` (strided views
    welcome: a cache ``[B, H_kv, S, D]`` transposed), ``topk_indices`` ``[B, T, K]`` (-1 = empty) →
    ``[B, T, H, D_v]``, or written into ``out`` (its last dim contiguous). One call per (batch row, KV
    head, run of queries); a decode step runs on this thread, as in :func:`sparse_mla_attention_cpu`.
    Check :func:`gqa_supported` first."""
    lib = _require_library()
    B, T, H, D = q.shape
    Hkv, Dv = k.shape[2], v.shape[-1]
    G = H // Hkv
    idx = _kernel_indices(topk_indices, (B, T), k.shape[1])
    K = idx.shape[-1]
    if out is None:
        out = q.new_empty(B, T, H, Dv)
    elif out.shape != (B, T, H, Dv) or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out must be [B, T, H, D_v] = {(B, T, H, Dv)} in {q.dtype}, its last dim contiguous"
        )
    if T == 0:
        return out
    workers = max(1, min(torch.get_num_threads(), T))
    step = -(-T // workers)
    scratch = _scratch(workers, lib.dsv32_sparse_mqa_scratch_bytes(G, D, 0, Dv, K))
    # The addresses are computed here from strides read once, not with _at/_mqa_job per job: at a
    # decode step that Python costs more than the kernel (~100 against ~160 µs per call, 3 KV heads).
    e = q.element_size()  # strides in bytes below; the kernel takes them in elements
    qs, ks, vs, ids, os_ = q.stride(), k.stride(), v.stride(), idx.stride(), out.stride()
    q0, k0, v0, i0, o0 = q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr(), out.data_ptr()
    jobs = []
    for b in range(B):
        for start in range(0, T, step):
            n = min(step, T - start)
            for h in range(Hkv):  # a KV head's G query heads, its key rows and its value rows
                jobs.append(
                    (
                        n, G, D, 0, Dv, K, scale,
                        q0 + (b * qs[0] + start * qs[1] + h * G * qs[2]) * e, qs[1], qs[2],
                        None, 0, 0,
                        k0 + (b * ks[0] + h * ks[2]) * e, ks[1],
                        None, 0,
                        v0 + (b * vs[0] + h * vs[2]) * e, vs[1],
                        i0 + (b * ids[0] + start * ids[1]) * 8, ids[1],
                        o0 + (b * os_[0] + start * os_[1] + h * G * os_[2]) * e, os_[1], os_[2],
                    )
                )  # fmt: skip
    _run(getattr(lib, f"dsv32_sparse_mqa_{_SUFFIX[q.dtype]}"), jobs, scratch)
    return out


def decode_gqa_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Inputs :func:`decode_gqa_attention_cpu` takes: CPU tensors all fp32 or all bf16, one query
    token per row, the last dim contiguous, head dims multiples of 8, query heads a multiple of the
    KV heads, K and V of one shape but their widths."""
    return (
        q.dtype in _SUFFIX
        and q.dim() == k.dim() == v.dim() == 4
        and q.shape[2] == 1
        and all(t.device.type == "cpu" and t.dtype == q.dtype and t.stride(-1) == 1 for t in (q, k, v))
        and q.shape[0] == k.shape[0]
        and q.shape[-1] == k.shape[-1]
        and k.shape[:3] == v.shape[:3]
        and q.shape[-1] % 8 == 0
        and v.shape[-1] % 8 == 0
        and q.shape[1] % k.shape[1] == 0
        and available()
    )


_DECODE_S_STEP = 256  # work buffers are sized for a multiple of this many keys, so steps reuse them


def decode_gqa_attention_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of one query token per batch row over all its cached keys with the C kernel:
    ``q`` ``[B, H, 1, D]``, ``k`` ``[B, H_kv, S, D]``, ``v`` ``[B, H_kv, S, D_v]`` (views of a cache
    with room to grow welcome: only the last dim must be contiguous), ``mask`` ``[B, S]`` (True =
    attend) or None (every key) → ``[B, 1, H, D_v]``, query head ``h`` reading KV head
    ``h // (H / H_kv)``. A row that attends to no key gets zeros. One C call; its (row, KV head)
    problems run on torch's OpenMP threads where the library has OpenMP, else on this thread. Check
    :func:`decode_gqa_supported` first."""
    lib = _require_library()
    B, H, _, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    if mask is not None:
        if mask.shape != (B, S):
            raise ValueError(f"mask {tuple(mask.shape)} must be [B, S] = {(B, S)}")
        mask = mask if mask.dtype == torch.bool else mask.bool()
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    out = q.new_empty(B, 1, H, Dv)
    if B == 0:
        return out
    threads = torch.get_num_threads() if lib.openmp else 1
    room = -(-S // _DECODE_S_STEP) * _DECODE_S_STEP
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    job = (
        threads, B, Hkv, G, D, Dv, S, scale,
        q.data_ptr(), qs[0], qs[1],
        k.data_ptr(), ks[0], ks[1], ks[2],
        v.data_ptr(), vs[0], vs[1], vs[2],
        None if mask is None else mask.data_ptr(), 0 if mask is None else mask.stride(0),
        out.data_ptr(), out.stride(0), out.stride(2),
    )  # fmt: skip
    # one job, on this thread (the kernel's threads are OpenMP's); one buffer holds every thread's part
    scratch = _scratch(1, threads * lib.dsv32_decode_gqa_scratch_bytes(G, D, Dv, room))
    _run(getattr(lib, f"dsv32_decode_gqa_{_SUFFIX[q.dtype]}"), [job], scratch)
    return out


def indexer_supported(q: torch.Tensor, k_index: torch.Tensor) -> bool:
    """Inputs :func:`indexer_topk_cpu` takes: CPU tensors (keys fp32 or bf16, read as they are; other
    float types upcast), indexer heads a multiple of 4 and a head dim a multiple of 8, fewer than
    2^31 keys."""
    H, D = q.shape[-2:]
    return (
        q.device.type == "cpu"
        and k_index.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and H % 4 == 0
        and D % 8 == 0
        and k_index.shape[1] < 2**31
        and available()
    )


def _balanced_splits(costs: torch.Tensor, parts: int) -> list[int]:
    """Cut points ``0 = c0 < c1 < ... = n`` splitting rows of ``costs`` into ``parts`` runs of about
    equal total cost (causal queries see more keys the later they come)."""
    n = costs.numel()
    total = torch.cumsum(costs.double(), 0)
    targets = total[-1] * torch.arange(1, parts, dtype=torch.float64) / parts
    cuts = torch.searchsorted(total, targets).tolist()
    return sorted({0, n, *(min(max(c, 1), n - 1) for c in cuts if n > 1)})


def one_entry_per_key(key_padding_mask: torch.Tensor, B: int, S: int) -> bool:
    """Whether a key padding mask is ``[B, S]`` (or ``[1, S]``, for every batch row), as the indexer
    paths read it; a wrong shape would broadcast silently on the torch path."""
    return (
        key_padding_mask.dim() == 2 and key_padding_mask.shape[1] == S and key_padding_mask.shape[0] in (1, B)
    )


def indexer_topk_cpu(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_index: torch.Tensor,
    topk: int,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Lightning-indexer scores and their exact top-k with the C kernel: the contract of
    :func:`dsv32.dsa.indexer_topk` (queries aligned to the end of the keys; ``-1`` = empty slot;
    slots unordered). Scores are fp32 whatever the input dtype. Check :func:`indexer_supported`."""
    lib = _require_library()
    B, T, H, D = q.shape
    S = k_index.shape[1]
    K = min(topk, S)
    out = torch.empty((B, T, K), dtype=torch.long)
    if T == 0 or K == 0:
        return out
    qf = q.float().contiguous()
    wf = weights.float().contiguous()
    keys = k_index if k_index.dtype in _SUFFIX else k_index.float()  # bf16 keys are read as they are
    if keys.stride(-1) != 1:
        keys = keys.contiguous()
    pad = None
    if key_padding_mask is not None and not bool(key_padding_mask.bool().all()):
        if not one_entry_per_key(key_padding_mask, B, S):  # the kernel reads S bytes per batch row
            raise ValueError(f"key_padding_mask {tuple(key_padding_mask.shape)} must be [B, S] = {(B, S)}")
        pad = (~key_padding_mask.bool()).to(torch.uint8).expand(B, S).contiguous()
    offset = S - T
    threads = torch.get_num_threads()
    workers = max(1, min(threads, T))
    cuts = [0, T] if workers == 1 else _balanced_splits((torch.arange(T) + offset + 1).clamp_max(S), workers)
    longest = max(z - a for a, z in itertools.pairwise(cuts))  # a decode step needs one row, not 32
    suffix = _SUFFIX[keys.dtype]
    tiles = None
    if longest > lib.dsv32_indexer_query_block():  # several query blocks read each key tile:
        key_tile = lib.dsv32_indexer_key_tile()  # transpose the keys once
        n_tiles = -(-S // key_tile)
        tiles = torch.empty((B, n_tiles, D, key_tile), dtype=torch.float32)
        step = -(-n_tiles // threads)
        jobs = [
            (_at(keys, b), keys.stride(1), S, D, t0, min(t0 + step, n_tiles), tiles[b].data_ptr())
            for b in range(B)
            for t0 in range(0, n_tiles, step)
        ]
        _run(getattr(lib, f"dsv32_indexer_transpose_{suffix}"), jobs, workers=threads)
    jobs = []
    scratch = _scratch(workers, lib.dsv32_indexer_scratch_bytes(S, D, longest))
    for b in range(B):
        for a, z in itertools.pairwise(cuts):
            jobs.append(
                (
                    z - a, H, D, K,
                    _at(qf, b, a), qf.stride(1), qf.stride(2),
                    _at(wf, b, a), wf.stride(1),
                    _at(keys, b), keys.stride(1), None if tiles is None else tiles[b].data_ptr(), S, offset + a + 1,
                    None if pad is None else pad[b].data_ptr(),
                    _at(out, b, a), out.stride(1),
                )
            )  # fmt: skip
    _run(getattr(lib, f"dsv32_indexer_topk_{suffix}"), jobs, scratch)
    return out


_GUARD = (
    64  # bytes past each work buffer, checked after every call: a kernel writing out of bounds fails loudly
)
_GUARD_BYTE = 0xA5
_GUARD_PATTERN = bytes([_GUARD_BYTE]) * _GUARD
_KEEP_BYTES = 1 << 22  # work buffers up to this size are kept for the calling thread's next calls
_KEEP_SIZES = 8  # ... in this many sizes (the least recently used size goes first)


class _Work:
    """A work buffer of one thread's C calls: ``nbytes`` for the kernel, then :data:`_GUARD` bytes of
    a known pattern. The memory comes from torch's allocator (so memory profiles see it); numpy reads
    the guard back for a fraction of what a torch op costs."""

    __slots__ = ("address", "array", "nbytes", "tensor")

    def __init__(self, nbytes: int) -> None:
        self.tensor = torch.empty(nbytes + _GUARD, dtype=torch.uint8)
        self.array, self.address, self.nbytes = self.tensor.numpy(), self.tensor.data_ptr(), nbytes
        self.array[nbytes:] = _GUARD_BYTE

    def intact(self) -> bool:
        return self.array[self.nbytes :].tobytes() == _GUARD_PATTERN


class _KeptWork(threading.local):
    """Each calling thread's work buffers by size, reused from call to call: a decode step makes a few
    small kernel calls per layer, where allocating and guarding fresh buffers cost about as much as
    the kernels. Exact sizes keep the guard right after what the kernel may touch (and, under
    AddressSanitizer, the allocator's red zone right after the guard)."""

    def __init__(self) -> None:
        self.by_size: dict[int, list[_Work]] = {}  # least recently used first


_kept = _KeptWork()


def _scratch(workers: int, nbytes: int) -> list[_Work]:
    """One guarded work buffer of ``nbytes`` per thread; small ones are kept for the calling thread's
    next calls (its pool threads use them only while it waits), larger ones are allocated afresh."""
    if nbytes + _GUARD > _KEEP_BYTES:
        return [_Work(nbytes) for _ in range(workers)]
    kept = _kept.by_size
    works = kept.pop(nbytes, [])
    works += [_Work(nbytes) for _ in range(workers - len(works))]
    kept[nbytes] = works
    if len(kept) > _KEEP_SIZES:
        del kept[next(iter(kept))]
    return works[:workers]


def _run(fn, jobs: list[tuple], scratch: list[_Work] | None = None, workers: int = 1) -> None:
    """Each job's C call on ``W`` threads in parallel (the calls release the GIL): thread ``i`` runs
    jobs ``i, i + W, ...``. With ``scratch`` (one work buffer per thread, ``W = len(scratch)``) the
    call is ``fn(*job, scratch[i])`` and every buffer's guard is checked afterwards; without it
    ``fn(*job)`` on ``W = workers`` threads. One job, or one thread, runs on the calling thread."""
    if scratch is not None:
        workers = len(scratch)

    def worker(i: int, stride: int) -> None:
        extra = () if scratch is None else (scratch[i].address,)
        for job in jobs[i::stride]:
            fn(*job, *extra)

    threads = min(workers, len(jobs))
    if threads <= 1:
        worker(0, 1)
    else:
        list(_executor(workers).map(worker, range(threads), [workers] * threads))
    if scratch is not None and not all(work.intact() for work in scratch):
        raise RuntimeError(
            f"dsv32 CPU kernel {fn.__name__} wrote past its work buffer (a bug: please report)"
        )
