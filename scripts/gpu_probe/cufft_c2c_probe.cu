// Probe (device machine): the r2c-then-c2c pass sequence of the fft table for shape {6,5,7},
// dims {0,2} (D2Z over dim 2, then an in-place Z2Z over dim 0 of the [6,5,4] spectrum), with the
// work area handed over as the library does, and variants. Prints one line per variant.
#include <cufft.h>
#include <cuda_runtime.h>
#include <cstdio>

static cufftResult plan(cufftHandle* h, bool autoalloc, cufftType t, long long n, long long ie, long long istride,
                        long long idist, long long oe, long long ostride, long long odist, long long batch,
                        size_t* work) {
  cufftCreate(h);
  if (!autoalloc) cufftSetAutoAllocation(*h, 0);
  long long nn[1] = {n}, iee[1] = {ie}, oee[1] = {oe};
  return cufftMakePlanMany64(*h, 1, nn, iee, istride, idist, oee, ostride, odist, t, batch, work);
}

static void variant(const char* name, bool autoalloc, bool inplace, long long inner) {
  double* in;
  cufftDoubleComplex *out, *out2;
  cudaMalloc(&in, 6 * 5 * 7 * 8);
  cudaMalloc(&out, 6 * inner * 16 + 4096);
  cudaMalloc(&out2, 6 * inner * 16 + 4096);
  cudaMemset(in, 0, 6 * 5 * 7 * 8);
  cufftHandle a, b;
  size_t wa = 0, wb = 0;
  cufftResult pa = plan(&a, autoalloc, CUFFT_D2Z, 7, 7, 1, 7, 4, 1, 4, 30, &wa);
  cufftResult pb = plan(&b, autoalloc, CUFFT_Z2Z, 6, 6, inner, 1, 6, inner, 1, inner, &wb);
  void* work = nullptr;
  size_t wbytes = (wa > wb ? wa : wb);
  cudaMalloc(&work, wbytes > 0 ? wbytes : 1);
  if (!autoalloc) {
    cufftSetWorkArea(a, work);
    cufftSetWorkArea(b, work);
  }
  cufftResult ea = cufftExecD2Z(a, in, out);
  cudaError_t sa = cudaDeviceSynchronize();
  cufftResult eb = cufftExecZ2Z(b, out, inplace ? out : out2, CUFFT_FORWARD);
  cudaError_t sb = cudaDeviceSynchronize();
  std::printf("PROBE %-28s autoalloc=%d inplace=%d inner=%lld: plan %d/%d work %zu/%zu exec D2Z %d (sync %d) Z2Z %d (sync %d)\n",
              name, autoalloc, inplace, inner, int(pa), int(pb), wa, wb, int(ea), int(sa), int(eb), int(sb));
  cufftDestroy(a);
  cufftDestroy(b);
  cudaFree(in);
  cudaFree(out);
  cudaFree(out2);
  cudaFree(work);
}

int main() {
  variant("library", false, true, 20);
  variant("autoalloc", true, true, 20);
  variant("out-of-place", false, false, 20);
  variant("inner 35 (c2c test)", false, true, 35);
  variant("inner 21", false, true, 21);
  variant("inner 24", false, true, 24);
  // the Z2Z alone, fresh
  {
    cufftHandle b;
    size_t wb = 0;
    cufftResult pb = plan(&b, true, CUFFT_Z2Z, 6, 6, 20, 1, 6, 20, 1, 20, &wb);
    cufftDoubleComplex* d;
    cudaMalloc(&d, 6 * 20 * 16);
    cufftResult eb = cufftExecZ2Z(b, d, d, CUFFT_FORWARD);
    std::printf("PROBE Z2Z alone autoalloc in-place inner 20: plan %d work %zu exec %d sync %d\n", int(pb), wb, int(eb),
                int(cudaDeviceSynchronize()));
  }
  return 0;
}
