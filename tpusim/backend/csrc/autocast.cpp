// torch.autocast("tpu"): the same op lists as CUDA (matmuls/convolutions in the low-precision
// dtype, numerically sensitive ops in float32). The low-precision dtype defaults to bfloat16,
// the TPU's (set in tpusim/backend/device/registration.py with torch.set_autocast_dtype).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using namespace at::autocast;

#define TPUSIM_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPUSIM_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPUSIM_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPUSIM_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TPUSIM_LOW)
  AT_FORALL_FP32(TPUSIM_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPUSIM_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPUSIM_PROMOTE)
}

}  // namespace
