#pragma once
/// \file conv_options.hpp
/// The user-facing hyper-parameters of the convolution family: ConvOptions (conv, and the
/// single-rank conv of conv_local.hpp) and ConvTransposeOptions (conv_transpose). The kernel
/// family below sees one struct, ConvGeometry (exec/conv.hpp), built from these by the schedule.
#include <array>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/dist/boundary.hpp"

namespace shard::nn::functional {

/// Hyper-parameters of an S-dimensional convolution. Designated initialisers work:
/// ConvOptions<2>{.stride = {2, 2}, .pad_lo = {1, 1}, .pad_hi = {0, 0}}.
template <int S>
struct ConvOptions {
  static_assert(S >= 1 && S <= 3, "ConvOptions: 1, 2 or 3 spatial dims");
  /// All-ones shape (the default stride and dilation).
  static constexpr Shape<S> ones() {
    Shape<S> s{};
    for (auto& e : s) e = 1;
    return s;
  }
  Shape<S> stride = ones();               ///< step between outputs (>= 1)
  Shape<S> dilation = ones();             ///< spacing between taps (>= 1)
  Shape<S> pad_lo{};                      ///< padding before the first input cell, per dim
  Shape<S> pad_hi{};                      ///< padding after the last input cell, per dim
  index_t groups = 1;                     ///< channel groups (divides C_in and C_out)
  std::array<Boundary, S> padding_mode{}; ///< per dim: zero (default), periodic, reflect, replicate

  /// `pad` on both sides of every dim, uniform stride / dilation, one padding mode.
  static ConvOptions symmetric(index_t pad, index_t stride = 1, index_t dilation = 1, index_t groups = 1,
                               Boundary mode = Boundary::zero) {
    ConvOptions o;
    o.stride.fill(stride);
    o.dilation.fill(dilation);
    o.pad_lo.fill(pad);
    o.pad_hi.fill(pad);
    o.groups = groups;
    o.padding_mode.fill(mode);
    return o;
  }
  /// PyTorch padding='same' (stride 1): total dilation*(k-1) per dim, the smaller half below.
  static ConvOptions same(const Shape<S>& kernel, index_t dilation = 1, Boundary mode = Boundary::zero,
                          index_t groups = 1) {
    ConvOptions o = symmetric(0, 1, dilation, groups, mode);
    for (int d = 0; d < S; ++d) {
      const index_t span = dilation * (kernel[d] - 1);
      o.pad_lo[d] = span / 2;
      o.pad_hi[d] = span - span / 2;
    }
    return o;
  }
};

/// Hyper-parameters of an S-dimensional transposed convolution (zero padding).
template <int S>
struct ConvTransposeOptions {
  Shape<S> stride = ConvOptions<S>::ones();    ///< upsampling step (>= 1)
  Shape<S> dilation = ConvOptions<S>::ones();  ///< spacing between taps (>= 1)
  Shape<S> pad_lo{};                           ///< cropped from the start of the full output, per dim
  Shape<S> pad_hi{};                           ///< cropped from the end of the full output, per dim
  Shape<S> output_padding{};                   ///< extra cells at the end (0 <= op < max(stride, dilation))
  index_t groups = 1;                          ///< channel groups

  /// `pad` on both sides, uniform stride / dilation / output padding.
  static ConvTransposeOptions symmetric(index_t pad, index_t stride = 1, index_t dilation = 1, index_t groups = 1,
                                        index_t output_padding = 0) {
    ConvTransposeOptions o;
    o.stride.fill(stride);
    o.dilation.fill(dilation);
    o.pad_lo.fill(pad);
    o.pad_hi.fill(pad);
    o.output_padding.fill(output_padding);
    o.groups = groups;
    return o;
  }
};

}  // namespace shard::nn::functional
