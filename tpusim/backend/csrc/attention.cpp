// Scaled dot-product attention on "tpu" as one fused attention op.
//
// Why: F.scaled_dot_product_attention asks a per-device stub which kernel to use; a device without
// one gets the math path (bmm + softmax + bmm through memory), which is neither what a TPU runs
// (one flash-attention kernel) nor what CPU computes (its flash kernel). PyTorch lets a PrivateUse1
// backend answer "overrideable" and then calls _scaled_dot_product_fused_attention_overrideable,
// which tpusim/backend/kernels.py runs as CPU's own flash kernel on the host aliases (CPU-exact).
// The choice follows CPU's: where CPU would use its flash kernel (and no dropout or grouped-query
// attention needs another path), the fused op; otherwise the math path, as on CPU. torch.compile
// traces the math path (see below). With the math path switched off and the overrideable one on
// (sdpa_kernel(SDPBackend.OVERRIDEABLE), TorchTPU's own attention), the fused op is the answer.
#include <ATen/ATen.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/native/transformers/attention.h>

namespace {

constexpr int64_t kMath = 0;          // sdp::SDPBackend::math
constexpr int64_t kFlash = 1;         // sdp::SDPBackend::flash_attention
constexpr int64_t kOverrideable = 4;  // sdp::SDPBackend::overrideable

int64_t tpu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  // Under torch.compile's tracing (fake or functional tensors: the Python key) the math path is traced,
  // so the graph holds ops the JAX lowering has and XLA fuses the attention itself.
  const bool tracing = query.key_set().has(c10::DispatchKey::Python);
  const bool fusable = dropout_p == 0.0 && !enable_gqa && !tracing;
  const auto& context = at::globalContext();
  if (!context.userEnabledMathSDP() && context.userEnabledOverrideableSDP() && fusable) return kOverrideable;
  // CPU's chooser reads only shapes, strides, dtypes and flags, so it is asked directly through its CPU
  // kernel (the device's fallback never sees it, so nothing is recorded: choosing is host work)
  const int64_t cpu_choice = at::_ops::_fused_sdp_choice::redispatch(
      c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value, attn_mask, dropout_p, is_causal, scale,
      enable_gqa);
  return cpu_choice == kFlash && fusable ? kOverrideable : kMath;
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpu_fused_sdp_choice)
}  // namespace at::native
