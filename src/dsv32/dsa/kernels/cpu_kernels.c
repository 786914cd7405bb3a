/* DSA's CPU hot path: MLA's MQA-mode attention over each query's selected latents, fused.
 *
 * The torch path gathers the selected rows into a buffer, then runs two batched matmuls and a softmax
 * over it — three trips through memory per selected latent and one Python iteration per few queries.
 * Here each query reads its selected rows straight from the cache in blocks of BLOCK_KEYS and keeps
 * everything else in cache: the block's scores ([H, LD_S]), an online (running-max) softmax and
 * the value accumulator ([H, V]). One call handles a run of queries of one batch row; the caller
 * splits the queries across threads (calls release the GIL).
 *
 * Portable C (GCC/Clang vector extensions, 8 floats wide): built at first use with -O3 -march=native
 * by dsv32/dsa/kernels/cpu.py, which holds the Python side and the shape checks.
 */
#include <math.h>
#ifdef __AVX__
#include <immintrin.h>
#endif
#include <stdint.h>
#include <string.h>

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

#define BLOCK_KEYS 64 /* selected rows per block: 64 latents of 576 fp32 (147 KB) stay in L2 */
#define TILE_H 2         /* heads per score tile (their query chunks stay in registers) */
#define TILE_K 6         /* keys per score tile: 2 x 6 accumulators, 8 loads per 12 FMAs */
#define PREFETCH_TILES 2 /* score tiles between a row's prefetch and its use */
#define PREFETCH_LINES 4 /* cache lines requested per row: the hardware prefetcher streams the rest
                          * (requesting whole rows, 216 lines a tile, overflows the miss buffers) */
#define LD_S ((BLOCK_KEYS + TILE_K - 1) / TILE_K * TILE_K) /* score row: whole tiles, past the block too */
#define VALUE_H 4        /* heads per value tile (4 x 16 dims) */

static inline f8 load8(const float *p) {
    f8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, f8 v) { memcpy(p, &v, sizeof v); }

/* Inputs may be fp32 or bf16 (`bf16` is a compile-time constant in every caller, so each kernel is
 * specialized twice); arithmetic is fp32 either way. bf16 -> fp32 is exact: the bits move up 16. */
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline f8 loadx(const void *p, int64_t c, const int bf16) {
    if (!bf16) return load8((const float *)p + c);
#ifdef __AVX2__ /* one widening load (GCC splits the generic conversion below in two halves) */
    return (f8)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + c))), 16);
#else
    u16x8 h;
    memcpy(&h, (const uint16_t *)p + c, sizeof h);
    return (f8)(__builtin_convertvector(h, u32x8) << 16);
#endif
}

static inline float to_float(const void *p, int64_t c, const int bf16) {
    if (!bf16) return ((const float *)p)[c];
    uint32_t bits = (uint32_t)((const uint16_t *)p)[c] << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* fp32 -> bf16, rounding to nearest even (what torch's .to(torch.bfloat16) does for finite values). */
static inline uint16_t to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

static inline f8 splat8(float x) { return (f8){x, x, x, x, x, x, x, x}; }

/* Keep a loaded vector in a register: without this GCC folds the load into every FMA that uses it,
 * re-reading it from L1 once per use and making the tiles load-bound. Only where an 8-float vector
 * fits one register (AVX): a plain x86 build (SSE, no -march=native) splits it in two. */
#if defined(__GNUC__) && defined(__AVX__)
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

static inline float hsum8(f8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* e^x for x <= 0 (softmax arguments after subtracting the row max): x = n ln2 + r, |r| <= ln2/2,
 * e^r by its degree-6 Taylor polynomial (relative error < 2e-7), 2^n through the exponent bits.
 * Below -87.3 the result is clamped to ~1e-38 instead of 0; callers zero the slots they do not use. */
static inline f8 exp8(f8 x) {
    const f8 lo = splat8(-87.3f);
    i8 below = x < lo;
    x = (f8)(((i8)x & ~below) | ((i8)lo & below));
    f8 t = x * splat8(1.44269504088896341f) - splat8(0.5f); /* x <= 0: truncation rounds to nearest */
    i8 n = __builtin_convertvector(t, i8);
    f8 nf = __builtin_convertvector(n, f8);
    f8 r = x - nf * splat8(0.693145751953125f) - nf * splat8(1.42860682030941723212e-6f);
    f8 p = splat8(1.0f / 720.0f);
    p = p * r + splat8(1.0f / 120.0f);
    p = p * r + splat8(1.0f / 24.0f);
    p = p * r + splat8(1.0f / 6.0f);
    p = p * r + splat8(0.5f);
    p = p * r + splat8(1.0f);
    p = p * r + splat8(1.0f);
    i8 bits = (n + 127) << 23;
    return p * (f8)bits;
}

/* scores[h][j] = scale * (q_h[:Cl] . kp[j][:Cl] + q_h[Cl:] . rp[j][:Cr]) for a TILE_H x TILE_K tile;
 * q_h = q + h*q_sh holds the latent part, then the rope part (the kernel stages each query so). The
 * heads' query chunks are held in registers and each key chunk is loaded once. */
static inline void score_tile(const float *q, int64_t q_sh, int64_t Cl, int64_t Cr, const void *const *kp,
                              const void *const *rp, float scale, float *s, int64_t ld_s, const int bf16) {
    f8 acc[TILE_H][TILE_K];
    for (int h = 0; h < TILE_H; h++)
        for (int j = 0; j < TILE_K; j++) acc[h][j] = splat8(0.0f);
    for (int part = 0; part < 2; part++) { /* the latent dims, then the rope dims */
        const int64_t width = part ? Cr : Cl, off = part ? Cl : 0;
        const void *const *rows = part ? rp : kp;
        for (int64_t c = 0; c < width; c += 8) {
            f8 x[TILE_H];
            for (int h = 0; h < TILE_H; h++) {
                x[h] = load8(q + h * q_sh + off + c);
                IN_REGISTER(x[h]);
            }
            for (int j = 0; j < TILE_K; j++) {
                f8 y = loadx(rows[j], c, bf16);
                IN_REGISTER(y);
                for (int h = 0; h < TILE_H; h++) acc[h][j] += x[h] * y;
            }
        }
    }
    for (int h = 0; h < TILE_H; h++)
        for (int j = 0; j < TILE_K; j++) s[h * ld_s + j] = scale * hsum8(acc[h][j]);
}

/* The same for one head and one key (tile remainders). */
static inline float score_one(const float *q, int64_t Cl, int64_t Cr, const void *k, const void *r, const int bf16) {
    f8 acc = splat8(0.0f);
    for (int64_t c = 0; c < Cl; c += 8) acc += load8(q + c) * loadx(k, c, bf16);
    for (int64_t c = 0; c < Cr; c += 8) acc += load8(q + Cl + c) * loadx(r, c, bf16);
    return hsum8(acc);
}

/* acc[h][d..d+16) += sum_j p[h][j] * kp[j][d..d+16) for VALUE_H heads (acc rows ld_acc apart). */
static inline void value_tile(const float *p, int64_t ld_p, const void *const *kp, int nb, int64_t d,
                              float *acc, int64_t ld_acc, const int bf16) {
    f8 a[VALUE_H][2];
    for (int h = 0; h < VALUE_H; h++) {
        a[h][0] = load8(acc + h * ld_acc + d);
        a[h][1] = load8(acc + h * ld_acc + d + 8);
    }
    for (int j = 0; j < nb; j++) {
        f8 y0 = loadx(kp[j], d, bf16), y1 = loadx(kp[j], d + 8, bf16);
        for (int h = 0; h < VALUE_H; h++) {
            f8 w = splat8(p[h * ld_p + j]);
            a[h][0] += w * y0;
            a[h][1] += w * y1;
        }
    }
    for (int h = 0; h < VALUE_H; h++) {
        store8(acc + h * ld_acc + d, a[h][0]);
        store8(acc + h * ld_acc + d + 8, a[h][1]);
    }
}

/* acc[d..d+8) += sum_j p[j] * kp[j][d..d+8) for one head (remainders of the tiles above). */
static inline void value_one(const float *p, const void *const *kp, int nb, int64_t d, float *acc, const int bf16) {
    f8 a = load8(acc + d);
    for (int j = 0; j < nb; j++) a += splat8(p[j]) * loadx(kp[j], d, bf16);
    store8(acc + d, a);
}

/* Heads the kernel computes: H, plus one all-zero query head when H % 4 == 3 (3 or 7 query heads per
 * KV head in GQA), so every head runs in the 2-head score tiles and the 4-head value tiles; a lone
 * remainder head costs more than the extra head. Its output is never written. */
static inline int64_t padded_heads(int64_t H) { return H % VALUE_H == VALUE_H - 1 ? H + 1 : H; }

/* MQA-mode sparse attention for n queries of one batch row.
 *
 *   q[i][h][:]   = q + i*q_sn + h*q_stride_h      (Cl values, contiguous: the latent part)
 *   qr[i][h][:]  = qr + i*qr_sn + h*qr_stride_h   (Cr values: the rope part)
 *   latent row s = kv + s*kv_ld                     (Cl values; its first V are the value)
 *   rope row s   = rope + s*rope_ld                 (Cr values; unused when Cr == 0)
 *   value row s  = val + s*val_ld                   (V values, when val is not NULL: then the value
 *                                                    is its own tensor, as in one KV head of GQA)
 *   idx[i][j]    = idx + i*idx_sn + j               (K row numbers, -1 = empty slot)
 *   out[i][h][:] = out + i*out_sn + h*out_sh        (V values)
 *
 * out = softmax_j(scale * q . key_j) . value_j over the filled slots; a query with none gets zeros.
 * Strides count elements; q, qr, kv, rope, val and out are all fp32 (dsv32_sparse_mqa_f32) or all bf16
 * (dsv32_sparse_mqa_bf16). Cl, Cr and V must be multiples of 8. scratch: dsv32_sparse_mqa_scratch_bytes(...) bytes, 8-aligned
 * (the caller allocates it, so the memory shows in its allocator's accounting). */
int64_t dsv32_sparse_mqa_scratch_bytes(int64_t H, int64_t Cl, int64_t Cr, int64_t V, int64_t K) {
    const int64_t Hp = padded_heads(H);
    return (int64_t)sizeof(float *) * (3 * K + 3 * TILE_K) +
           (int64_t)sizeof(float) * (Hp * LD_S + Hp * V + 2 * Hp + Hp * (Cl + Cr));
}

static inline __attribute__((always_inline)) void sparse_mqa(
    int64_t n, int64_t H, int64_t Cl, int64_t Cr, int64_t V, int64_t K, float scale, const void *q, int64_t q_sn,
    int64_t q_stride_h, const void *qr, int64_t qr_sn, int64_t qr_stride_h, const void *kv, int64_t kv_ld,
    const void *rope, int64_t rope_ld, const void *val, int64_t val_ld, const int64_t *idx, int64_t idx_sn,
    void *out, int64_t out_sn, int64_t out_sh, void *scratch, const int bf16) {
    const int64_t ld_s = LD_S;
    const int64_t C = Cl + Cr, esize = bf16 ? 2 : 4, Hq = H;
    H = padded_heads(H); /* from here on H counts the padding head too; Hq heads are real */
    const void **kp = scratch;
    float *s = (float *)(kp + 3 * K + 3 * TILE_K);
    float *acc = s + H * ld_s, *row_max = acc + H * V, *row_sum = row_max + H, *qbuf = row_sum + H;
    /* the rows read for values: their own (val), or the latents themselves */
    const void **rp = kp + K + TILE_K, **vp = val ? rp + K + TILE_K : kp;

    for (int64_t i = 0; i < n; i++) {
        /* this query's heads side by side (strided or heads-major inputs would alias in L1) */
        for (int64_t h = 0; h < Hq; h++) {
            const char *qh = (const char *)q + (i * q_sn + h * q_stride_h) * esize;
            const char *qrh = (const char *)qr + (i * qr_sn + h * qr_stride_h) * esize;
            for (int64_t c = 0; c < Cl; c += 8) store8(qbuf + h * C + c, loadx(qh, c, bf16));
            for (int64_t c = 0; c < Cr; c += 8) store8(qbuf + h * C + Cl + c, loadx(qrh, c, bf16));
        }
        for (int64_t h = Hq; h < H; h++) memset(qbuf + h * C, 0, sizeof(float) * (size_t)C);
        const int64_t *ii = idx + i * idx_sn;
        int64_t nk = 0; /* the filled slots' rows, compacted */
        for (int64_t j = 0; j < K; j++) {
            int64_t r = ii[j];
            if (r < 0) continue;
            kp[nk] = (const char *)kv + r * kv_ld * esize;
            rp[nk] = Cr ? (const char *)rope + r * rope_ld * esize : kp[nk];
            if (val) vp[nk] = (const char *)val + r * val_ld * esize;
            nk++;
        }
        for (int64_t j = nk; j < nk + TILE_K && nk; j++) { /* a last partial tile reads real rows */
            kp[j] = kp[nk - 1];
            rp[j] = rp[nk - 1];
            if (val) vp[j] = vp[nk - 1];
        }
        for (int64_t h = 0; h < H; h++) {
            row_max[h] = -INFINITY;
            row_sum[h] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t)(H * V));

        for (int64_t j0 = 0; j0 < nk; j0 += BLOCK_KEYS) {
            const int nb = (int)(nk - j0 < BLOCK_KEYS ? nk - j0 : BLOCK_KEYS);
            const void *const *bk = kp + j0, *const *br = rp + j0, *const *bv = vp + j0;
            /* scores of this block, key tile by key tile (a partial last tile scores rows past the
             * block, whose slots are ignored): the tile's rows stay in L1 for every head while the
             * starts of the rows PREFETCH_TILES tiles ahead are requested (the hardware prefetcher
             * cannot guess random rows, but follows one once it has started) */
            int64_t h;
            for (int j = 0; j < nb; j += TILE_K) {
                for (int64_t a = j0 + j + PREFETCH_TILES * TILE_K; a < j0 + j + (PREFETCH_TILES + 1) * TILE_K && a < nk; a++) {
                    for (int64_t c = 0; c < Cl * esize && c < 64 * PREFETCH_LINES; c += 64)
                        __builtin_prefetch((const char *)kp[a] + c);
                    for (int64_t c = 0; c < Cr * esize && c < 64 * PREFETCH_LINES; c += 64)
                        __builtin_prefetch((const char *)rp[a] + c);
                    for (int64_t c = 0; val && c < V * esize && c < 64 * PREFETCH_LINES; c += 64)
                        __builtin_prefetch((const char *)vp[a] + c);
                }
                for (h = 0; h + TILE_H <= H; h += TILE_H)
                    score_tile(qbuf + h * C, C, Cl, Cr, bk + j, br + j, scale, s + h * ld_s + j, ld_s, bf16);
                for (; h < H; h++)
                    for (int jj = j; jj < j + TILE_K; jj++)
                        s[h * ld_s + jj] = scale * score_one(qbuf + h * C, Cl, Cr, bk[jj], br[jj], bf16);
            }
            /* online softmax: rescale what was accumulated when a head's running max grows */
            for (h = 0; h < H; h++) {
                float *sh = s + h * ld_s, m = row_max[h];
                for (int j = 0; j < nb; j++) m = sh[j] > m ? sh[j] : m;
                const float alpha = expf(row_max[h] - m); /* 0 on the first block (max was -inf) */
                row_max[h] = m;
                f8 total = splat8(0.0f);
                for (int j = 0; j < nb; j += 8) {
                    f8 e = exp8(load8(sh + j) - splat8(m));
                    for (int l = nb - j; l < 8; l++) e[l] = 0.0f; /* slots past the block's end */
                    store8(sh + j, e);
                    total += e;
                }
                row_sum[h] = row_sum[h] * alpha + hsum8(total);
                if (alpha != 1.0f) {
                    float *ah = acc + h * V;
                    for (int64_t d = 0; d < V; d += 8) store8(ah + d, load8(ah + d) * splat8(alpha));
                }
            }
            /* values: acc += p . value (latent[:V], or the value rows) */
            for (int64_t d = 0; d < V; d += 16) {
                const int wide = d + 16 <= V;
                for (h = 0; h + VALUE_H <= H && wide; h += VALUE_H)
                    value_tile(s + h * ld_s, ld_s, bv, nb, d, acc + h * V, V, bf16);
                for (; h < H; h++) {
                    value_one(s + h * ld_s, bv, nb, d, acc + h * V, bf16);
                    if (wide) value_one(s + h * ld_s, bv, nb, d + 8, acc + h * V, bf16);
                }
            }
        }
        for (int64_t h = 0; h < Hq; h++) {
            const float inv = nk ? 1.0f / row_sum[h] : 0.0f;
            if (bf16) {
                uint16_t *o = (uint16_t *)out + i * out_sn + h * out_sh;
                for (int64_t d = 0; d < V; d++) o[d] = to_bf16(acc[h * V + d] * inv);
            } else {
                float *o = (float *)out + i * out_sn + h * out_sh;
                for (int64_t d = 0; d < V; d += 8) store8(o + d, load8(acc + h * V + d) * splat8(inv));
            }
        }
    }
}

#define SPARSE_MQA_ARGS                                                                                      \
    int64_t n, int64_t H, int64_t Cl, int64_t Cr, int64_t V, int64_t K, float scale, const void *q, int64_t q_sn, \
        int64_t q_stride_h, const void *qr, int64_t qr_sn, int64_t qr_stride_h, const void *kv, int64_t kv_ld,    \
        const void *rope, int64_t rope_ld, const void *val, int64_t val_ld, const int64_t *idx, int64_t idx_sn,   \
        void *out, int64_t out_sn, int64_t out_sh, void *scratch
#define SPARSE_MQA_CALL(bf16)                                                                               \
    sparse_mqa(n, H, Cl, Cr, V, K, scale, q, q_sn, q_stride_h, qr, qr_sn, qr_stride_h, kv, kv_ld, rope, rope_ld, \
               val, val_ld, idx, idx_sn, out, out_sn, out_sh, scratch, bf16)

void dsv32_sparse_mqa_f32(SPARSE_MQA_ARGS) { SPARSE_MQA_CALL(0); }
void dsv32_sparse_mqa_bf16(SPARSE_MQA_ARGS) { SPARSE_MQA_CALL(1); }

/* ---- dense decode attention for grouped-query heads: one query token per batch row ----
 *
 * The engine's decode step for a dense (GQA) model: every KV head of every batch row is one MQA
 * problem of G query heads over all S cached keys, the ones its padding mask hides left out. Keys
 * are read in order (no row list, unlike the sparse kernel above), and the whole batch is one call:
 * Python per (row, head) would cost more than the attention. The problems are split across
 * `threads` OpenMP threads where the library is built with OpenMP; its runtime is the one PyTorch
 * already loaded (libgomp.so.1), so they are the threads torch's own parallel ops just ran on and
 * still spin on — a thread pool of the caller's would wake late next to them.
 *
 *   q[b][h][:]   = q + b*q_sb + h*q_sh           (D values; query head h reads KV head h / G)
 *   key s        = k + b*k_sb + j*k_sh + s*k_ss  (D values, KV head j)
 *   value s      = v + b*v_sb + j*v_sh + s*v_ss  (Dv values)
 *   mask[b][s]   = mask + b*mask_sb + s          (nonzero = attend; mask NULL: every key)
 *   out[b][h][:] = out + b*out_sb + h*out_sh     (Dv values)
 *
 * scratch: `threads` x dsv32_decode_gqa_scratch_bytes(G, D, Dv, S) bytes (one part per thread). */
#ifdef _OPENMP
#include <omp.h>
#endif

#define DECODE_TILE 8 /* keys per score tile: one vector of scores per head */
#define DECODE_AHEAD 4 /* score tiles between a key row's prefetch and its use */

/* The 8 horizontal sums of a[0..7], as one vector (lane j = sum of a[j]). */
static inline f8 hsum8x8(const f8 *a) {
#ifdef __AVX__
    __m256 t0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]), t1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
    __m256 t2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]), t3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3); /* [a0..a3 low halves, a0..a3 high] */
    return (f8)_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
#else
    f8 r;
    for (int j = 0; j < 8; j++) r[j] = hsum8(a[j]);
    return r;
#endif
}

int64_t dsv32_decode_gqa_scratch_bytes(int64_t G, int64_t D, int64_t Dv, int64_t S) {
    const int64_t St = (S + DECODE_TILE - 1) / DECODE_TILE * DECODE_TILE;
    const int64_t Gp = (G + VALUE_H - 1) / VALUE_H * VALUE_H;
    return (int64_t)sizeof(float) * (G * D + Gp * St + DECODE_TILE * D + G * Dv) + 64;
}

int64_t dsv32_decode_gqa_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* One problem: G query heads (fp32, scaled, qbuf [G][D]) over the keys s < S whose mask byte is
 * nonzero (none: zeros); k/v point at key 0 of this row and KV head, rows k_ss/v_ss elements apart.
 * Two passes:
 * every score first ([G][St] in scratch), then softmax and the values, so each key and value row is
 * read from memory once. The keys of a tile are made fp32 once ([8][D] in scratch) and read by
 * every head from L1. */
static inline __attribute__((always_inline)) void decode_one(int64_t G, int64_t D, int64_t Dv, int64_t S,
                                                            const float *qbuf, const char *k, int64_t k_ss,
                                                            const char *v, int64_t v_ss, const uint8_t *m,
                                                            char *o, int64_t out_sh, float *work, const int bf16) {
    const int64_t esize = bf16 ? 2 : 4, St = (S + DECODE_TILE - 1) / DECODE_TILE * DECODE_TILE;
    const int64_t Gp = (G + VALUE_H - 1) / VALUE_H * VALUE_H;
    float *sc = work, *kt = sc + Gp * St, *acc = kt + DECODE_TILE * D;
    int64_t seen = S; /* keys attended to */
    for (int64_t s = 0; m && s < S; s++) seen -= !m[s];
    if (!seen) { /* nothing to attend to: zeros (all-zero bits in fp32 and bf16 alike) */
        for (int64_t g = 0; g < G; g++) memset(o + g * out_sh * esize, 0, (size_t)(Dv * esize));
        return;
    }
    memset(sc + G * St, 0, sizeof(float) * (size_t)((Gp - G) * St));
    for (int64_t s0 = 0; s0 < S; s0 += DECODE_TILE) {
        const int64_t n = S - s0 < DECODE_TILE ? S - s0 : DECODE_TILE;
        /* the key rows DECODE_AHEAD tiles ahead, and this tile's value rows (read after the scores) */
        for (int64_t j = 0; j < n; j++) {
            const int64_t ahead = s0 + DECODE_AHEAD * DECODE_TILE + j;
            for (int64_t c = 0; ahead < S && c < D * esize; c += 64) __builtin_prefetch(k + ahead * k_ss * esize + c);
            for (int64_t c = 0; c < Dv * esize; c += 64) __builtin_prefetch(v + (s0 + j) * v_ss * esize + c);
        }
        for (int64_t j = 0; j < DECODE_TILE; j++) { /* rows past S repeat the last one */
            const char *row = k + (s0 + (j < n ? j : n - 1)) * k_ss * esize;
            for (int64_t c = 0; c < D; c += 8) store8(kt + j * D + c, loadx(row, c, bf16));
        }
        for (int64_t g = 0; g < G; g++) {
            const float *qg = qbuf + g * D;
            f8 a[DECODE_TILE];
            for (int j = 0; j < DECODE_TILE; j++) a[j] = splat8(0.0f);
            for (int64_t c = 0; c < D; c += 8) {
                f8 x = load8(qg + c);
                IN_REGISTER(x);
                for (int j = 0; j < DECODE_TILE; j++) a[j] += x * load8(kt + j * D + c);
            }
            store8(sc + g * St + s0, hsum8x8(a));
        }
    }
    for (int64_t g = 0; g < G; g++) { /* softmax over the attended keys; the others get 0 */
        float *sg = sc + g * St, mx = -INFINITY;
        for (int64_t s = 0; s < S; s++)
            if (!m || m[s]) mx = sg[s] > mx ? sg[s] : mx;
        f8 total = splat8(0.0f);
        for (int64_t s = 0; s < St; s += 8) {
            f8 e = exp8(load8(sg + s) - splat8(mx));
            for (int64_t l = 0; l < 8; l++)
                if (s + l >= S || (m && !m[s + l])) e[l] = 0.0f;
            store8(sg + s, e);
            total += e;
        }
        const float inv = 1.0f / hsum8(total);
        for (int64_t s = 0; s < St; s += 8) store8(sg + s, load8(sg + s) * splat8(inv));
    }
    /* values, VALUE_H heads at a time: heads past G have all-zero weights (rows Gp of the scores) */
    for (int64_t d = 0; d < Dv; d += 16) {
        const int wide = d + 16 <= Dv;
        for (int64_t g = 0; g < G; g += VALUE_H) {
            f8 a[VALUE_H][2];
            for (int h = 0; h < VALUE_H; h++) a[h][0] = a[h][1] = splat8(0.0f);
            for (int64_t s = 0; s < S; s++) {
                const char *row = v + s * v_ss * esize;
                f8 y0 = loadx(row, d, bf16), y1 = wide ? loadx(row, d + 8, bf16) : splat8(0.0f);
                IN_REGISTER(y0);
                IN_REGISTER(y1);
                for (int h = 0; h < VALUE_H; h++) {
                    f8 w = splat8(sc[(g + h) * St + s]);
                    a[h][0] += w * y0;
                    a[h][1] += w * y1;
                }
            }
            for (int h = 0; h < VALUE_H && g + h < G; h++) {
                store8(acc + (g + h) * Dv + d, a[h][0]);
                if (wide) store8(acc + (g + h) * Dv + d + 8, a[h][1]);
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        if (bf16) {
            uint16_t *og = (uint16_t *)o + g * out_sh;
            for (int64_t d = 0; d < Dv; d++) og[d] = to_bf16(acc[g * Dv + d]);
        } else {
            float *og = (float *)o + g * out_sh;
            for (int64_t d = 0; d < Dv; d += 8) store8(og + d, load8(acc + g * Dv + d));
        }
    }
}

static inline __attribute__((always_inline)) void decode_gqa(
    int64_t threads, int64_t B, int64_t Hkv, int64_t G, int64_t D, int64_t Dv, int64_t S, float scale,
    const void *q, int64_t q_sb, int64_t q_sh, const void *k, int64_t k_sb, int64_t k_sh, int64_t k_ss,
    const void *v, int64_t v_sb, int64_t v_sh, int64_t v_ss, const uint8_t *mask, int64_t mask_sb, void *out,
    int64_t out_sb, int64_t out_sh, void *scratch, const int bf16) {
    const int64_t esize = bf16 ? 2 : 4, part = dsv32_decode_gqa_scratch_bytes(G, D, Dv, S);
    const int64_t problems = B * Hkv;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && problems > 1)
#endif
    for (int64_t p = 0; p < problems; p++) {
#ifdef _OPENMP
        char *base = (char *)scratch + omp_get_thread_num() * part;
#else
        char *base = (char *)scratch;
#endif
        float *qbuf = (float *)(((uintptr_t)base + 63) & ~(uintptr_t)63), *work = qbuf + G * D;
        const int64_t b = p / Hkv, j = p % Hkv;
        const char *qj = (const char *)q + (b * q_sb + j * G * q_sh) * esize;
        for (int64_t g = 0; g < G; g++)
            for (int64_t c = 0; c < D; c += 8)
                store8(qbuf + g * D + c, loadx(qj + g * q_sh * esize, c, bf16) * splat8(scale));
        decode_one(G, D, Dv, S, qbuf, (const char *)k + (b * k_sb + j * k_sh) * esize, k_ss,
                   (const char *)v + (b * v_sb + j * v_sh) * esize, v_ss, mask ? mask + b * mask_sb : NULL,
                   (char *)out + (b * out_sb + j * G * out_sh) * esize, out_sh, work, bf16);
    }
    (void)threads;
}

#define DECODE_GQA_ARGS                                                                                     \
    int64_t threads, int64_t B, int64_t Hkv, int64_t G, int64_t D, int64_t Dv, int64_t S, float scale,          \
        const void *q, int64_t q_sb, int64_t q_sh, const void *k, int64_t k_sb, int64_t k_sh, int64_t k_ss,      \
        const void *v, int64_t v_sb, int64_t v_sh, int64_t v_ss, const uint8_t *mask, int64_t mask_sb, void *out, \
        int64_t out_sb, int64_t out_sh, void *scratch
#define DECODE_GQA_CALL(bf16)                                                                                  \
    decode_gqa(threads, B, Hkv, G, D, Dv, S, scale, q, q_sb, q_sh, k, k_sb, k_sh, k_ss, v, v_sb, v_sh, v_ss, mask, \
               mask_sb, out, out_sb, out_sh, scratch, bf16)

void dsv32_decode_gqa_f32(DECODE_GQA_ARGS) { DECODE_GQA_CALL(0); }
void dsv32_decode_gqa_bf16(DECODE_GQA_ARGS) { DECODE_GQA_CALL(1); }

/* ---- the lightning indexer: I[t, s] = sum_h w[t, h] ReLU(q[t, h] . k[s]) and its exact top-k ----
 *
 * The keys are first transposed, a tile of KEY_TILE at a time ([D][KEY_TILE], fp32), into one buffer
 * that every query block of the call reads (dsv32_indexer_transpose_*), so one query's scores for a
 * tile are vector lanes, with no horizontal sums. Queries go in blocks of QUERY_BLOCK that share each
 * key tile while it sits in L1; the block's scores land in a row buffer as order keys (int32 with the
 * order of the fp32 scores). Each row's top-k is then found coarse to fine: the k-th largest of the
 * maxima of groups of keys bounds the k-th score from below (each of those k groups holds a key at
 * least that large), the keys at or above the bound are the candidates, and a quickselect over
 * their (score, position) sort keys picks the exact top-k under the rule of
 * dsv32.dsa.topk.tie_break_keys: higher score first, then the later position. A group is one lane
 * of g consecutive vectors (keys 8gc + l, 8gc + 8 + l, ...; g >= GROUP, sized to the row), so the
 * maxima are vector maxima. */

#define KEY_TILE 24 /* keys per tile: 4 heads x 3 vectors of scores in registers */
#define TILE_V (KEY_TILE / 8) /* vectors per key tile */
#define QUERY_BLOCK 32
#define GROUP 8
#define HIDDEN INT32_MIN /* order key of a key the query does not see (after it, or padding) */

/* bit l set where lane l of a comparison result is true (-1) */
static inline unsigned lanes_set(i8 mask) {
#ifdef __AVX__
    f8 m;
    memcpy(&m, &mask, sizeof m);
    return (unsigned)_mm256_movemask_ps((__m256)m);
#else
    unsigned bits = 0;
    for (int l = 0; l < 8; l++) bits |= (unsigned)(mask[l] & 1) << l;
    return bits;
#endif
}

/* fp32 -> int32 with the same order (-0.0 folded into +0.0), as dsv32.dsa.topk.float_order_key. */
static inline i8 order8(f8 x) {
    i8 bits = (i8)(x + splat8(0.0f));
    return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

/* Move the k largest of a[0..n) to a[0..k) (any order): quickselect, median-of-three pivots. */
#define DEFINE_SELECT_LARGEST(name, type)                                                                   \
    static void name(type *a, int64_t n, int64_t k) {                                                     \
        int64_t lo = 0, hi = n - 1;                                                                        \
        while (lo < hi) {                                                                                  \
            type x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi], t;                                       \
            type pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));             \
            int64_t i = lo, j = hi;                                                                        \
            while (i <= j) {                                                                               \
                while (a[i] > pivot) i++;                                                                  \
                while (a[j] < pivot) j--;                                                                  \
                if (i <= j) {                                                                              \
                    t = a[i], a[i] = a[j], a[j] = t;                                                       \
                    i++, j--;                                                                              \
                }                                                                                          \
            }                                                                                              \
            if (k - 1 <= j) hi = j;                                                                        \
            else if (k - 1 >= i) lo = i;                                                                   \
            else return;                                                                                   \
        }                                                                                                  \
    }
DEFINE_SELECT_LARGEST(select_largest_i32, int32_t)
DEFINE_SELECT_LARGEST(select_largest_i64, int64_t)

/* The order keys of one query's scores against one key tile (HIDDEN where it does not see the key). */
static inline void score_keys(const float *qi, int64_t q_sh, const float *wi, int64_t H, int64_t D,
                              const float *tile, int64_t s0, int64_t seen, const uint8_t *pad, int32_t *row) {
    f8 score[TILE_V];
    for (int v = 0; v < TILE_V; v++) score[v] = splat8(0.0f);
    for (int64_t h = 0; h < H; h += 4) {
        f8 acc[4][TILE_V];
        for (int a = 0; a < 4; a++)
            for (int v = 0; v < TILE_V; v++) acc[a][v] = splat8(0.0f);
        for (int64_t d = 0; d < D; d++) {
            f8 k[TILE_V];
            for (int v = 0; v < TILE_V; v++) {
                k[v] = load8(tile + d * KEY_TILE + 8 * v);
                IN_REGISTER(k[v]);
            }
            for (int a = 0; a < 4; a++) {
                f8 x = splat8(qi[(h + a) * q_sh + d]);
                for (int v = 0; v < TILE_V; v++) acc[a][v] += x * k[v];
            }
        }
        for (int a = 0; a < 4; a++) {
            const f8 g = splat8(wi[h + a]), zero = splat8(0.0f);
            for (int v = 0; v < TILE_V; v++) score[v] += g * (f8)((i8)acc[a][v] & (acc[a][v] > zero));
        }
    }
    for (int v = 0; v < TILE_V; v++) {
        i8 ord = order8(score[v]);
        memcpy(row + s0 + 8 * v, &ord, sizeof ord);
    }
    if (s0 + KEY_TILE > seen || pad)
        for (int64_t l = 0; l < KEY_TILE; l++)
            if (s0 + l >= seen || (pad && pad[s0 + l])) row[s0 + l] = HIDDEN;
}

/* Positions of the k best of row[0..seen) (order keys, HIDDEN = not selectable) into o[0..k), -1
 * for slots that stay empty. Scratch: groups [seen / GROUP], cand [seen]. */
static void row_topk(const int32_t *row, int64_t seen, int64_t k, int32_t *groups, int64_t *cand, int64_t *o) {
    int32_t bound = HIDDEN + 1;
    /* a group is one lane of gv consecutive vectors (gv keys); gv is the largest power of two from
     * GROUP on that leaves at least 2k groups: the more keys per group, the cheaper the quickselect
     * over their maxima and the looser the bound (about 1.3 k candidates at 2k groups) */
    int64_t gv = GROUP;
    while (seen / (2 * gv) >= 2 * k) gv *= 2;
    const int64_t chunks = seen / (8 * gv), ng = chunks * 8;
    if (ng > k) { /* coarse: the k-th largest group maximum bounds the k-th score from below */
        for (int64_t c = 0; c < chunks; c++) {
            i8 m;
            memcpy(&m, row + c * 8 * gv, sizeof m);
            for (int64_t v = 1; v < gv; v++) {
                i8 x;
                memcpy(&x, row + c * 8 * gv + 8 * v, sizeof x);
                const i8 gt = x > m;
                m = (x & gt) | (m & ~gt);
            }
            memcpy(groups + 8 * c, &m, sizeof m);
        }
        select_largest_i32(groups, ng, k);
        int32_t kth = groups[0];
        for (int64_t g = 1; g < k; g++) kth = groups[g] < kth ? groups[g] : kth;
        bound = kth > bound ? kth : bound;
    }
    int64_t m = 0, s = 0;
    const i8 below = (i8){bound, bound, bound, bound, bound, bound, bound, bound} - 1;
    for (; s + 8 <= seen; s += 8) { /* most keys are below the bound: skip 8 at a time */
        i8 x;
        memcpy(&x, row + s, sizeof x);
        unsigned bits = lanes_set(x > below);
        for (; bits; bits &= bits - 1) {
            const int l = __builtin_ctz(bits);
            cand[m++] = (int64_t)x[l] * 4294967296LL + s + l;
        }
    }
    for (; s < seen; s++)
        if (row[s] >= bound) cand[m++] = (int64_t)row[s] * 4294967296LL + s;
    if (m > k) {
        select_largest_i64(cand, m, k);
        m = k;
    }
    for (int64_t j = 0; j < k; j++) o[j] = j < m ? (cand[j] & 0xFFFFFFFFLL) : -1;
}

/* The tile shapes, for the caller's buffers. */
int64_t dsv32_indexer_key_tile(void) { return KEY_TILE; }
int64_t dsv32_indexer_query_block(void) { return QUERY_BLOCK; }

/* Key tile t of keys (fp32 or bf16 rows k_ld apart, S of them) transposed into dst ([D][KEY_TILE]
 * fp32, zeros past the last key). */
static inline __attribute__((always_inline)) void transpose_tile(const void *keys, int64_t k_ld, int64_t S,
                                                                  int64_t D, int64_t t, float *dst, const int bf16) {
    const int64_t s0 = t * KEY_TILE, nt = S - s0 < KEY_TILE ? S - s0 : KEY_TILE;
    for (int64_t l = 0; l < KEY_TILE; l++)
        for (int64_t d = 0; d < D; d++) dst[d * KEY_TILE + l] = l < nt ? to_float(keys, (s0 + l) * k_ld + d, bf16) : 0.0f;
}

/* Tiles t0 .. t1 of the keys into tiles + t * D * KEY_TILE (what dsv32_indexer_topk_* reads). */
void dsv32_indexer_transpose_f32(const void *keys, int64_t k_ld, int64_t S, int64_t D, int64_t t0, int64_t t1,
                                 float *tiles) {
    for (int64_t t = t0; t < t1; t++) transpose_tile(keys, k_ld, S, D, t, tiles + t * D * KEY_TILE, 0);
}
void dsv32_indexer_transpose_bf16(const void *keys, int64_t k_ld, int64_t S, int64_t D, int64_t t0, int64_t t1,
                                  float *tiles) {
    for (int64_t t = t0; t < t1; t++) transpose_tile(keys, k_ld, S, D, t, tiles + t * D * KEY_TILE, 1);
}

/* Top-k of n queries of one batch row.
 *   q[i][h][:]  = q + i*q_sn + h*q_sh   (D floats; D a multiple of 8, H a multiple of 4)
 *   w[i][h]     = w + i*w_sn + h        (gates, the head scale folded in)
 *   key s       = keys + s*k_ld           (D values: fp32 for dsv32_indexer_topk_f32, bf16 for _bf16)
 *   tiles       = the keys already transposed by dsv32_indexer_transpose_* (what a call with more
 *                 than one block of queries shares), or NULL: each block transposes the tiles it reads
 *   query i sees keys 0 .. min(visible0 + i, S) - 1, minus padded ones (pad[s] != 0; pad may be NULL)
 *   out[i][0..K) = out + i*out_sn: the selected positions, unordered; -1 fills slots left empty.
 * scratch: dsv32_indexer_scratch_bytes(S, D, n) bytes, 8-aligned (allocated by the caller). */
int64_t dsv32_indexer_scratch_bytes(int64_t S, int64_t D, int64_t n) {
    const int64_t width = (S + KEY_TILE - 1) / KEY_TILE * KEY_TILE, rows = n < QUERY_BLOCK ? n : QUERY_BLOCK;
    return (int64_t)sizeof(int64_t) * width + (int64_t)sizeof(float) * KEY_TILE * D +
           (int64_t)sizeof(int32_t) * (rows * width + width / GROUP + 1);
}

static inline __attribute__((always_inline)) void indexer_topk(
    int64_t n, int64_t H, int64_t D, int64_t K, const float *q, int64_t q_sn, int64_t q_sh, const float *w,
    int64_t w_sn, const void *keys, int64_t k_ld, const float *tiles, int64_t S, int64_t visible0,
    const uint8_t *pad, int64_t *out, int64_t out_sn, void *scratch, const int bf16) {
    const int64_t width = (S + KEY_TILE - 1) / KEY_TILE * KEY_TILE;
    int64_t *cand = scratch;
    float *own = (float *)(cand + width);
    int32_t *rows = (int32_t *)(own + KEY_TILE * D);
    int32_t *groups = rows + (n < QUERY_BLOCK ? n : QUERY_BLOCK) * width; /* as dsv32_indexer_scratch_bytes */
    for (int64_t i0 = 0; i0 < n; i0 += QUERY_BLOCK) {
        const int64_t nq = n - i0 < QUERY_BLOCK ? n - i0 : QUERY_BLOCK;
        const int64_t seen_max = visible0 + i0 + nq - 1 < S ? visible0 + i0 + nq - 1 : S;
        for (int64_t s0 = 0; s0 < seen_max; s0 += KEY_TILE) {
            const float *tile = tiles ? tiles + s0 / KEY_TILE * D * KEY_TILE : own;
            if (!tiles) transpose_tile(keys, k_ld, S, D, s0 / KEY_TILE, own, bf16);
            /* the block's first queries may not see this tile yet (causal diagonal) */
            for (int64_t i = s0 - visible0 - i0 + 1 > 0 ? s0 - visible0 - i0 + 1 : 0; i < nq; i++) {
                const int64_t seen = visible0 + i0 + i < S ? visible0 + i0 + i : S;
                score_keys(q + (i0 + i) * q_sn, q_sh, w + (i0 + i) * w_sn, H, D, tile, s0, seen, pad,
                           rows + i * width);
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            const int64_t seen = visible0 + i0 + i < S ? visible0 + i0 + i : S;
            row_topk(rows + i * width, seen, K, groups, cand, out + (i0 + i) * out_sn);
        }
    }
}

#define INDEXER_ARGS                                                                                         \
    int64_t n, int64_t H, int64_t D, int64_t K, const float *q, int64_t q_sn, int64_t q_sh, const float *w,      \
        int64_t w_sn, const void *keys, int64_t k_ld, const float *tiles, int64_t S, int64_t visible0,           \
        const uint8_t *pad, int64_t *out, int64_t out_sn, void *scratch
#define INDEXER_CALL(bf16) \
    indexer_topk(n, H, D, K, q, q_sn, q_sh, w, w_sn, keys, k_ld, tiles, S, visible0, pad, out, out_sn, scratch, bf16)

void dsv32_indexer_topk_f32(INDEXER_ARGS) { INDEXER_CALL(0); }
void dsv32_indexer_topk_bf16(INDEXER_ARGS) { INDEXER_CALL(1); }
