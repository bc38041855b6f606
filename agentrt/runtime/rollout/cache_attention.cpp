// Attention of a step's queries over a static KV cache: for each row and head, one pass over
// its keys and one over its values per query (agentrt/rollout/kernels.py says why and how it is
// built).
//
// q [b, heads, s, d] in the cache's dtype; k_cache, v_cache [b, kv_heads, capacity, d]
// contiguous; attend [b, 1, s, keys] bool, its last dimension contiguous: the keys
// 0..keys-1 each query may see. Returns softmax(q k^T * scale) v [b, heads, s, d] in the
// cache's dtype, with fp32 scores, softmax and sums.

// ATen's vector types pick their instructions from CPU_CAPABILITY_* (inductor passes it on its
// command line); here it follows the -march=native the loader builds with.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

inline Vec load(const float* x) { return Vec::loadu(x); }

inline Vec load(const c10::BFloat16* x) {
  return at::vec::convert<float>(at::vec::Vectorized<c10::BFloat16>::loadu(x, Vec::size()));
}

inline void store(const Vec& x, float* out) { x.store(out); }

inline void store(const Vec& x, c10::BFloat16* out) {
  at::vec::convert<c10::BFloat16>(x).store(out, Vec::size());
}

inline float sum_of(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

struct Shape {
  int64_t rows, heads, kv_heads, queries, d, keys, capacity, ok_row, ok_query;
  float scale;
};

// N > 0: d == N x Vec::size(), each query and its weighted sum of values held in registers;
// N == 0: any d, scalar loops.
template <int N, typename T>
void attend(const T* q, const T* k, const T* v, const bool* ok_all, T* out, const Shape& z) {
  const int64_t d = N > 0 ? N * Vec::size() : z.d, groups = z.heads / z.kv_heads;
  const float lowest = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, z.rows * z.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(z.keys + Vec::size()), qf(d), acc(d);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = i / z.heads;
      const int64_t base = (row * z.kv_heads + i % z.heads / groups) * z.capacity * d;
      if (i + 1 < end) {  // the next block on its way from memory (the hardware prefetcher
        // stops at each short block): 0.40 -> ~0.2 ms a call in a llama-small bf16 decode step
        const int64_t next =
            ((i + 1) / z.heads * z.kv_heads + (i + 1) % z.heads / groups) * z.capacity * d;
        for (int64_t b = 0; b < z.keys * d; b += 64 / static_cast<int64_t>(sizeof(T))) {
          __builtin_prefetch(k + next + b);
          __builtin_prefetch(v + next + b);
        }
      }
      for (int64_t s = 0; s < z.queries; ++s) {
        const bool* ok = ok_all + row * z.ok_row + s * z.ok_query;
        const T* qs = q + (i * z.queries + s) * d;
        Vec qv[N > 0 ? N : 1], sums[N > 0 ? N : 1];
        for (int n = 0; n < N; ++n) qv[n] = load(qs + n * Vec::size()) * Vec(z.scale);
        for (int64_t c = 0; N == 0 && c < d; ++c) qf[c] = static_cast<float>(qs[c]) * z.scale;
        float top = lowest;
        for (int64_t j = 0; j < z.keys; ++j) {
          p[j] = lowest;  // exp(-inf) = 0: a masked key weighs nothing
          if (!ok[j]) continue;
          const T* kj = k + base + j * d;
          if constexpr (N > 0) {
            Vec dot = qv[0] * load(kj);
            for (int n = 1; n < N; ++n) dot = at::vec::fmadd(qv[n], load(kj + n * Vec::size()), dot);
            p[j] = sum_of(dot);
          } else {
            float dot = 0.f;
            for (int64_t c = 0; c < d; ++c) dot += qf[c] * static_cast<float>(kj[c]);
            p[j] = dot;
          }
          top = p[j] > top ? p[j] : top;
        }
        Vec total(0.f);
        int64_t j = 0;
        for (; j + Vec::size() <= z.keys; j += Vec::size()) {
          Vec e = (Vec::loadu(p.data() + j) - Vec(top)).exp();
          e.store(p.data() + j);
          total = total + e;
        }
        float sum = sum_of(total);
        for (; j < z.keys; ++j) {
          p[j] = std::exp(p[j] - top);
          sum += p[j];
        }
        for (int n = 0; n < N; ++n) sums[n] = Vec(0.f);
        for (int64_t c = 0; N == 0 && c < d; ++c) acc[c] = 0.f;
        for (int64_t j = 0; j < z.keys; ++j) {
          if (p[j] == 0.f) continue;
          const T* vj = v + base + j * d;
          for (int n = 0; n < N; ++n)
            sums[n] = at::vec::fmadd(Vec(p[j]), load(vj + n * Vec::size()), sums[n]);
          for (int64_t c = 0; N == 0 && c < d; ++c) acc[c] += p[j] * static_cast<float>(vj[c]);
        }
        T* o = out + (i * z.queries + s) * d;
        for (int n = 0; n < N; ++n) store(sums[n] * Vec(1.f / sum), o + n * Vec::size());
        for (int64_t c = 0; N == 0 && c < d; ++c) o[c] = static_cast<T>(acc[c] / sum);
      }
    }
  });
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
         at::Tensor& out, const Shape& z) {
  const auto args = std::make_tuple(q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(),
                                    mask.data_ptr<bool>(), out.data_ptr<T>(), z);
  auto call = [&](auto kernel) { std::apply(kernel, args); };
  if (z.d == Vec::size()) return call(attend<1, T>);
  if (z.d == 2 * Vec::size()) return call(attend<2, T>);
  if (z.d == 4 * Vec::size()) return call(attend<4, T>);
  if (z.d == 8 * Vec::size()) return call(attend<8, T>);
  call(attend<0, T>);
}

at::Tensor cache_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& attend_mask,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "cache_attention: q [b, heads, s, d], caches [b, kv_heads, capacity, d]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "cache_attention: q and the caches of one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "cache_attention: fp32 or bf16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "cache_attention: contiguous caches");
  TORCH_CHECK(attend_mask.scalar_type() == at::kBool && attend_mask.dim() == 4 &&
                  attend_mask.size(1) == 1 && attend_mask.stride(3) == 1,
              "cache_attention: attend [b, 1, s, keys] bool");
  TORCH_CHECK(k_cache.size(0) == q.size(0) && k_cache.size(3) == q.size(3) &&
                  q.size(1) % k_cache.size(1) == 0 && attend_mask.size(0) == q.size(0) &&
                  attend_mask.size(2) == q.size(2) && attend_mask.size(3) <= k_cache.size(2),
              "cache_attention: shapes do not match");
  const Shape z{q.size(0), q.size(1), k_cache.size(1), q.size(2), q.size(3),
                attend_mask.size(3), k_cache.size(2), attend_mask.stride(0),
                attend_mask.stride(2), static_cast<float>(scale)};
  at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty_like(qc);
  if (q.scalar_type() == at::kFloat) {
    run<float>(qc, k_cache, v_cache, attend_mask, out, z);
  } else {
    run<c10::BFloat16>(qc, k_cache, v_cache, attend_mask, out, z);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(agentrt_kernels, m) {
  m.def("cache_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor attend, float scale)"
        " -> Tensor");
}

TORCH_LIBRARY_IMPL(agentrt_kernels, CPU, m) { m.impl("cache_attention", &cache_attention); }
