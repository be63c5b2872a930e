// Scaled dot-product attention on "tpu": the backend TorchTPU's chooser takes, so the recording holds the op
// a TPU runs.
//
// Why: F.scaled_dot_product_attention asks a per-device stub which kernel to use (_fused_sdp_choice_stub).
// TorchTPU registers its own chooser (AtenFusedSdpChoice, torch_tpu/csrc/ops/scaled_dot_product_attention/
// scaled_dot_product_attention_aten_kernels.cc); this one answers as it does, from the same conditions
// (tpusim/report/data/torchtpu_attention.toml lists them with their source, and docs/eager-modes.md maps them):
//  1. flash attention (SDPBackend.FLASH_ATTENTION) when the flash backend is enabled, the query is float32 or
//     bfloat16 of rank >= 4 with a batch, query, key and value have one rank, the head dim is below 128 or a
//     multiple of it, and there is no dropout. enable_gqa is not among the conditions: TorchTPU's kernel reads
//     grouped K/V as they are. PyTorch then calls _scaled_dot_product_flash_attention_for_cpu on the device,
//     which the fallback runs as CPU's own flash kernel (CPU-exact; it takes grouped K/V too);
//  2. else, with math or the overrideable backend enabled, TorchTPU's StableHLO "optimized MATH" path
//     (SDPBackend.OVERRIDEABLE) for floating inputs of one rank >= 4 without dropout: PyTorch calls
//     _scaled_dot_product_fused_attention_overrideable, run by tpusim/backend/aten/handwritten_kernels.py as CPU's flash
//     kernel for the values and priced as the scores through HBM (tpusim/trace/cost_rules.py, sdpa_math);
//  3. else PyTorch's math decomposition (bmm + softmax + bmm).
// Under torch.compile's tracing (fake or functional tensors: the Python key) the math path is traced, so the
// graph holds ops the JAX lowering has; tpusim/backend/aten/flash_attention.py then rewrites it to one fused op.
#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>

namespace {

constexpr int64_t kMath = 0;          // sdp::SDPBackend::math
constexpr int64_t kFlash = 1;         // sdp::SDPBackend::flash_attention
constexpr int64_t kOverrideable = 4;  // sdp::SDPBackend::overrideable
constexpr int64_t kFlashBlock = 128;  // TorchTPU's min_block_size: the head dim is below it or a multiple

int64_t batch_of(const at::Tensor& query) {
  int64_t batch = 1;
  for (int64_t d = 0; d + 3 < query.dim(); ++d) batch *= query.size(d);
  return batch;
}

int64_t tpu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  if (query.key_set().has(c10::DispatchKey::Python)) return kMath;   // torch.compile tracing (see above)
  const auto& context = at::globalContext();
  const bool consistent_ranks = query.dim() == key.dim() && query.dim() == value.dim();
  const bool has_batch = query.dim() >= 4;
  const bool no_dropout = dropout_p == 0.0;
  if (context.userEnabledFlashSDP()) {
    const auto dtype = query.scalar_type();
    const int64_t head_dim = query.size(-1);
    const bool flash_dtype = dtype == at::kFloat || dtype == at::kBFloat16;
    const bool flash_head = head_dim < kFlashBlock || head_dim % kFlashBlock == 0;
    if (flash_dtype && has_batch && batch_of(query) >= 1 && flash_head && consistent_ranks && no_dropout) {
      return kFlash;
    }
  }
  const bool overrideable = context.userEnabledMathSDP() || context.userEnabledOverrideableSDP();
  if (overrideable && consistent_ranks && has_batch && no_dropout && c10::isFloatingType(query.scalar_type())) {
    return kOverrideable;
  }
  TORCH_CHECK(context.userEnabledMathSDP(), "no viable SDPBackend: every backend TorchTPU runs is disabled, "
              "including the fallback MATH backend; enable FLASH, OVERRIDEABLE or MATH");
  return kMath;
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpu_fused_sdp_choice)
}  // namespace at::native
