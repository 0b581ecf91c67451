// Issue 24's first check, in CUDA C++: the stream phase of a one-launch prop alone. Each CTA reads one slice of
// one group's keys (group = sequence, KV head) once, scores the group's G query heads on every key and keeps
// the slice's statistics per head: m = max_j s_j and l = sum_j 2^(s_j - m), with s in the log2 domain
// (s = q.k * log2(e) / sqrt(D)). No stash, no sampling: this is the K read the one-launch design stands on,
// timed against Triton pass 1 (benchmarks/kernels/cuda_stream_check.py). Benchmark code, not the library.
//
// Layouts (contiguous, NHD): q [B, Hkv*G, D] bf16; k [B, n, Hkv, D] bf16; stats [B, Hkv*G, C, 2] float32.
// Grid (C, Hkv, B); 256 threads. A key's D values for one KV head are D*2 bytes: LPK = D/8 lanes load 16 B each,
// so a warp takes KPW = 32/LPK keys per load instruction; U loads per lane per step, double-buffered.
// The G head scores of a key are reduced over its LPK lanes by a butterfly that halves the values it carries
// each round (G padded to GP, a power of two <= LPK): after log2(GP) rounds each lane holds one head's partial.
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// (m, l) ← the merge of two slices' statistics (log2 domain); two empty ones (m = −inf) stay empty
__device__ __forceinline__ void merge_stats(float& m, float& l, float m_o, float l_o) {
  const float m_new = fmaxf(m, m_o);
  l = m_new == -INFINITY ? 0.f : l * exp2f(m - m_new) + l_o * exp2f(m_o - m_new);
  m = m_new;
}

// The slice's (m, l) per head from one (m, l) per warp and head: lanes with `writer` set hold their warp's pair of
// head `head`; thread g < G merges the warps' pairs in warp order and writes stats[b, h·G + g, c]. Call from all
// threads (it synchronises the CTA).
template <int G, int SLOTS>
__device__ __forceinline__ void store_slice_stats(float m, float l, bool writer, int head, float* __restrict__ stats,
                                                  int hkv) {
  __shared__ float sm_m[kWarps][SLOTS], sm_l[kWarps][SLOTS];
  const int warp = threadIdx.x >> 5;
  if (writer) {
    sm_m[warp][head] = m;
    sm_l[warp][head] = l;
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float mg = -INFINITY, lg = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) merge_stats(mg, lg, sm_m[w][g], sm_l[w][g]);
    const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    float* out = stats + (((size_t)b * hkv * G + (size_t)h * G + g) * gridDim.x + c) * 2;
    out[0] = mg;
    out[1] = lg;
  }
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

template <int D, int G, int GP, int U, bool SCORE>
__device__ __forceinline__ void stream_slice(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                             float* __restrict__ stats, int n, int hkv, int slice_len, float scale_log2) {
  constexpr int LPK = D / 8;          // lanes per key
  constexpr int KPW = 32 / LPK;       // keys per warp per load
  constexpr int KEYS_PER_STEP = kWarps * U * KPW;
  static_assert(GP <= LPK && GP >= G, "the butterfly needs GP <= LPK lanes");
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % LPK, key_in_warp = lane / LPK;

  // q chunk of this lane (8 dims) for the G heads, pre-scaled into the log2 domain
  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const uint4 raw = *reinterpret_cast<const uint4*>(q + ((size_t)b * hkv * G + (size_t)h * G + g) * D + sub * 8);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      qf[g][2 * j] = f.x * scale_log2;
      qf[g][2 * j + 1] = f.y * scale_log2;
    }
  }

  // which head this lane ends up holding after the butterfly, and whether it is the one lane that reports it
  int head = 0;
#pragma unroll
  for (int o = LPK / 2, v = GP; o >= 1 && v > 1; o >>= 1, v >>= 1)
    if (sub & o) head += v / 2;
  constexpr int SPARE = LPK / GP;  // lanes holding the same head after the butterfly (the low bits of sub)
  const bool reports = head < G && (sub % SPARE) == 0;

  const int start = c * slice_len, stop = min(n, start + slice_len);
  const size_t row = (size_t)hkv * D;  // elements between two keys
  const __nv_bfloat16* kb = k + (size_t)b * n * row + (size_t)h * D + sub * 8;
  float m = -INFINITY, l = 0.f;

  auto load = [&](uint4 (&dst)[U], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + (u * kWarps + warp) * KPW + key_in_warp;
      dst[u] = key < stop ? __ldg(reinterpret_cast<const uint4*>(kb + (size_t)key * row)) : make_uint4(0, 0, 0, 0);
    }
  };
  unsigned sink = 0;  // SCORE = false: the same loads, no scores (the read's own speed)
  auto consume = [&](const uint4 (&src)[U], int base) {
    if constexpr (!SCORE) {
#pragma unroll
      for (int u = 0; u < U; ++u) sink ^= src[u].x ^ src[u].y ^ src[u].z ^ src[u].w;
      return;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + (u * kWarps + warp) * KPW + key_in_warp;
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&src[u]);
      float kf[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(pairs[j]);
        kf[2 * j] = f.x;
        kf[2 * j + 1] = f.y;
      }
      float part[GP];
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float acc = 0.f;
        if (g < G) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc = fmaf(qf[g < G ? g : 0][j], kf[j], acc);
        }
        part[g] = acc;
      }
      // butterfly: carry v values, send half, keep half, until one remains; then plain sums
#pragma unroll
      for (int o = LPK / 2, v = GP; o >= 1; o >>= 1) {
        if (v > 1) {
          const bool up = sub & o;
#pragma unroll
          for (int i = 0; i < v / 2; ++i) {
            const float send = up ? part[i] : part[i + v / 2];
            const float keep = up ? part[i + v / 2] : part[i];
            part[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
          }
          v >>= 1;
        } else {
          part[0] += __shfl_xor_sync(0xffffffffu, part[0], o);
        }
      }
      if (reports && key < stop) {
        const float s = part[0];
        const float m_new = fmaxf(m, s);
        l = l * exp2f(m - m_new) + exp2f(s - m_new);
        m = m_new;
      }
    }
  };

  using Buffer = uint4[U];
  double_buffered<Buffer>(start, stop, KEYS_PER_STEP, load, consume);

  if constexpr (!SCORE) {
    if (sink == 0x9e3779b9u) stats[0] = 0.f;  // keeps the loads; never true for these inputs in practice
    return;
  }
  // the slice's statistics per head: first the lanes of a warp with the same sub (same head, other keys: the lane
  // bits from LPK up) merge by shuffles, then thread g merges the warps' head-g pairs in warp order
#pragma unroll
  for (int o = LPK; o < 32; o <<= 1) merge_stats(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
  store_slice_stats<G, GP>(m, l, reports && key_in_warp == 0, head, stats, hkv);
}

// The same stream phase with the scores on tensor cores (mma.sync m16n8k16, bf16 in, fp32 out): a warp scores 8 keys
// per mma group; lane = 4·n + kslot loads 16 contiguous bytes of key n (dims 32·j + 8·kslot … + 8 for each
// 32-dim block j). The dot product does not care about the order of the dims, so the mma's k index is mapped to
// the dims this lane loaded: its B registers are its own K words, and its A registers (q of head g = lane / 4,
// rows 8-15 zero) are its own q words of the same dims. The C fragment gives lane (g, 2·kslot + {0, 1}): two keys'
// scores of head g, with no shuffles.
//
// KEEP (not yet run on a GPU; compiled for sm_90a): the slice also keeps what placement needs, as the one-launch
// design would: every score in shared memory (dynamic, G × slice_len float32), then per 64-key tile of the slice
// its max m_t and mass ℓ_t = Σ 2^(s − m_t), with u = 2^(s − m_t) written back in place; the tiles' (m_t, ℓ_t) go to
// tile_stats [B, Hkv·G, C, ⌈slice_len / 64⌉, 2] so that they can be checked.
template <int D, int G, int U, bool KEEP>
__device__ __forceinline__ void mma_stream(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, int n,
                                           int hkv, int start, int stop, float scale_log2, float* kept, int kept_stride,
                                           float& m, float& l) {
  // Streams keys [start, stop) of group (blockIdx.z, blockIdx.y): this lane's running (m, l) of head lane / 4 over the
  // keys it scored; KEEP: every score s also into kept[head · kept_stride + key − start] (shared memory).
  constexpr int BLOCKS = D / 32;                    // 16-byte loads per key per lane
  constexpr int KEYS_PER_STEP = kWarps * U * 8;
  static_assert(G <= 8, "one mma row per head");
  const int h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, kslot = lane & 3;
  const bool live_head = g < G;

  uint4 qw[BLOCKS];
#pragma unroll
  for (int j = 0; j < BLOCKS; ++j)
    qw[j] = live_head ? *reinterpret_cast<const uint4*>(q + ((size_t)b * hkv * G + (size_t)h * G + g) * D + j * 32 + kslot * 8)
                      : make_uint4(0, 0, 0, 0);

  const size_t row = (size_t)hkv * D;
  const __nv_bfloat16* kb = k + (size_t)b * n * row + (size_t)h * D + kslot * 8;
  m = -INFINITY;
  l = 0.f;

  auto load = [&](uint4 (&dst)[U][BLOCKS], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + (u * kWarps + warp) * 8 + g;  // lane / 4 is also the key within the group of 8
#pragma unroll
      for (int j = 0; j < BLOCKS; ++j)
        dst[u][j] = key < stop ? __ldg(reinterpret_cast<const uint4*>(kb + (size_t)key * row + j * 32)) : make_uint4(0, 0, 0, 0);
    }
  };
  auto consume = [&](const uint4 (&src)[U][BLOCKS], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
#pragma unroll
      for (int j = 0; j < BLOCKS; ++j) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                     : "r"(qw[j].x), "r"(0u), "r"(qw[j].y), "r"(0u), "r"(src[u][j].x), "r"(src[u][j].y));
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                     : "r"(qw[j].z), "r"(0u), "r"(qw[j].w), "r"(0u), "r"(src[u][j].z), "r"(src[u][j].w));
      }
      const int key0 = base + (u * kWarps + warp) * 8 + 2 * kslot;  // the C columns of this lane: keys key0, key0 + 1
      const float s0 = key0 < stop ? c0 * scale_log2 : -INFINITY;
      const float s1 = key0 + 1 < stop ? c1 * scale_log2 : -INFINITY;
      if constexpr (KEEP) {
        if (live_head && key0 < stop) kept[g * kept_stride + key0 - start] = s0;
        if (live_head && key0 + 1 < stop) kept[g * kept_stride + key0 + 1 - start] = s1;
      }
      const float m_new = fmaxf(m, fmaxf(s0, s1));
      if (m_new != -INFINITY) {
        l = l * exp2f(m - m_new) + exp2f(s0 - m_new) + exp2f(s1 - m_new);
        m = m_new;
      }
    }
  };

  using Buffer = uint4[U][BLOCKS];
  double_buffered<Buffer>(start, stop, KEYS_PER_STEP, load, consume);
}

template <int D, int G, int U, bool KEEP>
__device__ __forceinline__ void stream_slice_mma(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                                 float* __restrict__ stats, float* __restrict__ tile_stats, int n, int hkv,
                                                 int slice_len, float scale_log2) {
  extern __shared__ float kept[];  // KEEP: [G][slice_len] scores, then u
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, kslot = lane & 3;
  const int start = c * slice_len, stop = min(n, start + slice_len);
  float m, l;
  mma_stream<D, G, U, KEEP>(q, k, n, hkv, start, stop, scale_log2, kept, slice_len, m, l);

  if constexpr (KEEP) {  // per 64-key tile and head, one warp: m_t, ℓ_t, and u in place of the scores
    __syncthreads();
    const int keys = max(stop - start, 0), tiles = (keys + 63) / 64, tiles_planned = (slice_len + 63) / 64;
    for (int item = warp; item < G * tiles; item += kWarps) {
      const int head = item / tiles, t = item % tiles, i0 = t * 64 + lane, i1 = i0 + 32;
      float* row_keep = kept + head * slice_len;
      const float v0 = i0 < keys ? row_keep[i0] : -INFINITY, v1 = i1 < keys ? row_keep[i1] : -INFINITY;
      float mt = fmaxf(v0, v1);
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
      const float u0 = i0 < keys ? exp2f(v0 - mt) : 0.f, u1 = i1 < keys ? exp2f(v1 - mt) : 0.f;
      if (i0 < keys) row_keep[i0] = u0;
      if (i1 < keys) row_keep[i1] = u1;
      float lt = u0 + u1;
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, o);
      if (lane == 0) {
        float* out = tile_stats + ((((size_t)b * hkv * G + (size_t)h * G + head) * gridDim.x + c) * tiles_planned + t) * 2;
        out[0] = mt;
        out[1] = lt;
      }
    }
  }

#pragma unroll
  for (int o = 1; o < 4; o <<= 1)  // the 4 lanes of head g
    merge_stats(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
  store_slice_stats<G, 8>(m, l, kslot == 0, g, stats, hkv);
}

// prop in one launch (issue 24), a first version: NOT YET RUN ON A GPU (compiled for sm_90a only). Exact global
// systematic sampling as santa's two-launch prop, for contiguous NHD bf16 K and V whose sequences all hold n keys,
// with the uniforms given ([B, Hkv·G] float32, santa.kernels.reference.philox_uniforms): one persistent grid
// (C, Hkv, B), every CTA resident (a cooperative launch), a CTA per slice of a group's keys.
//   stream: mma_stream with KEEP (the slice's scores in shared memory); the slice max m_c per head; u = 2^(s − m_c)
//           in place and its inclusive prefix per head (cum), the slice mass w_c = cum[last]; publish (m_c, w_c);
//           arrive on the group's counter; wait for the group's C arrivals.
//   sample: warp g = head g. Every CTA computes the group's slice prefix in the same order (bit-identical): m* = max
//           m_c', W_c' = 2^(m_c' − m*)·w_c', Z = Σ W, P_c = S·(Σ_{c'≤c} W_c')/Z (P_{C−1} = S exactly). Comb point m
//           (position m + U) belongs to this slice iff P_{c−1} − m ≤ U < P_c − m (santa's pass 2 test); inside it,
//           x = (U − (P_{c−1} − m)) / (P_c − P_{c−1}) and the key is #{j : cum_j / cum_last ≤ x}, clamped to the last
//           key with u > 0 (pass 2's rule). V rows summed in sample order (deterministic); a partial per slice.
//   merge:  depart on the group's second counter; the last CTA of the group sums the C partials in slice order,
//           writes out = Σ / S and resets both counters (every CTA of the group has passed its wait by then).
// Not handled yet (the Triton kernel does all of them): per-sequence lengths, paged caches, NaN rows, S > n checks,
// fp8, other dtypes, groups beyond one wave (rounds).
template <int D, int G, int U>
__device__ __forceinline__ void prop_one_launch(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                                const __nv_bfloat16* __restrict__ v, const float* __restrict__ uniforms,
                                                __nv_bfloat16* __restrict__ out, int* __restrict__ counts,
                                                float* __restrict__ slice_stats, float* __restrict__ partial,
                                                int* __restrict__ arrive, int* __restrict__ depart, int n, int hkv,
                                                int slice_len, float scale_log2, int budget) {
  extern __shared__ float kept[];  // [G][slice_len]: scores, then u, then its inclusive prefix
  __shared__ float warp_max[kWarps][8], slice_max[8], chunk_sum[kWarps];
  __shared__ int last_live[8], is_last;
  constexpr int PER_LANE = D / 32;  // V elements per lane
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, slices = gridDim.x, group = b * hkv + h;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int start = c * slice_len, stop = min(n, start + slice_len), keys = max(stop - start, 0);

  // ---- stream
  float m, l;
  mma_stream<D, G, U, true>(q, k, n, hkv, start, stop, scale_log2, kept, slice_len, m, l);
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // the 4 lanes of head lane / 4
  if ((lane & 3) == 0) warp_max[warp][lane >> 2] = m;
  if (threadIdx.x < 8) last_live[threadIdx.x] = -1;
  __syncthreads();
  if (threadIdx.x < G) {
    float mg = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mg = fmaxf(mg, warp_max[w][threadIdx.x]);
    slice_max[threadIdx.x] = mg;
  }
  __syncthreads();
  // u in place and its inclusive prefix, one head at a time: each thread a contiguous chunk, then the chunk totals
  const int chunk = (keys + kThreads - 1) / kThreads, lo = min(keys, threadIdx.x * chunk), hi = min(keys, lo + chunk);
  for (int g = 0; g < G; ++g) {
    float* row = kept + g * slice_len;
    const float mg = slice_max[g];
    float run = 0.f;
    int live = -1;
    for (int j = lo; j < hi; ++j) {
      const float u = mg == -INFINITY ? 0.f : exp2f(row[j] - mg);
      if (u > 0.f) live = j;
      run += u;
      row[j] = run;
    }
    if (live >= 0) atomicMax(&last_live[g], live);
    float incl = run;  // the chunk totals' inclusive scan over the CTA's threads, in thread order
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float other = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += other;
    }
    if (lane == 31) chunk_sum[warp] = incl;
    float before = __shfl_up_sync(0xffffffffu, incl, 1);  // the exclusive scan: the previous lane's inclusive one
    if (lane == 0) before = 0.f;
    __syncthreads();
    for (int w = 0; w < warp; ++w) before += chunk_sum[w];
    for (int j = lo; j < hi; ++j) row[j] += before;
    __syncthreads();
  }
  // ---- publish, arrive, wait
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float* st = slice_stats + (((size_t)b * hkv * G + (size_t)h * G + g) * slices + c) * 2;
    st[0] = slice_max[g];
    st[1] = keys > 0 ? kept[g * slice_len + keys - 1] : 0.f;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&arrive[group], 1);
    while (atomicAdd(&arrive[group], 0) < slices) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();

  // ---- sample: warp g places head g's comb points that fall in this slice
  float acc[PER_LANE];
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) acc[e] = 0.f;
  const int g = warp;
  if (g < G) {
    const size_t hrow = (size_t)b * hkv * G + (size_t)h * G + g;
    const float* st = slice_stats + hrow * slices * 2;
    float m_star = -INFINITY;
    for (int i = 0; i < slices; ++i) m_star = fmaxf(m_star, __ldcg(st + 2 * i));
    const float m_ref = m_star == -INFINITY ? 0.f : m_star;
    float z = 0.f, below = 0.f, through = 0.f;  // the running sum before and through this slice: the same loop on
    for (int i = 0; i < slices; ++i) {           // every CTA, so slice c's `through` is slice c + 1's `below`, bit
      const float w = __ldcg(st + 2 * i + 1) * exp2f(__ldcg(st + 2 * i) - m_ref);  // for bit, and no point is
      z += w;                                                                        // placed twice or never
      if (i == c - 1) below = z;
      if (i == c) through = z;
    }
    const float s_f = (float)budget, uni = uniforms[hrow];
    const float p_lo = c == 0 ? 0.f : (below / z) * s_f;
    const float p_hi = (through / z) * s_f;  // S exactly for the last slice (z / z = 1), as pass 2's P_last
    const float* cum = kept + g * slice_len;
    const float total = keys > 0 ? cum[keys - 1] : 0.f;
    const int first_m = max(0, (int)ceilf(p_lo - uni) - 1), last_m = min(budget - 1, (int)ceilf(p_hi - uni));
    const __nv_bfloat16* vb = v + (size_t)b * n * hkv * D + (size_t)h * D + lane * PER_LANE;
    for (int m0 = first_m; m0 <= last_m && z > 0.f && total > 0.f; m0 += 32) {
      const int mm = m0 + lane;
      const float mf = (float)mm;
      const bool mine = mm <= last_m && (p_lo - mf) <= uni && uni < (p_hi - mf);
      int key = 0;
      if (mine) {
        const float width = p_hi - p_lo;
        const float x = (uni - (p_lo - mf)) / (width > 0.f ? width : 1.f);
        int pos = 0;  // #{j < keys : cum_j / total <= x} by bisection (cum is non-decreasing)
        for (int step = 1 << 30; step > 0; step >>= 1)
          if (pos + step <= keys && cum[pos + step - 1] / total <= x) pos += step;
        key = start + min(pos, last_live[g]);
        if (counts != nullptr) atomicAdd(&counts[hrow * n + key], 1);
      }
      const unsigned found = __ballot_sync(0xffffffffu, mine);
      for (unsigned bits = found; bits != 0; bits &= bits - 1) {  // in sample order: deterministic sums
        const int src = __ffs(bits) - 1;
        const int kk = __shfl_sync(0xffffffffu, key, src);
        const __nv_bfloat16* vr = vb + (size_t)kk * hkv * D;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) acc[e] += __bfloat162float(vr[e]);
      }
    }
    float* pr = partial + (hrow * slices + c) * D + lane * PER_LANE;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) pr[e] = acc[e];
  }
  // ---- depart; the group's last CTA merges the partials in slice order
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&depart[group], 1) == slices - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (g < G) {
    const size_t hrow = (size_t)b * hkv * G + (size_t)h * G + g;
    float sum[PER_LANE];
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) sum[e] = 0.f;
    for (int i = 0; i < slices; ++i) {
      const float* pr = partial + (hrow * slices + i) * D + lane * PER_LANE;
#pragma unroll
      for (int e = 0; e < PER_LANE; ++e) sum[e] += __ldcg(pr + e);
    }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) out[hrow * D + lane * PER_LANE + e] = __float2bfloat16(sum[e] / (float)budget);
  }
  if (threadIdx.x == 0) {
    atomicExch(&arrive[group], 0);
    atomicExch(&depart[group], 0);
  }
}

}  // namespace

#define SANTA_STREAM(NAME, D, G, GP, U, SCORE)                                                                            \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                                       \
      NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, float* stats, int n, int hkv, int slice_len, float scale) { \
    stream_slice<D, G, GP, U, SCORE>(q, k, stats, n, hkv, slice_len, scale);                                              \
  }

SANTA_STREAM(stream_d128_g4_u4, 128, 4, 4, 4, true)   // Llama-3.1-8B: 32 q / 8 kv heads
SANTA_STREAM(stream_d128_g4_u8, 128, 4, 4, 8, true)
SANTA_STREAM(read_d128_g4_u4, 128, 4, 4, 4, false)    // the same loads, no scores
SANTA_STREAM(read_d128_g4_u8, 128, 4, 4, 8, false)
SANTA_STREAM(stream_d64_g7_u4, 64, 7, 8, 4, true)     // Qwen2.5-0.5B: 14 q / 2 kv heads
SANTA_STREAM(stream_d64_g3_u4, 64, 3, 4, 4, true)     // SmolLM2-135M: 9 q / 3 kv heads
SANTA_STREAM(stream_d64_g3_u8, 64, 3, 4, 8, true)

#define SANTA_STREAM_MMA(NAME, D, G, U)                                                                             \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                                        \
      NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, float* stats, int n, int hkv, int slice_len, float scale) { \
    stream_slice_mma<D, G, U, false>(q, k, stats, nullptr, n, hkv, slice_len, scale);                               \
  }
#define SANTA_STREAM_KEEP(NAME, D, G, U)                                                                            \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                                        \
      NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, float* stats, int n, int hkv, int slice_len, float scale,   \
           float* tile_stats) {                                                                                     \
    stream_slice_mma<D, G, U, true>(q, k, stats, tile_stats, n, hkv, slice_len, scale);                             \
  }

SANTA_STREAM_MMA(mma_d128_g4_u1, 128, 4, 1)
SANTA_STREAM_MMA(mma_d128_g4_u2, 128, 4, 2)
SANTA_STREAM_MMA(mma_d64_g7_u4, 64, 7, 4)
SANTA_STREAM_MMA(mma_d64_g3_u4, 64, 3, 4)
SANTA_STREAM_KEEP(keep_d128_g4_u1, 128, 4, 1)  // not yet run on a GPU
SANTA_STREAM_KEEP(keep_d64_g7_u4, 64, 7, 4)
SANTA_STREAM_KEEP(keep_d64_g3_u4, 64, 3, 4)

#define SANTA_PROP_ONE_LAUNCH(NAME, D, G, U)                                                                        \
  extern "C" __global__ void __launch_bounds__(kThreads, 2)                                                        \
      NAME(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* uniforms,             \
           __nv_bfloat16* out, int* counts, float* slice_stats, float* partial, int* arrive, int* depart, int n,       \
           int hkv, int slice_len, float scale, int budget) {                                                       \
    prop_one_launch<D, G, U>(q, k, v, uniforms, out, counts, slice_stats, partial, arrive, depart, n, hkv, slice_len, \
                             scale, budget);                                                                         \
  }

SANTA_PROP_ONE_LAUNCH(prop1_d128_g4, 128, 4, 1)  // not yet run on a GPU
SANTA_PROP_ONE_LAUNCH(prop1_d64_g7, 64, 7, 4)
SANTA_PROP_ONE_LAUNCH(prop1_d64_g3, 64, 3, 4)
