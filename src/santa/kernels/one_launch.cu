// prop in one cooperative launch (issue 24): santa's exact global systematic prop for Hopper (sm_90), CUDA C++.
// santa.kernels.one_launch loads it (as the PTX beside this file, compiled by the driver: no nvcc on the user's
// machine) and launches it on torch's stream; benchmarks/kernels/cuda_stream/stream.cu includes it with its own
// timing kernels. Design, measurements and what each part cost: benchmarks/KERNEL_NOTES.md, runs 14 to 18.
//
// Layouts: q [B, Hkv*G, D] and out [B, Hkv*G, D] contiguous bf16 (fp16 with fp16 caches: the kernels' KV parameter);
// K and V (bf16, fp16 or e4m3; pointers typed bf16 whatever they hold) as a Cache (below): contiguous
// NHD [B, n, Hkv, D], or paged (santa's NHD and HND pages, vLLM's packed rows) through a block table.
// 256 threads per CTA, two CTAs per SM, a persistent grid working a host-built schedule (santa.kernels.one_launch_schedule).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// A wait that never ends is a bug, not a wait. Instead of trapping (which loses the CUDA context and says nothing),
// the first waiter past the limit records what it waited on in hang_report, which the host reads with
// cuModuleGetGlobal after the launch: [0] 1 once written, [1] blockIdx.x, [2] threadIdx.x, [3] the word's address,
// [4] the tag awaited, [5] the word last seen, [6] %globaltimer; then every waiter gives up (hang_abort), so the
// launch ends with a wrong output and a report instead of a trap. The host zeroes both before it launches again.
// C linkage, outside the anonymous namespace, so that cuModuleGetGlobal finds them by these names.
extern "C" {
__device__ unsigned long long hang_report[8];
__device__ unsigned hang_abort;
}

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Where the K and V rows live, strides in elements (the feature stride is 1; every stride a multiple of 8 and both
// bases 16-byte aligned: the host checks). Contiguous (PAGED false): row j of KV head h of sequence b at
// b·page_stride + j·row_stride + h·head_stride, the cache contiguous ([B, n, hkv, D] NHD: row_stride hkv·D, head_stride
// D; [B, hkv, n, D] HND, transformers' static cache: row_stride D, head_stride n·D), so page_stride = n·hkv·D, which
// the stream and the gathers compute as b·n·hkv·D (ptxas allocates the stream's registers differently for
// b·page_stride: 108 against 122, the contiguous path 2-3 % slower at Llama B = 8 and 32 × 32k, H200 2026-12-04). Paged: at page·page_stride + (j mod P)·row_stride + h·head_stride,
// page = table[b·table_stride + j / P], P = 2^page_shift keys per page; a page id outside [0, pages) is never followed
// (its slice reads page 0 instead and publishes NaN statistics, so the group's output is NaN, as the Triton prop's).
struct Cache {
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  long long page_stride, row_stride, head_stride;
  const int* table;
  int table_stride, page_shift, pages;
};

// An fp8 cache's dequantisation scales: one per KV head (k, v: float32 [Hkv]) or one for all (k_scalar, v_scalar)
struct Scales {
  const float* k;
  const float* v;
  float k_scalar, v_scalar;
};

// The offset of key j's row (KV head 0) in sequence b, given the key's page (paged; ignored when contiguous)
template <bool PAGED>
__device__ __forceinline__ size_t row_offset(const Cache& cache, int b, int page, int j) {
  return PAGED ? (size_t)page * cache.page_stride + (size_t)(j & ((1 << cache.page_shift) - 1)) * cache.row_stride
               : (size_t)b * cache.page_stride + (size_t)j * cache.row_stride;
}
// The page holding key j of sequence b, read from the block table and clamped into the pool (the gather's keys lie in
// slices whose pages were checked while streaming: a bad page there made the output NaN and drew nothing)
__device__ __forceinline__ int table_page(const Cache& cache, int b, int j) {
  const int page = __ldg(cache.table + (size_t)b * cache.table_stride + (j >> cache.page_shift));
  return min(max(page, 0), cache.pages - 1);
}

// A kernel's element types (its template parameter KV): bf16 or fp16 caches with q and out of the same type, or e4m3
// caches with bf16 q and out
constexpr int kBf16 = 0, kF16 = 1, kE4m3 = 2;

// One lane's 8 dims of one K or V row as loaded: 16 bytes of bf16 or fp16, or 8 bytes of fp8 (e4m3)
template <int KV> struct RowWord { using type = uint4; };
template <> struct RowWord<kE4m3> { using type = uint2; };

// Two e4m3 values (the low byte first) as f16x2: exact (every e4m3 value is a float16; e4m3's NaN gives NaN)
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short x) {
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
  return r;
}
__device__ __forceinline__ float2 pair_floats(const __half2& x) { return __half22float2(x); }
__device__ __forceinline__ float2 pair_floats(const __nv_bfloat162& x) { return __bfloat1622float2(x); }
// Four pairs of 16-bit values (__half2 or __nv_bfloat162) as 8 floats, in order
template <typename Pair>
__device__ __forceinline__ void pairs_floats(const Pair* pairs, float (&f)[8]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x = pair_floats(pairs[e]);
    f[2 * e] = x.x;
    f[2 * e + 1] = x.y;
  }
}
// One m16n8k16 mma of scores, C += A·B: A holds q's two words a0 (rows 0-7, k 0-7) and a2 (rows 0-7, k 8-15), its rows
// 8-15 zero; B holds a key's two words b0, b1; bf16 or f16 operands, f32 accumulators
template <bool BF16>
__device__ __forceinline__ void score_mma(float& c0, float& c1, float& c2, float& c3, unsigned a0, unsigned a2, unsigned b0,
                                          unsigned b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3) : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3) : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  }
}
// The 8 values of one row word as floats (bf16, fp16: exact; e4m3: exact, through float16)
template <int KV>
__device__ __forceinline__ void row_floats(const typename RowWord<KV>::type& word, float (&f)[8]) {
  if constexpr (KV == kE4m3) {
    const unsigned halves[4] = {e4m3x2_to_f16x2((unsigned short)(word.x & 0xffffu)), e4m3x2_to_f16x2((unsigned short)(word.x >> 16)),
                                e4m3x2_to_f16x2((unsigned short)(word.y & 0xffffu)), e4m3x2_to_f16x2((unsigned short)(word.y >> 16))};
    pairs_floats(reinterpret_cast<const __half2*>(halves), f);
  } else if constexpr (KV == kF16) {
    pairs_floats(reinterpret_cast<const __half2*>(&word), f);
  } else {
    pairs_floats(reinterpret_cast<const __nv_bfloat162*>(&word), f);
  }
}
// The row word of 8 values at element offset `at` of a cache (bf16 or fp16, or e4m3 bytes behind the same pointer)
template <int KV>
__device__ __forceinline__ typename RowWord<KV>::type load_row_word(const __nv_bfloat16* base, size_t at) {
  if constexpr (KV == kE4m3) return __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned char*>(base) + at));
  else return __ldg(reinterpret_cast<const uint4*>(base + at));
}
// A row word whose values are all NaN
template <int KV>
__device__ __forceinline__ typename RowWord<KV>::type nan_row_word() {
  if constexpr (KV == kE4m3) return make_uint2(0x7f7f7f7fu, 0x7f7f7f7fu);
  else if constexpr (KV == kF16) return make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
  else return make_uint4(0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u);
}

// An output value as q's type: bf16, or fp16 where the cache is (KV == kF16; out holds fp16 behind the same pointer)
template <int KV>
__device__ __forceinline__ __nv_bfloat16 out_value(float x) {
  if constexpr (KV == kF16) return __ushort_as_bfloat16(__half_as_ushort(__float2half_rn(x)));
  else return __float2bfloat16(x);
}

// (m, l) ← the merge of two slices' statistics (log2 domain); two empty ones (m = −inf) stay empty
__device__ __forceinline__ void merge_stats(float& m, float& l, float m_o, float l_o) {
  const float m_new = fmaxf(m, m_o);
  l = m_new == -INFINITY ? 0.f : l * exp2f(m - m_new) + l_o * exp2f(m_o - m_new);
  m = m_new;
}


// Streams keys [start, stop) in steps of `step`: two register buffers in turn, the next step's loads issued before
// this step's scores (a loop unrolled by two: a runtime buffer index would put the buffers on the stack)
template <typename Buffer, typename Load, typename Consume>
__device__ __forceinline__ void double_buffered(int start, int stop, int step, Load load, Consume consume) {
  Buffer even, odd;
  if (start < stop) load(even, start);
  for (int base = start; base < stop; base += 2 * step) {
    if (base + step < stop) load(odd, base + step);
    consume(even, base);
    if (base + step >= stop) break;
    if (base + 2 * step < stop) load(even, base + 2 * step);
    consume(odd, base + step);
  }
}

// The same stream phase with the scores on tensor cores (mma.sync m16n8k16, bf16 in, fp32 out): a warp scores 8 keys
// per mma group; lane = 4·n + kslot loads 16 contiguous bytes of key n (dims 32·j + 8·kslot … + 8 for each
// 32-dim block j). The dot product does not care about the order of the dims, so the mma's k index is mapped to
// the dims this lane loaded: its B registers are its own K words, and its A registers (q of head g = lane / 4,
// rows 8-15 zero) are its own q words of the same dims. The C fragment gives lane (g, 2·kslot + {0, 1}): two keys'
// scores of head g, with no shuffles.
//
// KEEP: the slice also keeps what placement needs, as the one-launch design does: every score in shared memory
// (kept, [G][kept_stride(slice_len)] float32: rows padded so that the heads' stores fall in different banks), one
// 8-byte store per lane and mma group, and nothing else: per-subtile maxima and masses kept in the stream (two
// shuffles and four exp2 per group and lane) cost 16 % of the stream at 128k and 44–50 % at d = 64 with batch
// (measured 2026-12-02); the masses are summed from the kept scores after the stream instead.
__host__ __device__ constexpr int kept_stride(int slice_len) { return ((slice_len + 31) / 32) * 32 + 8; }

template <int D, int G, int U, bool KEEP, bool PAGED = false, int KV = kBf16>
__device__ __forceinline__ void mma_stream(const __nv_bfloat16* __restrict__ q, const Cache& cache, int n, int hkv, int b, int h,
                                           int start, int stop, float scale_log2, float* kept, int slice_len, float& m,
                                           float& l, const int* page_ids = nullptr, int page0 = 0) {
  // Streams keys [start, stop) of group (b, h): this lane's running (m, l) of head lane / 4 over the
  // keys it scored; KEEP: every score s also into kept[head · kept_stride(slice_len) + key − start] (shared memory).
  // PAGED: key j's page is page_ids[j / P − page0] (the slice's pages, staged in shared memory by the caller).
  // FP8: K is e4m3 (scale_log2 includes its dequantisation scale); each lane loads 8 bytes per 8 dims, converts them
  // to float16 (exact), and q, times a power of two chosen from the group's largest |q| (exact for every element
  // within 28 binades of it, as the Triton prop's f16_scaled), is float16 too: mma in f16, the same products.
  constexpr int BLOCKS = D / 32;                    // 16-byte loads per key per lane
  constexpr int KEYS_PER_STEP = kWarps * U * 8;
  static_assert(G <= 8, "one mma row per head");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, kslot = lane & 3;
  const bool live_head = g < G;
  const int stride = kept_stride(slice_len);

  uint4 qw[BLOCKS];
#pragma unroll
  for (int j = 0; j < BLOCKS; ++j)
    qw[j] = live_head ? *reinterpret_cast<const uint4*>(q + ((size_t)b * hkv * G + (size_t)h * G + g) * D + j * 32 + kslot * 8)
                      : make_uint4(0, 0, 0, 0);

  if constexpr (KV == kE4m3) {  // q → float16 · 2^−e, e from the largest |q| of the group's heads ([2^14, 2^15) after scaling)
    float largest = 0.f;
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j) {
      float f[8];
      row_floats<kBf16>(qw[j], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) largest = fmaxf(largest, fabsf(f[e]));
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, o));
    const int e = min(max(((__float_as_int(largest) >> 23) & 0xFF) - 127 - 14, -126), 126);
    const float down = __int_as_float((127 - e) << 23), up = __int_as_float((127 + e) << 23);
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j) {
      float f[8];
      row_floats<kBf16>(qw[j], f);
      unsigned w[4];
#pragma unroll
      for (int k2 = 0; k2 < 4; ++k2) {
        const __half2 x = __floats2half2_rn(f[2 * k2] * down, f[2 * k2 + 1] * down);
        w[k2] = *reinterpret_cast<const unsigned*>(&x);
      }
      qw[j] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    scale_log2 *= up;  // exact: a power of two
  }

  // contiguous: the sequence's rows from kb on, sequence b at b·n·hkv·D (Cache above), NHD or HND by the strides
  const size_t row = (size_t)cache.row_stride;
  const size_t head_base = (size_t)h * cache.head_stride + (PAGED ? 0 : (size_t)b * n * hkv * D);
  const __nv_bfloat16* kb = cache.k + head_base + kslot * 8;
  // FP8: the same element offsets, in bytes from the cache's base (kb above steps in bf16 elements)
  const size_t kb_elements = head_base + kslot * 8;
  m = -INFINITY;
  l = 0.f;

  using Word = typename RowWord<KV>::type;
  auto load = [&](Word (&dst)[U][BLOCKS], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + (u * kWarps + warp) * 8 + g;  // lane / 4 is also the key within the group of 8
      size_t at = (size_t)key * row;
      if constexpr (PAGED) at = key < stop ? row_offset<true>(cache, b, page_ids[(key >> cache.page_shift) - page0], key) : 0;
#pragma unroll
      for (int j = 0; j < BLOCKS; ++j) {
        if constexpr (KV == kE4m3) dst[u][j] = key < stop ? load_row_word<kE4m3>(cache.k, kb_elements + at + j * 32) : make_uint2(0, 0);
        else dst[u][j] = key < stop ? __ldg(reinterpret_cast<const uint4*>(kb + at + j * 32)) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto consume = [&](const Word (&src)[U][BLOCKS], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
#pragma unroll
      for (int j = 0; j < BLOCKS; ++j) {
        if constexpr (KV == kE4m3) {  // K as f16 pairs (exact), q as loaded (f16)
          const unsigned k0 = e4m3x2_to_f16x2((unsigned short)(src[u][j].x & 0xffffu)),
                         k1 = e4m3x2_to_f16x2((unsigned short)(src[u][j].x >> 16)),
                         k2 = e4m3x2_to_f16x2((unsigned short)(src[u][j].y & 0xffffu)),
                         k3 = e4m3x2_to_f16x2((unsigned short)(src[u][j].y >> 16));
          score_mma<false>(c0, c1, c2, c3, qw[j].x, qw[j].y, k0, k1);
          score_mma<false>(c0, c1, c2, c3, qw[j].z, qw[j].w, k2, k3);
        } else {  // q and K fp16 or bf16 as loaded
          score_mma<KV == kBf16>(c0, c1, c2, c3, qw[j].x, qw[j].y, src[u][j].x, src[u][j].y);
          score_mma<KV == kBf16>(c0, c1, c2, c3, qw[j].z, qw[j].w, src[u][j].z, src[u][j].w);
        }
      }
      const int group0 = base + (u * kWarps + warp) * 8;  // the mma group's first key
      const int key0 = group0 + 2 * kslot;                // the C columns of this lane: keys key0, key0 + 1
      const float s0 = key0 < stop ? c0 * scale_log2 : -INFINITY;
      const float s1 = key0 + 1 < stop ? c1 * scale_log2 : -INFINITY;
      if constexpr (KEEP) {
        if (live_head && key0 + 1 < stop) {  // key0 − start and the stride are even: one 8-byte store
          *reinterpret_cast<float2*>(kept + g * stride + key0 - start) = make_float2(s0, s1);
        } else if (live_head && key0 < stop) {
          kept[g * stride + key0 - start] = s0;
        }
      }
      const float m_new = fmaxf(m, fmaxf(s0, s1));
      if (m_new != -INFINITY) {
        l = l * exp2f(m - m_new) + exp2f(s0 - m_new) + exp2f(s1 - m_new);
        m = m_new;
      }
    }
  };

  using Buffer = Word[U][BLOCKS];
  double_buffered<Buffer>(start, stop, KEYS_PER_STEP, load, consume);
}

// Dynamic shared memory of a KEEP stream for G heads and slice_len keys, in floats: the scores, then one float per
// 8-key subtile (the prop kernel's subtile masses and their prefix; the keep_* check kernels' nothing)
__host__ __device__ constexpr int kept_floats(int heads, int slice_len) {
  return heads * (kept_stride(slice_len) + (slice_len + 7) / 8);
}


// The warp's inclusive prefix sum of x in lane order (returned) and its exclusive one (excl): a fixed shuffle tree, so
// the same inputs give the same floats on every CTA
__device__ __forceinline__ float warp_scan(float x, float& excl) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float other = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += other;
  }
  excl = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) excl = 0.f;
  return x;
}

// Words tagged with the launch they belong to: (tag << 32) | float bits, one 8-byte store or load (single-copy atomic),
// so a reader that sees the tag it waits for also sees the value: no fence, no counter, no second read.
__device__ __forceinline__ void store_tagged(unsigned long long* p, float x, unsigned tag) {
  const unsigned long long word = ((unsigned long long)tag << 32) | __float_as_uint(x);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(word) : "memory");
}
__device__ __forceinline__ unsigned long long load_word(const unsigned long long* p) {
  unsigned long long word;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(word) : "l"(p) : "memory");
  return word;
}
// The value of *p once it carries `tag` (spins until then), given a first load already in flight
__device__ __forceinline__ float await_tagged(const unsigned long long* p, unsigned long long word, unsigned tag) {
  for (int spins = 0; (unsigned)(word >> 32) != tag; ++spins) {
    if ((spins & 1023) == 1023 && *(volatile unsigned*)&hang_abort) break;
    if (spins == 1 << 21) {  // ~1 s
      if (atomicCAS(&hang_report[0], 0ull, 1ull) == 0ull) {
        long long ns;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
        hang_report[1] = blockIdx.x;
        hang_report[2] = threadIdx.x;
        hang_report[3] = (unsigned long long)p;
        hang_report[4] = tag;
        hang_report[5] = word;
        hang_report[6] = (unsigned long long)ns;
        __threadfence();
      }
      atomicExch(&hang_abort, 1u);
      break;
    }
    __nanosleep(16);
    word = load_word(p);
  }
  return __uint_as_float((unsigned)word);
}
// dst[i] = the values of words[i] for i < count once they carry `tag`: all threads, two loads in flight each
__device__ __forceinline__ void gather_tagged(float* dst, const unsigned long long* words, int count, unsigned tag) {
  for (int i = threadIdx.x; i < count; i += 2 * kThreads) {
    const int j = i + kThreads;
    const unsigned long long wi = load_word(words + i), wj = j < count ? load_word(words + j) : 0ull;
    dst[i] = await_tagged(words + i, wi, tag);
    if (j < count) dst[j] = await_tagged(words + j, wj, tag);
  }
}

// Loads the caller consumes long after issuing them, as volatile asm so that the compiler neither sinks them to their
// use nor moves their consumer up to them: a group's epoch (L2-coherent) and a schedule entry (read-only)
__device__ __forceinline__ unsigned load_epoch(const unsigned* p) {
  unsigned x;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(x) : "l"(p));
  return x;
}
__device__ __forceinline__ int4 load_work(const int4* p) {
  int4 w;
  asm volatile("ld.global.nc.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "l"(p));
  return w;
}
// The keys a group's sequence holds as given: seq_lens[b] (n, the cache's keys per sequence, where seq_lens is nullptr;
// the caller clamps it to [0, n] and makes the sequence's output NaN if it lies outside). Read-only for the launch (a
// decode step's lengths change between launches, never during one).
__device__ __forceinline__ int load_len(const int* seq_lens, int group, int hkv, int n) {
  if (seq_lens == nullptr) return n;
  int x;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(x) : "l"(seq_lens + group / hkv));
  return x;
}

// Sequence b's first visible key as given, starts[b] (0 where starts is nullptr: left padding, windows; prop_slice
// clamps it to [0, len] and makes the output NaN if it lies outside).
__device__ __forceinline__ int load_first(const int* starts, int b) {
  if (starts == nullptr) return 0;
  int x;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(x) : "l"(starts + b));
  return x;
}

// santa's uniform for counter (c0, c1, c2, c3) under a 64-bit key: Philox4x32-10 as Triton's tl.philox (key halves
// lo, hi; the same round and key constants), its first word mapped to [0, 1) as tl.uint_to_uniform_float does
// (santa.kernels._common.philox_uniform; santa.kernels.reference.philox_uniforms reproduces it in torch)
__device__ __forceinline__ float philox_uniform(unsigned long long key, unsigned c0, unsigned c1, unsigned c2, unsigned c3) {
  unsigned k0 = (unsigned)key, k1 = (unsigned)(key >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned a = c0, b = c2;
    c0 = __umulhi(0xCD9E8D57u, b) ^ c1 ^ k0;
    c2 = __umulhi(0xD2511F53u, a) ^ c3 ^ k1;
    c1 = 0xCD9E8D57u * b;
    c3 = 0xD2511F53u * a;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const int x = (int)c0;
  return (float)(x < 0 ? -x - 1 : x) * 4.6566127342e-10f;
}
// A launch's randomness, as santa's kernels draw it (santa.kernels._common.call_uniforms): the key is seeds[b] (one per
// sequence) or seed; the counter (positions[b], head_offset + head, 0) where positions are given (int64, or int32 where
// positions_64 is 0: a draw that does not depend on the batch row; head_offset: the call's first head in the model,
// tensor parallelism), else (offset, b·H + head, 0), the offset read from offset_ptr where given (graph replay).
// uniforms (float32 [B, H]) replaces all of it where given (the benchmarks' checks).
struct Draw {
  const float* uniforms;
  unsigned long long seed;
  const long long* seeds;
  unsigned long long offset;
  const long long* offset_ptr;
  const void* positions;
  int positions_64;
  int head_offset;
};
// The comb offset U of query head `head` of sequence b
__device__ __forceinline__ float comb_offset(const Draw& draw, int b, int heads, int head) {
  if (draw.uniforms != nullptr) return __ldg(draw.uniforms + (size_t)b * heads + head);
  const unsigned long long key = draw.seeds != nullptr ? (unsigned long long)__ldg(draw.seeds + b) : draw.seed;
  if (draw.positions != nullptr) {
    const long long pos = draw.positions_64 ? __ldg(static_cast<const long long*>(draw.positions) + b)
                                            : (long long)__ldg(static_cast<const int*>(draw.positions) + b);
    return philox_uniform(key, (unsigned)pos, (unsigned)((unsigned long long)pos >> 32), (unsigned)(draw.head_offset + head), 0u);
  }
  const unsigned long long off = draw.offset_ptr != nullptr ? (unsigned long long)__ldg(draw.offset_ptr) : draw.offset;
  return philox_uniform(key, (unsigned)off, (unsigned)(off >> 32), (unsigned)(b * heads + head), 0u);
}

// The key a sampled word names, once it carries `tag`; clamped into [0, n): a wait that gave up (hang_report) returns
// whatever the word held, never an address past the cache
__device__ __forceinline__ int sampled_key(const unsigned long long* at, unsigned long long word, unsigned tag, int n) {
  return min(max(__float_as_int(await_tagged(at, word, tag)), 0), n - 1);
}
// The gather's row words raw[r] (item i0 + r · kThreads, items below `items`) as floats, into kept[item][8]
template <int KV, int N>
__device__ __forceinline__ void store_rows(const typename RowWord<KV>::type (&raw)[N], int i0, int items, float* kept) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const int i = i0 + r * kThreads;
    if (i >= items) continue;
    float f[8];
    row_floats<KV>(raw[r], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) kept[(size_t)i * 8 + e] = f[e];
  }
}

// The gather of a sequence the budget covers (prop_slice's covered branch, kept out of line: the sampled path's code
// stays as it was): kept row i = (vector, j) is V row first + j scaled by word j of its head, S·p; rows j ≥ run_keys (the
// run's keys, len − first) are zeros (NaN for a head with a NaN mass: NaN or +inf scores).
template <int D, bool PAGED, int KV>
__device__ __noinline__ void covered_rows(const Cache cache, const unsigned long long* __restrict__ sampled,
                                          float* kept, const float* head_mass, size_t head0, int b, int h,
                                          int vec0, int owned, int budget, int first, int len, unsigned tag) {
  const int run_keys = len - first;
  for (int i = threadIdx.x; i < owned * budget; i += kThreads) {
    const int vec = vec0 + i / budget, head = vec / (D / 8), j = i % budget;
    const float mass = head_mass[head];
    float row[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) row[e] = mass == mass ? 0.f : NAN;
    if (mass > 0.f && j < run_keys) {
      const unsigned long long* at = sampled + (head0 + head) * budget + j;
      const float weight = await_tagged(at, load_word(at), tag);
      const int key = first + j;
      const size_t at_row = row_offset<PAGED>(cache, b, PAGED ? table_page(cache, b, key) : 0, key);
      float f[8];
      row_floats<KV>(load_row_word<KV>(cache.v, at_row + (size_t)h * cache.head_stride + (vec % (D / 8)) * 8), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) row[e] = f[e] * weight;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) kept[(size_t)i * 8 + e] = row[e];
  }
}

// A live CTA's gather of sampled rows (LIVE, not covered), summed in registers: its `owned` output vectors from vec0,
// T threads each (T = the largest power of two ≤ 256 / owned, at most 32: a vector's threads lie in one warp). Thread
// (vector, p) loads the rows of samples p, p + T, p + 2T, … (their resolved pool rows, eight loads in flight) and sums
// their 8 floats in that order; then the T sums by a butterfly of shuffles (every lane the same bits: a + b = b + a),
// out = Σ / S, NaN for a head with a NaN mass, zeros without mass. No rows staged in shared memory, no chunks (ncu at
// Llama 64 × 512 paged: staging, chunk barriers and per-element index divisions held most of the gather's 46 % of the
// stall samples, 2026-12-06).
template <int D, bool PAGED, int KV>
__device__ __forceinline__ void live_gather(const Cache& cache, const Scales& scales, const int* resolved,
                                            const float* head_mass, __nv_bfloat16* __restrict__ out, size_t head0, int b,
                                            int h, int n, int hkv, int vec0, int owned, int head_lo, int budget) {
  constexpr int kInFlight = 8;
  int t_log2 = 0;
  while (t_log2 < 5 && (owned << (t_log2 + 1)) <= kThreads) ++t_log2;
  const int T = 1 << t_log2, vl = threadIdx.x >> t_log2, p = threadIdx.x & (T - 1);
  const int vec = vec0 + vl, head = vec / (D / 8);
  const float mass = vl < owned ? head_mass[head] : 0.f;
  const int* rows = resolved + (head - head_lo) * budget;
  const size_t head_at = (size_t)h * cache.head_stride + (vec % (D / 8)) * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (vl < owned && mass > 0.f)
    for (int m0 = p; m0 < budget; m0 += kInFlight * T) {
      typename RowWord<KV>::type raw[kInFlight];
#pragma unroll
      for (int r = 0; r < kInFlight; ++r) {
        const int m = m0 + r * T;
        raw[r] = {};
        if (m < budget) {
          const int row = rows[m];
          const size_t at = PAGED ? row_offset<true>(cache, b, row >> cache.page_shift, row)
                                  : (size_t)b * n * hkv * D + (size_t)row * cache.row_stride;
          raw[r] = load_row_word<KV>(cache.v, at + head_at);
        }
      }
#pragma unroll
      for (int r = 0; r < kInFlight; ++r) {
        if (m0 + r * T >= budget) continue;
        float f[8];
        row_floats<KV>(raw[r], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += f[e];
      }
    }
  for (int o = 1; o < T; o <<= 1)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  if (vl < owned && p == 0) {
    const float v_scale = KV == kE4m3 ? (scales.v != nullptr ? __ldg(scales.v + h) : scales.v_scalar) : 1.f;
    __align__(16) __nv_bfloat16 value[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      value[e] = out_value<KV>(mass == mass ? (mass > 0.f ? acc[e] / (float)budget * v_scale : 0.f) : NAN);
    __nv_bfloat16* at = out + head0 * D + (size_t)vec * 8;
    if ((reinterpret_cast<uintptr_t>(at) & 15u) == 0u)
      *reinterpret_cast<uint4*>(at) = *reinterpret_cast<const uint4*>(value);
    else  // a contiguous out at an offset that is not a multiple of 8 elements (a view): element by element
#pragma unroll
      for (int e = 0; e < 8; ++e) at[e] = value[e];
  }
}

// prop in one launch (issue 24), fifth version. Exact global systematic sampling as santa's two-launch prop, for
// contiguous NHD bf16 K and V of n keys per sequence, of which sequence b holds seq_lens[b] (read on the device; all n
// where seq_lens is nullptr), with the uniforms given ([B, Hkv·G] float32, santa.kernels.reference.philox_uniforms) or
// drawn here as santa's positional draw (comb_offset): one persistent grid (C, Hkv, B), every CTA resident (a cooperative
// launch), a CTA per slice of a group's keys. The CTAs of a group exchange data twice, through words tagged with the
// launch (tag = epoch[group] + 1, read at the start; CTA 0 stores it back once every CTA has published): no atomics.
//   stream:  mma_stream with KEEP: scores and 8-key subtiles' (m_i, ℓ_i) in shared memory, the lanes' (m, l) over
//            their subtiles. The slice's (m_c, w_c) per head from those (shuffles, then eight warps by a fixed tree),
//            published tagged at once; then, while the other CTAs' stats travel, per head (warp g) the subtiles'
//            masses W_i = ℓ_i·2^(m_i − m_c) and their inclusive prefix Cum_i in place of ℓ_i.
//   place:   read the group's C × G tagged (m, w) (waiting for those not yet there). Warp g, head g: m* = max m_c,
//            W_c = w_c·2^(m_c − m*), F = their inclusive prefix, computed by the same lanes in the same order on every
//            CTA (so F(c) is bit for bit the same number where slice c and slice c + 1 use it: every comb point
//            falls in exactly one slice); P_c = S·F(c)/F(C−1) (P_{C−1} = S exactly). Comb point m (position m + U)
//            is this slice's iff P_{c−1} − m ≤ U < P_c − m (santa's pass 2 test); there t = (U − (P_{c−1} − m)) /
//            (P_c − P_{c−1})·Cum_last, its subtile the first with Cum_i > t (bisection; past the last subtile with
//            mass: that one), its key the first of the subtile with Cum_{i−1} + Σ_{k'≤k} 2^(s_k' − m_c) > t (else
//            the subtile's last key with mass). The key is written, tagged, as sample m of head g.
//   gather:  CTA c owns V_c = ⌈G·D/8 / C⌉ of the group's 8-element output vectors: for each it reads the S tagged
//            keys of the vector's head (waiting for those not yet there), loads those S V rows' 16 bytes, and sums
//            them by a fixed tree (16 threads per output, 8 samples each in order, then shuffles): out = Σ / S.
//            Each sampled V sector is read once, by the CTA that owns it; no partial sums travel.
// STAGE 1 stops after publishing, STAGE 2 after the keys (timing the phases; their outputs are not checked); marks,
// where given, get each CTA's clocks at the phase boundaries (0 start, 1 streamed, 2 published, 3 stats read,
// 4 first points placed, 5 keys written, 6 V rows gathered, 7 done).
// Groups beyond one wave run in rounds (SANTA_PROP_ONE_LAUNCH below). A slice's keys follow the sequence's length:
// slice c of C covers [c·⌈len/C⌉, (c+1)·⌈len/C⌉) ∩ [0, len); the schedule's slice_len = ⌈n/C⌉ bounds it (shared memory).
// A sequence the budget covers (len ≤ S) is computed exactly in the same launch: key j's weight S·p_j travels as its
// word j, the gather reads row j and scales it, and the sum / S is Σ p_j v_j (a NaN word: a NaN output, as in the
// Triton kernels' covered-sequence launch, santa.kernels.exact).
// PAGED: the slice's page ids are staged in shared memory before its stream (checked there: a page outside the pool
// poisons the slice's statistics, and so the group's output, and is never followed); the gather reads each sampled
// key's page from the table.
// starts (per-sequence first keys: left padding, windows) shift the run: its slices cut [first, len), and the
// covered rule counts its live keys. Not handled (the Triton kernel does it): fp32 caches.
template <int D, int G, int U, int STAGE, bool PAGED, int KV, bool LIVE>
__device__ __forceinline__ void prop_slice(const __nv_bfloat16* __restrict__ q, const Cache& cache, const Scales& scales,
                                           const Draw& draw,
                                           const int* __restrict__ seq_lens, const int* __restrict__ starts,
                                           __nv_bfloat16* __restrict__ out, int* __restrict__ counts,
                                           unsigned long long* __restrict__ slice_stats,
                                           unsigned long long* __restrict__ sampled, unsigned* __restrict__ epoch,
                                           long long* __restrict__ marks, int n, int hkv, int group, int c,
                                           int slices, int slice_len, int stats_slots, int slot, float scale_log2,
                                           int budget, unsigned epoch_seen, int len, int next_group,
                                           unsigned& next_epoch_seen, int& next_len) {
  // epoch_seen: epoch[group] as loaded by the caller (load_epoch), consumed only after the stream; next_group: the
  // group of this CTA's next work item (−1: none), whose epoch this item loads once it has streamed, so that the
  // load's latency hides behind this item's sampling phases (it is safe this early: a group's epoch changes only once
  // every slice has published, and this CTA has not yet published for next_group)
  // marks (nullptr: none): per schedule slot, 8 pairs (globaltimer ns, clock64) at the phase boundaries, then
  // (the SM's id, 0), by thread 0
  auto mark = [&](int i) {
    if (marks != nullptr && threadIdx.x == 0) {
      long long ns;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
      long long* at = marks + (size_t)slot * 18 + 2 * i;
      at[0] = ns;
      at[1] = clock64();
    }
  };
  mark(0);
  if (marks != nullptr && threadIdx.x == 0) {  // pair 8: the SM this CTA runs on
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    marks[(size_t)slot * 18 + 16] = smid;
  }
  extern __shared__ float smem[];  // kept_floats(G, slice_len), the group's stats [G][C][2], then (PAGED) the slice's pages
  __shared__ float warp_m[kWarps][8], warp_l[kWarps][8], slice_max[8], head_mass[8];
  __shared__ int last_live_sub[8], bad_page, run_first;  // run_first: the clamped first key, for the covered branch
  constexpr int VECS = G * D / 8;  // the group's 8-element output vectors
  const int h = group % hkv, b = group / hkv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // the sequence's visible keys are [first, len): len = seq_lens[b], first = starts[b] (0 where starts is nullptr: a
  // left-padded or windowed run, as the Triton prop's checked_first_key). A length outside [0, n], or a first key
  // outside [0, len], is clamped for every read and makes the sequence's output NaN (it samples nothing).
  // This slice of the run's run_keys = len − first keys: ⌈run_keys / C⌉ keys each from first (the schedule's slice_len =
  // ⌈n / C⌉ sizes shared memory); slice boundaries and so the float32 CDF's order count from first
  const int raw_first = load_first(starts, b);
  bool bad_len = len < 0 || len > n;
  len = min(max(len, 0), n);
  bad_len = bad_len || raw_first < 0 || raw_first > len;
  const int first = min(max(raw_first, 0), len), run_keys = len - first;
  // kept in shared memory for the covered branch, not in a register across the slice (the kernels sit at 128 registers;
  // the previous item's readers are past the caller's __syncthreads, the readers here past the stream's)
  if (threadIdx.x == 0) run_first = first;
  const bool covered = !bad_len && run_keys <= budget;  // exact attention (santa.kernels.exact's rule, on the live keys), in this launch
  // a live launch (issue 39) cuts whole 256-key granules, as santa.kernels.one_launch_schedule.live_schedule does
  const int per_slice = LIVE ? ((run_keys + 255) / 256 + slices - 1) / slices * 256 : (run_keys + slices - 1) / slices;
  const int start = first + min(c * per_slice, run_keys), stop = min(len, start + per_slice), keys = stop - start;
  const int stride = kept_stride(slice_len), n_sub = (slice_len + 7) / 8, live_subs = (keys + 7) / 8;
  float* kept = smem;
  float* cum = kept + G * stride;  // the subtiles' masses W_i, then their prefix Cum_i
  float* group_stats = smem + kept_floats(G, slice_len);
  const size_t head0 = (size_t)b * hkv * G + (size_t)h * G;  // the group's first query-head row
  unsigned long long* group_words = slice_stats + (size_t)group * G * stats_slots * 2;  // [G][slices][2] of the group
  const float uni = warp < G ? comb_offset(draw, b, hkv * G, h * G + warp) : 0.f;  // used after the stream
  // PAGED: the pages of keys [start, stop), staged after the group's stats (a page outside the pool: page 0, and bad_page)
  int* page_ids = reinterpret_cast<int*>(group_stats + G * slices * 2);
  const int page0 = PAGED ? start >> cache.page_shift : 0;
  if constexpr (PAGED) {
    const int count = stop > start ? ((stop - 1) >> cache.page_shift) - page0 + 1 : 0;
    if (threadIdx.x == 0) bad_page = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += kThreads) {
      const int page = __ldg(cache.table + (size_t)b * cache.table_stride + page0 + i);
      const bool inside = page >= 0 && page < cache.pages;
      page_ids[i] = inside ? page : 0;
      if (!inside) bad_page = 1;
    }
    __syncthreads();
  }

  // ---- stream; the slice's (m_c, w_c) per head, published at once
  float m, l;
  if constexpr (KV == kE4m3) scale_log2 *= scales.k != nullptr ? __ldg(scales.k + h) : scales.k_scalar;  // K's dequantisation scale
  mma_stream<D, G, U, true, PAGED, KV>(q, cache, n, hkv, b, h, start, stop, scale_log2, kept, slice_len, m, l, page_ids, page0);
#pragma unroll
  for (int o = 1; o < 4; o <<= 1)  // the 4 lanes of head lane / 4
    merge_stats(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
  if ((lane & 3) == 0) {
    warp_m[warp][lane >> 2] = m;
    warp_l[warp][lane >> 2] = l;
  }
  __syncthreads();
  mark(1);  // the slice streamed
  // the tag is computed only here: until 50cea93 `tag = __ldcg(epoch + group) + 1` sat before the stream and ptxas
  // placed the add there, so every item waited out one L2/HBM round trip before its first K load (ncu, 8k: 3 % of
  // the kernel's stall samples on that add, 2026-12-03). The wait is not wholly gone: ptxas gives these loads and the
  // K loads one scoreboard, and the next round's table load, which reuses this entry's registers, still waits for
  // the epoch before the first K load (ncu at 263c589); moving both into shared memory by cp.async measured slower on
  // the batched shapes (v13, KERNEL_NOTES run 17)
  const unsigned tag = epoch_seen + 1u;
  next_epoch_seen = next_group >= 0 ? load_epoch(epoch + next_group) : 0u;
  next_len = next_group >= 0 ? load_len(seq_lens, next_group, hkv, n) : 0;
  const bool poisoned = PAGED && bad_page;  // a page outside the pool: NaN mass for every head of the group
  if (warp < G) {
    const int g = warp;
    float mc = lane < kWarps ? warp_m[lane][g] : -INFINITY, wc = lane < kWarps ? warp_l[lane][g] : 0.f;
#pragma unroll
    for (int o = 1; o < kWarps; o <<= 1)  // the eight warps' pairs by a fixed tree
      merge_stats(mc, wc, __shfl_xor_sync(0xffffffffu, mc, o), __shfl_xor_sync(0xffffffffu, wc, o));
    mc = __shfl_sync(0xffffffffu, mc, 0);  // lanes 8–31 merged only their own empty pairs
    wc = __shfl_sync(0xffffffffu, wc, 0);
    if (lane < 2) store_tagged(group_words + (g * slices + c) * 2 + lane, lane == 0 ? mc : (poisoned ? NAN : wc), tag);
    if (lane == 0) slice_max[g] = mc;
  }
  __syncthreads();
  // while the stats travel: every key's u = 2^(s − m_c), stored over its score (placement reads u, no exp2 in its
  // chain), and the subtiles' masses W_i = Σ u over their keys in order (all threads); then per head (warp g) their
  // inclusive prefix, four subtiles per lane per round (eight timed slower)
  for (int idx = threadIdx.x; idx < G * live_subs; idx += kThreads) {
    const int head = idx / live_subs, i = idx % live_subs;
    const float mch = slice_max[head];
    float4* row = reinterpret_cast<float4*>(kept + head * stride + i * 8);
    const float4 lo4 = row[0], hi4 = row[1];
    float u[8] = {lo4.x, lo4.y, lo4.z, lo4.w, hi4.x, hi4.y, hi4.z, hi4.w};
    float w = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      u[e] = i * 8 + e < keys && mch != -INFINITY ? exp2f(u[e] - mch) : 0.f;
      w += u[e];
    }
    row[0] = make_float4(u[0], u[1], u[2], u[3]);
    row[1] = make_float4(u[4], u[5], u[6], u[7]);
    cum[head * n_sub + i] = w;
  }
  __syncthreads();
  if (warp < G) {
    const int g = warp;
    float carry = 0.f;
    int live = -1;
    for (int base = 0; base < live_subs; base += 128) {
      const int i0 = base + lane * 4;
      float run[4], total = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + e;
        const float w = i < live_subs ? cum[g * n_sub + i] : 0.f;
        if (w > 0.f) live = i;
        total += w;
        run[e] = total;
      }
      float excl;
      const float incl = warp_scan(total, excl);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (i0 + e < live_subs) cum[g * n_sub + i0 + e] = carry + (excl + run[e]);
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) live = max(live, __shfl_xor_sync(0xffffffffu, live, o));
    if (lane == 0) last_live_sub[g] = live;
  }
  mark(2);  // published (and the prefix built)
  if constexpr (STAGE == 1) return;

  // ---- the group's stats, once every CTA has published them
  gather_tagged(group_stats, group_words, G * slices * 2, tag);
  __syncthreads();
  // Only now has this CTA seen every slice's words, so every CTA of the group has read the old epoch: slice 0 may
  // store the new one. (Until 098da22 thread 0 stored it right after its own share of the words, which can be its
  // own slice's alone: a CTA of the group that started its item later, still finishing an earlier round, then read
  // the new epoch, published under the next tag and everyone waited forever. Short slices after uneven rounds open
  // that window: SmolLM2 B = 64's staggered C = 16 plan, 249-key slices, hung in every call of 2026-12-03.)
  if (c == 0 && threadIdx.x == 0) epoch[group] = tag;
  mark(3);  // the group's stats here

  // ---- place: warp g writes the keys of head g's comb points that fall in this slice
  const int g = warp;
  if (g < G) {
    const float* st = group_stats + g * slices * 2;
    const int per = (slices + 31) / 32, lo = min(slices, lane * per), hi = min(slices, lo + per);
    float m_star = -INFINITY;
    for (int i = lo; i < hi; ++i) m_star = fmaxf(m_star, st[2 * i]);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m_star = fmaxf(m_star, __shfl_xor_sync(0xffffffffu, m_star, o));
    const float m_ref = m_star == -INFINITY ? 0.f : m_star;
    float chunk = 0.f;
    for (int i = lo; i < hi; ++i) chunk += st[2 * i + 1] * exp2f(st[2 * i] - m_ref);
    float excl;
    warp_scan(chunk, excl);
    // F(i) = excl + Σ_{lo ≤ i' ≤ i} W_i' on the lane that owns i: the same value wherever it is used
    float below = 0.f, through = 0.f, last = 0.f, run = 0.f;
    for (int i = lo; i < hi; ++i) {
      run += st[2 * i + 1] * exp2f(st[2 * i] - m_ref);
      const float f = excl + run;
      if (i == c - 1) below = f;
      if (i == c) through = f;
      if (i == slices - 1) last = f;
    }
    below = __shfl_sync(0xffffffffu, below, c > 0 ? (c - 1) / per : 0);
    through = __shfl_sync(0xffffffffu, through, c / per);
    const float z = __shfl_sync(0xffffffffu, last, (slices - 1) / per);
    const float s_f = (float)budget;
    const float p_lo = c == 0 ? 0.f : (below / z) * s_f;
    const float p_hi = (through / z) * s_f;  // S exactly for the last slice (z / z = 1), as pass 2's P_last
    const float* cg = cum + g * n_sub;
    const float* ug = kept + g * stride;  // u = 2^(s − m_c) per key (above)
    const int live_sub = last_live_sub[g];
    const float total = live_sub >= 0 ? cg[live_subs - 1] : 0.f;
    const int first_m = max(0, (int)ceilf(p_lo - uni) - 1), last_m = min(budget - 1, (int)ceilf(p_hi - uni));
    // a sequence the budget covers (run_keys ≤ S, santa's one rule: exact) writes, as "sample" j, key first + j's weight
    // S·p (the gather reads that row itself and scales it by the word); its keys are this slice's [start, stop)
    if (covered) {
      const float slice_scale = exp2f(st[2 * c] - m_ref) * s_f / z;  // u_j · this = S · p_j
      for (int jj = lane; jj < keys && z > 0.f; jj += 32) {
        if (counts != nullptr) atomicAdd(&counts[(head0 + g) * n + start + jj], 1);
        store_tagged(sampled + (head0 + g) * budget + start - run_first + jj, ug[jj] * slice_scale, tag);
      }
    } else
    for (int m0 = first_m; m0 <= last_m && z > 0.f && !bad_len; m0 += 32) {  // a NaN z (poisoned row) places nothing
      const int mm = m0 + lane;
      const float mf = (float)mm;
      if (mm <= last_m && (p_lo - mf) <= uni && uni < (p_hi - mf)) {
        int key = 0;  // a point in a slice without mass cannot happen (its W_c is 0); key 0 keeps it defined
        if (total > 0.f) {
          const float width = p_hi - p_lo;
          const float t = (uni - (p_lo - mf)) / (width > 0.f ? width : 1.f) * total;
          int pos = 0;  // the first subtile with Cum_i > t: #{i : Cum_i <= t} (Cum is non-decreasing)
          for (int step = 1 << (31 - __clz(live_subs)); step > 0; step >>= 1)
            if (pos + step <= live_subs && cg[pos + step - 1] <= t) pos += step;
          pos = min(pos, live_sub);
          const float before = pos == 0 ? 0.f : cg[pos - 1];
          float sum = 0.f;
          int chosen = -1, live_key = pos * 8;
          for (int j = pos * 8; j < min(keys, pos * 8 + 8); ++j) {
            const float u = ug[j];
            sum += u;
            if (u > 0.f) live_key = j;
            if (chosen < 0 && before + sum > t) chosen = j;
          }
          key = start + (chosen >= 0 ? chosen : live_key);
        }
        if (counts != nullptr) atomicAdd(&counts[(head0 + g) * n + key], 1);
        store_tagged(sampled + (head0 + g) * budget + mm, __int_as_float(key), tag);
      }
      if (m0 == first_m) mark(4);  // head 0's first points placed
    }
    // for the gather (a row without mass has no samples to wait for) and the output (NaN: NaN or +inf scores, or a bad length)
    if (lane == 0) head_mass[g] = bad_len ? NAN : z;
  }
  mark(5);  // head 0's keys written
  if constexpr (STAGE == 2) return;

  // ---- gather: this CTA's output vectors, S rows' 16 bytes each, from the tagged keys
  const int per_cta = (VECS + slices - 1) / slices, cta_vec0 = c * per_cta;
  const int cta_owned = max(0, min(VECS, cta_vec0 + per_cta) - cta_vec0);
  // a host plan sizes shared memory for all its rows [owned][S][8]; a live slice (any C_b, down to 1) sums its sampled
  // rows in registers (live_gather) and stages only a covered sequence's weighted rows, in chunks of as many vectors as
  // the CTA's dynamic shared memory holds (live_limits: at least one vector)
  int chunk = cta_owned;
  // LIVE: each sample's V row is found once, before the gather (its key from the tagged word, then its page: two
  // dependent loads, all samples' in flight together), not once per output vector; live_gather then only loads rows.
  // resolved[(head − head_lo) · S + m] = sample m's pool row (page << page_shift | its place in the page; contiguous:
  // the key), at the end of dynamic shared memory; read only for heads with mass (ncu, Llama 64 × 2k paged: the
  // gather's three dependent loads per vector and sample held 33 % of the warps' stall samples)
  const int head_lo = cta_vec0 / (D / 8);
  int* resolved = nullptr;
  if constexpr (LIVE) {
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    const int heads_owned = cta_owned > 0 ? (cta_vec0 + cta_owned - 1) / (D / 8) - head_lo + 1 : 0;
    const int count = covered ? 0 : heads_owned * budget;
    resolved = reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + dynamic_bytes) - count;
    chunk = max(1, (int)((dynamic_bytes - 4u * (unsigned)count) / (32u * (unsigned)budget)));
    __syncthreads();  // the placement's scores are read: the end of shared memory is free
    for (int p0 = threadIdx.x; p0 < count; p0 += 4 * kThreads) {  // four samples in flight per thread
      unsigned long long words[4];
      const unsigned long long* at[4];
      bool live[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int p = p0 + r * kThreads, head = head_lo + p / budget;
        live[r] = p < count && head_mass[head] > 0.f;
        at[r] = sampled + (head0 + head) * budget + p % budget;
        words[r] = live[r] ? load_word(at[r]) : 0ull;
      }
      int keys_r[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) keys_r[r] = live[r] ? sampled_key(at[r], words[r], tag, n) : -1;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        int row = keys_r[r];
        if constexpr (PAGED) {
          if (row >= 0) row = (table_page(cache, b, row) << cache.page_shift) | (row & ((1 << cache.page_shift) - 1));
        }
        if (p0 + r * kThreads < count) resolved[p0 + r * kThreads] = row;
      }
    }
  }
  if constexpr (LIVE) {
    if (!covered) {  // samples: their resolved rows, summed in registers
      __syncthreads();  // the resolved rows are written
      live_gather<D, PAGED, KV>(cache, scales, resolved, head_mass, out, head0, b, h, n, hkv, cta_vec0, cta_owned, head_lo,
                                 budget);
      mark(7);
      return;
    }
  }
  for (int chunk0 = 0; chunk0 < cta_owned; chunk0 += chunk) {
  const int vec0 = cta_vec0 + chunk0, owned = min(chunk, cta_owned - chunk0);
  __syncthreads();  // shared memory is free again: it holds the rows [owned][S][8]
  if (!covered) {  // samples: the keys their words name
    for (int i0 = threadIdx.x; i0 < owned * budget; i0 += 4 * kThreads) {  // four items in flight per thread
      unsigned long long words[4];
      const unsigned long long* at[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + r * kThreads, vec = vec0 + i / budget, head = vec / (D / 8);
        at[r] = sampled + (head0 + head) * budget + i % budget;
        words[r] = i < owned * budget && head_mass[head] > 0.f ? load_word(at[r]) : 0ull;
      }
      int keys_r[4], pages_r[4] = {0, 0, 0, 0};
      if constexpr (PAGED) {  // the keys, then their pages (a second dependent load, four in flight), then the rows
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = i0 + r * kThreads, head = (vec0 + i / budget) / (D / 8);
          keys_r[r] = i < owned * budget && head_mass[head] > 0.f ? sampled_key(at[r], words[r], tag, n) : -1;
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) pages_r[r] = keys_r[r] >= 0 ? table_page(cache, b, keys_r[r]) : 0;
      }
      typename RowWord<KV>::type raw[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = i0 + r * kThreads, vec = vec0 + i / budget, head = vec / (D / 8);
        // a row without mass sampled nothing: zeros; a NaN mass (NaN or +inf scores, a bad length or page): NaN rows,
        // so the sum below is NaN without a test of its own
        const float mass = head_mass[head];
        raw[r] = nan_row_word<KV>();
        if (mass == mass) raw[r] = {};
        if (i < owned * budget && mass > 0.f) {
          const int key = PAGED ? keys_r[r] : sampled_key(at[r], words[r], tag, n);
          const size_t row = PAGED ? row_offset<true>(cache, b, pages_r[r], key) + (size_t)h * cache.head_stride
                                   : (size_t)b * n * hkv * D + (size_t)key * cache.row_stride + (size_t)h * cache.head_stride;
          raw[r] = load_row_word<KV>(cache.v, row + (vec % (D / 8)) * 8);
        }
      }
      store_rows<KV, 4>(raw, i0, owned * budget, kept);
    }
  } else {  // a covered sequence: row first + j scaled by its word j, S·p (j ≥ run_keys: zeros), no sampled keys to wait for
    covered_rows<D, PAGED, KV>(cache, sampled, kept, head_mass, head0, b, h, vec0, owned, budget,
                               run_first, len, tag);
  }
  __syncthreads();
  mark(6);  // the rows here
  // out vector v: one warp; lane = 8 · part + e sums element e of samples part, part + 4, … in order (a warp's 32
  // loads are 32 consecutive floats: no bank conflicts; run 15's tree, 16 threads per element reading runs of samples
  // 64 floats apart, all in one bank, cost 6,900 cycles per round at B = 32 against ~1,100: KERNEL_NOTES run 16),
  // then the 4 parts by a fixed shuffle tree
  const int e = lane & 7, part = lane >> 3;
  const float v_scale = KV == kE4m3 ? (scales.v != nullptr ? __ldg(scales.v + h) : scales.v_scalar) : 1.f;
  for (int vec_local = warp; vec_local < owned; vec_local += kWarps) {
    const float* rows = kept + (size_t)vec_local * budget * 8 + e;
    float sum = 0.f;
    for (int mm = part; mm < budget; mm += 4) sum += rows[(size_t)mm * 8];
    sum += __shfl_xor_sync(0xffffffffu, sum, 8);
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    if (part == 0) {
      float value = sum / (float)budget;
      if constexpr (KV == kE4m3) value *= v_scale;  // V's dequantisation scale (one per KV head: this group's)
      out[head0 * D + (size_t)(vec0 + vec_local) * 8 + e] = out_value<KV>(value);
    }
  }
  }  // the next chunk of this CTA's vectors
  mark(7);
}

// ---- the live schedule (issue 39): every CTA derives the step's work from seq_lens, as
// santa.kernels.one_launch_schedule.live_schedule does, integer for integer (its CPU reference and property tests).
// Sequence b's slice count is C_b = 2^j, j = max(min_log2, log2 pow2ceil(⌈n_b / cap⌉)) (n_b: seq_lens[b] clamped to
// [0, n]), times k = 2^shift, the largest power of two with k · items ≤ the grid and k · max C_b ≤ 2^max_log2 (one wave
// where it fits). Sequences are laid out with their classes descending, stable in b (order[]), each taking H_kv · C_b
// consecutive items (head, then slice); CTA x < lanes (the grid rounded down to a multiple of max C_b) takes items
// x, x + lanes, …, so every group's C_b items fall in one round (a group starts at a multiple of its C_b, which divides
// lanes): the group barrier never waits on a later round.
constexpr int kLiveMaxBatch = 1024;  // sequences a live launch takes (order[] in static shared memory, u16)
constexpr int kLiveClasses = 7;      // slice counts 1, 2, 4, …, 64 (the exchange's slots)

struct Live {
  int items, lanes, shift, cap;
  int first[kLiveClasses], end[kLiveClasses];  // each class's items [first, end)
  int start[kLiveClasses];                     // each class's first place in order[]
};

__device__ __forceinline__ void live_prologue(const int* seq_lens, int batch, int n, int hkv, int cap, int min_log2,
                                              int max_log2, Live& live, unsigned short* order) {
  __shared__ int warp_counts[kWarps][kLiveClasses], totals[kLiveClasses];
  constexpr int kChunks = kLiveMaxBatch / kThreads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int cls[kChunks], rank[kChunks];
  if (threadIdx.x < kLiveClasses) totals[threadIdx.x] = 0;
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kChunks; ++t) {  // each sequence's class, and its rank among the earlier ones of its class
    cls[t] = -1;
    rank[t] = 0;
    if (t * kThreads >= batch) continue;  // the same for every thread: no barrier skipped by some
    const int b = t * kThreads + threadIdx.x;
    int j = -1;
    if (b < batch) {
      const int len = min(max(seq_lens == nullptr ? n : __ldg(seq_lens + b), 0), n);
      const int need = (len + cap - 1) / cap;  // slices of at most cap keys
      j = max(need <= 1 ? 0 : 32 - __clz(need - 1), min_log2);
    }
    int below = 0;
#pragma unroll
    for (int c = 0; c < kLiveClasses; ++c) {
      const unsigned mask = __ballot_sync(0xffffffffu, j == c);
      if (lane == 0) warp_counts[warp][c] = __popc(mask);
      if (j == c) below = __popc(mask & ((1u << lane) - 1u));
    }
    __syncthreads();
    if (j >= 0) {
      int before = totals[j];
      for (int w = 0; w < warp; ++w) before += warp_counts[w][j];
      rank[t] = before + below;
    }
    cls[t] = j;
    __syncthreads();
    if (threadIdx.x < kLiveClasses) {
      int sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += warp_counts[w][threadIdx.x];
      totals[threadIdx.x] += sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // the one-wave factor, the lanes, and the classes' items, descending
    int items = 0, top = 0;
    for (int c = 0; c < kLiveClasses; ++c) {
      items += totals[c] << c;
      if (totals[c] > 0) top = c;
    }
    items *= hkv;
    int shift = 0;
    while (((long long)items << (shift + 1)) <= (long long)gridDim.x && top + shift + 1 <= max_log2) ++shift;
    live.shift = shift;
    live.cap = cap;
    live.lanes = (int)gridDim.x - (int)gridDim.x % (1 << (top + shift));
    int at = 0, place = 0;
    for (int c = kLiveClasses - 1; c >= 0; --c) {
      live.first[c] = at;
      live.start[c] = place;
      at += (hkv * totals[c]) << (c + shift);
      place += totals[c];
      live.end[c] = at;
    }
    live.items = at;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kChunks; ++t)
    if (cls[t] >= 0) order[live.start[cls[t]] + rank[t]] = (unsigned short)(t * kThreads + threadIdx.x);
  __syncthreads();
}

// Live item i as the schedule's (group, slice c, the group's slice count, the slice length that sizes shared memory)
__device__ __forceinline__ int4 live_item(const Live& live, const unsigned short* order, int i, int hkv) {
  int c = 0;
  while (c < kLiveClasses - 1 && !(i >= live.first[c] && i < live.end[c])) ++c;
  const int slices = 1 << (c + live.shift), per_seq = hkv * slices, t = i - live.first[c];
  const int b = order[live.start[c] + t / per_seq], rem = t % per_seq;
  return make_int4(b * hkv + rem / slices, rem % slices, slices, live.cap);
}

}  // namespace

// The persistent grid runs a schedule the host builds: schedule[r · grid + CTA] = (group, slice c, the group's slice
// count C_g, its slice length), or group −1 (nothing in that round). All slices of a group sit in the same round, so a
// CTA waits only on CTAs that reach that round (every CTA is resident): no cycle. The host may give groups different
// slice counts (benchmarks/kernels/cuda_one_launch_check.py: a half of the grid running half-length slices first, so the
// two CTAs of an SM sample in turn instead of together). slice_stats is [groups][G][stats_slots][2], stats_slots the
// largest C_g.
// arrivals (nullptr: the schedule's CTA is blockIdx.x): for a grid of two CTAs on each of grid/2 SMs, the schedule's
// CTA index is chosen so that each SM holds one CTA of each half ([0, grid/2) and [grid/2, grid)): the first CTA to
// arrive on an SM takes the first half, the second the other (arrivals[smid] counts them; two per launch keep the
// parity), and a rank within its half (arrivals[1024 + half], grid/2 per launch, taken modulo grid/2). No reset
// between launches: graph-safe. Which CTA runs which work changes between launches; what each work item computes
// does not, so the output stays bitwise repeatable.
// enabled (nullptr: always): a device int that gates the launch; 0 makes every CTA return at once, before it takes a
// schedule slot (so arrivals keep their parity) or reads an epoch: out, counts and the exchange buffers are left as they
// are. An engine that holds santa and a dense kernel in one CUDA graph picks one of them per replay with it.
__device__ __forceinline__ int schedule_cta(unsigned* arrivals) {
  if (arrivals == nullptr) return blockIdx.x;
  __shared__ int cta;
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const unsigned half = gridDim.x / 2, which = atomicAdd(arrivals + smid, 1u) & 1u;
    cta = (int)(which * half + atomicAdd(arrivals + 1024 + which, 1u) % half);
  }
  __syncthreads();
  return cta;
}

#define SANTA_PROP_ONE_LAUNCH(NAME, D, G, U, STAGE, PAGED, KV, LIVE)                                                     \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                                        \
      NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, long long page_stride,             \
           long long row_stride, long long head_stride, const int* table, int table_stride, int page_shift, int pages, \
           const float* k_scales, const float* v_scales, float k_scale, float v_scale,                                 \
           const float* uniforms, unsigned long long seed, const long long* seeds, unsigned long long offset,          \
           const long long* offset_ptr, const void* positions, int positions_64, int head_offset, const int* seq_lens,  \
           const int* starts, __nv_bfloat16* out, int* counts, unsigned long long* slice_stats, unsigned long long* sampled,               \
           unsigned* epoch, long long* marks, const int4* schedule, unsigned* arrivals, int rounds, int stats_slots,   \
           int n, int hkv, float scale, int budget, const int* enabled, int live_batch, int live_cap,               \
           int live_min_log2, int live_max_log2) {                                                                 \
    if (enabled != nullptr && __ldg(enabled) == 0) return; /* a closed gate: nothing read, written or counted */     \
    const int cta = schedule_cta(arrivals);                                                                         \
    if constexpr (LIVE) {                                                                                           \
      __shared__ Live live;                                                                                         \
      __shared__ unsigned short order[kLiveMaxBatch];                                                               \
      live_prologue(seq_lens, live_batch, n, hkv, live_cap, live_min_log2, live_max_log2, live, order);              \
      const Draw draw{uniforms, seed, seeds, offset, offset_ptr, positions, positions_64, head_offset};            \
      const Cache cache{k, v, page_stride, row_stride, head_stride, table, table_stride, page_shift, pages};        \
      const Scales scales{k_scales, v_scales, k_scale, v_scale};                                                    \
      const int4 idle = make_int4(-1, 0, 0, 0);                                                                     \
      int i = cta;                                                                                                  \
      int4 work = cta < live.lanes && i < live.items ? live_item(live, order, i, hkv) : idle;                       \
      unsigned seen = work.x >= 0 ? load_epoch(epoch + work.x) : 0u;                                                \
      int len = work.x >= 0 ? load_len(seq_lens, work.x, hkv, n) : 0;                                               \
      for (int r = 0; work.x >= 0; ++r) { /* items in increasing order: idle once past the last */                  \
        const int next_i = i + live.lanes;                                                                          \
        const int4 next = next_i < live.items ? live_item(live, order, next_i, hkv) : idle;                         \
        unsigned next_seen = 0u;                                                                                    \
        int next_len = 0;                                                                                           \
        prop_slice<D, G, U, STAGE, PAGED, KV, LIVE>(q, cache, scales, draw, seq_lens, starts, out, counts, slice_stats, sampled,  \
                                               epoch, marks, n, hkv, work.x, work.y, work.z, work.w, stats_slots,    \
                                               r * gridDim.x + cta, scale, budget, seen, len, next.x, next_seen,     \
                                               next_len);                                                           \
        __syncthreads(); /* the next item reuses shared memory */                                                  \
        i = next_i;                                                                                                 \
        work = next;                                                                                                \
        seen = next_seen;                                                                                           \
        len = next_len;                                                                                             \
      }                                                                                                             \
      return;                                                                                                       \
    }                                                                                                               \
    const Draw draw{uniforms, seed, seeds, offset, offset_ptr, positions, positions_64, head_offset};              \
    const Cache cache{k, v, page_stride, row_stride, head_stride, table, table_stride, page_shift, pages};          \
    const Scales scales{k_scales, v_scales, k_scale, v_scale};                                                      \
    const int4 idle = make_int4(-1, 0, 0, 0);                                                                       \
    int4 work = rounds > 0 ? load_work(schedule + cta) : idle;                                                      \
    unsigned seen = work.x >= 0 ? load_epoch(epoch + work.x) : 0u;                                                  \
    int len = work.x >= 0 ? load_len(seq_lens, work.x, hkv, n) : 0;                                                 \
    for (int r = 0; r < rounds; ++r) {                                                                              \
      const int slot = r * gridDim.x + cta;                                                                         \
      const int4 next = r + 1 < rounds ? load_work(schedule + slot + gridDim.x) : idle; /* used after this item */  \
      unsigned next_seen = 0u;                                                                                      \
      int next_len = 0;                                                                                             \
      if (work.x >= 0) {                                                                                            \
        prop_slice<D, G, U, STAGE, PAGED, KV, LIVE>(q, cache, scales, draw, seq_lens, starts, out, counts, slice_stats, sampled,              \
                                   epoch, marks, n, hkv, work.x, work.y, work.z, work.w, stats_slots, slot, scale,   \
                                   budget, seen, len, next.x, next_seen, next_len);                                 \
        __syncthreads(); /* the next item reuses shared memory */                                                  \
      } else if (next.x >= 0) {                                                                                     \
        next_seen = load_epoch(epoch + next.x);                                                                     \
        next_len = load_len(seq_lens, next.x, hkv, n);                                                              \
      }                                                                                                             \
      work = next;                                                                                                  \
      seen = next_seen;                                                                                             \
      len = next_len;                                                                                               \
    }                                                                                                               \
  }

// Every kernel of one head shape (D, G): contiguous (prop1_) and paged (p) caches, bf16, fp8 (f) and fp16 (h: q, out
// and the caches fp16), host-built rounds and the live schedule (l, issue 39), each with its measured unrolling U: U the
// contiguous bf16 kernel's, UP the paged bf16's (fp16 takes bf16's: the same bytes per row), UF the fp8 kernels'.
//   d = 128: contiguous bf16 U = 1 (issue 24's measurements). Paged: two 8-key groups per warp and step (U = 2: more
//   loads in flight behind the page lookups): Llama B = 8 / 32 × 32k on shuffled 16-key pages 172.7 → 163.6 and
//   640.2 → 590.2 µs, B = 1 × 32k 33.0 → 33.6 (H200, 2026-12-04; 128 registers, 48 bytes spilled). fp8: U = 2, a lane's
//   load is 8 bytes, not 16 (Llama 32k / 128k / B = 8 / B = 32 × 32k 23.8 / 53.9 / 110.8 / 402.5 µs against 25.5 /
//   61.4 / 128.4 / 468.2 at U = 1; paged Llama 1 / 8 × 32k 27.7 / 133.8 against 29.8 / 136.6 at U = 4, B = 32 484.7
//   against 478.0).
//   d = 64: U = 4 everywhere (fp8: Qwen B = 16 × 32k 51.1 / 61.1 against 53.9 / 63.2 at U = 8, SmolLM2 B = 64 × 8k
//   77.8 / 94.5 against 82.8 / 95.4; H200, 2026-12-04, the same outputs bitwise).
// Those were measured at G = 4 (d = 128) and G = 7 and 3 (d = 64); the other shapes take their head dim's unrolling.
#define SANTA_PROP_SHAPE(D, G, U, UP, UF)                                                 \
  SANTA_PROP_ONE_LAUNCH(prop1_d##D##_g##G, D, G, U, 0, false, kBf16, false)              \
  SANTA_PROP_ONE_LAUNCH(prop1p_d##D##_g##G, D, G, UP, 0, true, kBf16, false)             \
  SANTA_PROP_ONE_LAUNCH(prop1f_d##D##_g##G, D, G, UF, 0, false, kE4m3, false)            \
  SANTA_PROP_ONE_LAUNCH(prop1pf_d##D##_g##G, D, G, UF, 0, true, kE4m3, false)            \
  SANTA_PROP_ONE_LAUNCH(prop1h_d##D##_g##G, D, G, U, 0, false, kF16, false)              \
  SANTA_PROP_ONE_LAUNCH(prop1ph_d##D##_g##G, D, G, UP, 0, true, kF16, false)             \
  SANTA_PROP_ONE_LAUNCH(prop1l_d##D##_g##G, D, G, U, 0, false, kBf16, true)              \
  SANTA_PROP_ONE_LAUNCH(prop1lf_d##D##_g##G, D, G, UF, 0, false, kE4m3, true)            \
  SANTA_PROP_ONE_LAUNCH(prop1lh_d##D##_g##G, D, G, U, 0, false, kF16, true)              \
  SANTA_PROP_ONE_LAUNCH(prop1lp_d##D##_g##G, D, G, UP, 0, true, kBf16, true)             \
  SANTA_PROP_ONE_LAUNCH(prop1lpf_d##D##_g##G, D, G, UF, 0, true, kE4m3, true)            \
  SANTA_PROP_ONE_LAUNCH(prop1lph_d##D##_g##G, D, G, UP, 0, true, kF16, true)

// Each head dim's unrolling (U, UP, UF above), stated once
#define SANTA_PROP_D128(G) SANTA_PROP_SHAPE(128, G, 1, 2, 2)
#define SANTA_PROP_D64(G) SANTA_PROP_SHAPE(64, G, 4, 4, 4)

// The head shapes served (one_launch.py's SHAPES): d = 128 with G = 1 to 8 (MHA models; Qwen3-0.6B/1.7B; Llama-3.2-3B;
// Llama-3.1-8B, Mistral-7B; Qwen2.5-14B/32B; Qwen2.5-1.5B; Qwen2.5-7B; Llama-3.1-70B, Qwen2.5-3B), d = 64 with G = 1
// (MHA at d = 64: SmolLM2-1.7B, StableLM-2-1.6B), 2, 3 (SmolLM2-135M/360M), 4 (Llama-3.2-1B), 5, 6, 7 (Qwen2.5-0.5B),
// 8 (TinyLlama): every G the Triton prop takes at both head dims. G ≤ 8: one mma row per head.
SANTA_PROP_D128(1) SANTA_PROP_D128(2) SANTA_PROP_D128(3) SANTA_PROP_D128(4)
SANTA_PROP_D128(5) SANTA_PROP_D128(6) SANTA_PROP_D128(7) SANTA_PROP_D128(8)
SANTA_PROP_D64(1) SANTA_PROP_D64(2) SANTA_PROP_D64(3) SANTA_PROP_D64(4)
SANTA_PROP_D64(5) SANTA_PROP_D64(6) SANTA_PROP_D64(7) SANTA_PROP_D64(8)
