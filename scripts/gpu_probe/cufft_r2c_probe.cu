// Probe (device machine): which strided R2C / D2Z layouts of the fft table's pass plan does cuFFT
// execute, and does the real pointer's alignment matter? Prints one line per variant.
#include <cufft.h>
#include <cuda_runtime.h>
#include <cstdio>

static void run(const char* name, bool f64, long long n, long long istride, long long idist, long long ostride,
                long long odist, long long batch, long long in_off_reals) {
  cufftHandle h;
  cufftCreate(&h);
  long long nn[1] = {n}, ie[1] = {n}, oe[1] = {n / 2 + 1};
  size_t work = 0;
  cufftResult rp = cufftMakePlanMany64(h, 1, nn, ie, istride, idist, oe, ostride, odist, f64 ? CUFFT_D2Z : CUFFT_R2C,
                                      batch, &work);
  void *in, *out;
  cudaMalloc(&in, 1 << 24);
  cudaMalloc(&out, 1 << 24);
  cudaMemset(in, 0, 1 << 24);
  cufftResult re = CUFFT_SUCCESS;
  if (rp == CUFFT_SUCCESS) {
    char* ip = static_cast<char*>(in) + in_off_reals * (f64 ? 8 : 4);
    re = f64 ? cufftExecD2Z(h, reinterpret_cast<cufftDoubleReal*>(ip), static_cast<cufftDoubleComplex*>(out))
             : cufftExecR2C(h, reinterpret_cast<cufftReal*>(ip), static_cast<cufftComplex*>(out));
  }
  cudaError_t ce = cudaDeviceSynchronize();
  std::printf("PROBE %-34s %s n=%lld istride=%lld idist=%lld ostride=%lld odist=%lld batch=%lld in_off=%lld: plan=%d exec=%d cuda=%d\n",
              name, f64 ? "D2Z" : "R2C", n, istride, idist, ostride, odist, batch, in_off_reals, int(rp), int(re), int(ce));
  cufftDestroy(h);
  cudaFree(in);
  cudaFree(out);
}

int main() {
  for (bool f64 : {true, false}) {
    // {2,13,40} dims {1}: batch over inner 40, loop over outer (step 520 reals)
    run("mid outer<inner, loop0", f64, 13, 40, 1, 40, 1, 40, 0);
    run("mid outer<inner, loop1", f64, 13, 40, 1, 40, 1, 40, 520);
    // {40,13,2} dims {1}: batch over outer 40 (idist 26), loop over inner 2 (step 1 real)
    run("mid outer>inner, loop0", f64, 13, 2, 26, 2, 14, 40, 0);
    run("mid outer>inner, loop1 (odd)", f64, 13, 2, 26, 2, 14, 40, 1);
    run("aligned base, unit stride", f64, 13, 1, 13, 1, 7, 4, 0);
    run("odd offset, unit stride", f64, 13, 1, 13, 1, 7, 4, 1);
    run("even offset, unit stride", f64, 13, 1, 13, 1, 7, 4, 2);
  }
  return 0;
}
