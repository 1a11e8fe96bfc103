#pragma once
// The row-at-a-time reference implementation of the attention kernel family's forward and
// backward (include/shardtensor/exec/attention.hpp): one query row at a time, online softmax,
// every sum in double. It was the CPU table until the blocked kernels of src/exec/attention_cpu.cpp
// replaced it; the tests compare the blocked CPU kernels and the CUDA kernels against it (and
// against an explicit softmax). T = float or double; lse in float for float, double for double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "shardtensor/exec/attention.hpp"

namespace shard::test::attention_reference {

using exec::AttnGeom;
using exec::AttnIn;
using exec::AttnMask;
using exec::AttnOut;

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <class T>
struct Ops {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
};

template <class T>
inline double score(const AttnGeom& g, const T* qi, const T* kj, const AttnMask& m, index_t b, index_t h, index_t i,
             index_t j) {
  if (m.causal && m.k_pos0 + j > m.q_pos0 + i) return kNegInf;
  double s = 0;
  for (index_t d = 0; d < g.D; ++d) s += static_cast<double>(qi[d]) * static_cast<double>(kj[d]);
  s *= m.scale;
  if (m.bias) {
    const double bias =
        static_cast<const T*>(m.bias)[b * m.bias_sb + h * m.bias_sh + i * m.bias_sq + j * m.bias_sk];
    s += bias;
  }
  return s;
}

template <class T>
inline void forward(const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse_v) {
  using Acc = typename Ops<T>::Acc;
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  T* O = static_cast<T*>(out.data);
  Acc* L = static_cast<Acc*>(lse_v);
  std::vector<double> acc(static_cast<std::size_t>(g.Dv));
  for (index_t b = 0; b < g.B; ++b)
    for (index_t h = 0; h < g.H; ++h)
      for (index_t i = 0; i < g.Nq; ++i) {
        const T* qi = Q + b * q.sb + h * q.sh + i * q.sn;
        double mx = kNegInf, l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (index_t j = 0; j < g.Nk; ++j) {
          const double s = score(g, qi, K + b * k.sb + h * k.sh + j * k.sn, m, b, h, i, j);
          if (s == kNegInf) continue;
          const T* vj = V + b * v.sb + h * v.sh + j * v.sn;
          if (s > mx) {
            const double c = mx == kNegInf ? 0.0 : std::exp(mx - s);
            l *= c;
            for (auto& a : acc) a *= c;
            mx = s;
          }
          const double p = std::exp(s - mx);
          l += p;
          for (index_t d = 0; d < g.Dv; ++d) acc[static_cast<std::size_t>(d)] += p * static_cast<double>(vj[d]);
        }
        T* oi = O + b * out.sb + h * out.sh + i * out.sn;
        if (l == 0) {
          for (index_t d = 0; d < g.Dv; ++d) oi[d] = T(0);
          L[(b * g.H + h) * g.Nq + i] = static_cast<Acc>(kNegInf);
        } else {
          for (index_t d = 0; d < g.Dv; ++d) oi[d] = static_cast<T>(acc[static_cast<std::size_t>(d)] / l);
          L[(b * g.H + h) * g.Nq + i] = static_cast<Acc>(mx + std::log(l));
        }
      }
}

template <class T>
inline void backward(const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout, const void* lse_v,
                const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv) {
  using Acc = typename Ops<T>::Acc;
  const T* Q = static_cast<const T*>(q.data);
  const T* K = static_cast<const T*>(k.data);
  const T* V = static_cast<const T*>(v.data);
  const T* O = static_cast<const T*>(out.data);
  const T* dO = static_cast<const T*>(dout.data);
  const Acc* L = static_cast<const Acc*>(lse_v);
  T* dQ = static_cast<T*>(dq.data);
  T* dK = static_cast<T*>(dk.data);
  T* dV = static_cast<T*>(dv.data);
  std::vector<double> dqi(static_cast<std::size_t>(g.D));
  for (index_t b = 0; b < g.B; ++b)
    for (index_t h = 0; h < g.H; ++h)
      for (index_t i = 0; i < g.Nq; ++i) {
        const double lse = static_cast<double>(L[(b * g.H + h) * g.Nq + i]);
        if (lse == kNegInf) continue;
        const T* qi = Q + b * q.sb + h * q.sh + i * q.sn;
        const T* oi = O + b * out.sb + h * out.sh + i * out.sn;
        const T* doi = dO + b * dout.sb + h * dout.sh + i * dout.sn;
        double delta = 0;
        for (index_t d = 0; d < g.Dv; ++d) delta += static_cast<double>(doi[d]) * static_cast<double>(oi[d]);
        std::fill(dqi.begin(), dqi.end(), 0.0);
        for (index_t j = 0; j < g.Nk; ++j) {
          const T* kj = K + b * k.sb + h * k.sh + j * k.sn;
          const double s = score(g, qi, kj, m, b, h, i, j);
          if (s == kNegInf) continue;
          const double p = std::exp(s - lse);
          const T* vj = V + b * v.sb + h * v.sh + j * v.sn;
          if (dV) {
            T* dvj = dV + b * dv.sb + h * dv.sh + j * dv.sn;
            for (index_t d = 0; d < g.Dv; ++d) dvj[d] = static_cast<T>(dvj[d] + p * static_cast<double>(doi[d]));
          }
          double dp = 0;
          for (index_t d = 0; d < g.Dv; ++d) dp += static_cast<double>(doi[d]) * static_cast<double>(vj[d]);
          const double ds = p * (dp - delta) * m.scale;
          for (index_t d = 0; d < g.D; ++d) dqi[static_cast<std::size_t>(d)] += ds * static_cast<double>(kj[d]);
          if (dK) {
            T* dkj = dK + b * dk.sb + h * dk.sh + j * dk.sn;
            for (index_t d = 0; d < g.D; ++d) dkj[d] = static_cast<T>(dkj[d] + ds * static_cast<double>(qi[d]));
          }
        }
        if (dQ) {
          T* dqp = dQ + b * dq.sb + h * dq.sh + i * dq.sn;
          for (index_t d = 0; d < g.D; ++d) dqp[d] = static_cast<T>(dqp[d] + dqi[static_cast<std::size_t>(d)]);
        }
      }
}

}  // namespace shard::test::attention_reference
