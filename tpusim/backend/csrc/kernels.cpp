// Native kernels of the "tpu" device and the host aliases the Python fallback runs ops on.
//
// Only what must not go through the boxed fallback (fallback.cpp) lives here: factories (they allocate),
// views and set_ (they must share storage), resize_ (it grows device storage), copies between
// host and device, _local_scalar_dense (a host sync) and _has_compatible_shallow_copy_type (asked
// of both the CPU and the tpu tensor, so never a host alias). Everything else is the fallback.
#include "tpu_shim.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/op_registration.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include <cstring>
#include <sstream>
#include <unordered_map>

namespace tpusim {

std::atomic<bool> g_native_hook_on{false};
NativeHook g_native_hook;

namespace {

constexpr c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

// The native hook's listeners first (the PJRT fused window runs pending work), then the recording log.
void notify(const char* kind, const at::Tensor& a, const at::Tensor* b, bool non_blocking = false,
            bool offload = false) {
  if (g_native_hook_on.load(std::memory_order_relaxed) && g_native_hook) {
    g_native_hook(kind, a, b);
  }
  if (g_recording.load(std::memory_order_relaxed)) {
    log_native(kind, a, b, non_blocking, offload);
  }
}

// Whether a device->host copy keeps an activation on the host (an offload) rather than reading a value: a
// non_blocking copy (the program cannot read it before a sync), a copy into pinned memory (a transfer
// buffer), or one a saved-tensors pack hook makes (save_on_cpu, saved_tensors_hooks). Asked only where it
// matters: shape-only mode (an offload's host copy holds no values, any other copy raises) and recording.
bool is_offload(const at::Tensor& dst, bool non_blocking) {
  if (!config().no_data && !g_recording.load(std::memory_order_relaxed)) {
    return false;
  }
  return non_blocking || dst.is_pinned() || in_pack_hook();
}

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    return device->index();
  }
  return current_device();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype_opt,
                               std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                               std::optional<bool> pin_memory_opt,
                               std::optional<c10::MemoryFormat> memory_format_opt) {
  const auto dtype = c10::dtype_or_default(dtype_opt);
  TORCH_CHECK(c10::layout_or_default(layout_opt) == c10::Layout::Strided,
              "tpusim: only strided (dense) tensors are supported on tpu");
  const c10::DeviceIndex prev = current_device();
  set_current_device(index_of(device_opt));
  try {
    auto t = at::detail::empty_generic(size, device_allocator(), kDeviceKeys, dtype, memory_format_opt);
    set_current_device(prev);
    return t;
  } catch (...) {
    set_current_device(prev);
    throw;
  }
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype_opt,
                         std::optional<c10::Layout> layout_opt, std::optional<c10::Device> device_opt,
                         std::optional<bool> pin_memory_opt) {
  const auto dtype = c10::dtype_or_default(dtype_opt);
  TORCH_CHECK(c10::layout_or_default(layout_opt) == c10::Layout::Strided,
              "tpusim: only strided (dense) tensors are supported on tpu");
  const c10::DeviceIndex prev = current_device();
  set_current_device(index_of(device_opt));
  try {
    auto t = at::detail::empty_strided_generic(size, stride, device_allocator(), kDeviceKeys, dtype);
    set_current_device(prev);
    return t;
  } catch (...) {
    set_current_device(prev);
    throw;
  }
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

void grow_to_fit(c10::TensorImpl* impl) {
  if (impl->numel() == 0) {
    return;
  }
  const size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->dtype().itemsize(),
                                                         impl->storage_offset());
  auto* storage = impl->storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    resize_storage_bytes(storage, needed);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size_sym,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto size = C10_AS_INTARRAYREF_SLOW(size_sym);
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) {
    impl->set_sizes_contiguous(size);
    grow_to_fit(impl);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device_type() == c10::DeviceType::PrivateUse1,
              "tpusim: set_ expects a tpu storage, got one on ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  impl->set_storage_offset(storage_offset);
  if (stride.data() != nullptr) {
    impl->set_sizes_and_strides(size, stride);
  } else {
    impl->set_sizes_contiguous(size);
  }
  grow_to_fit(impl);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, allocate_on(0, self.device().index()), device_allocator(),
                     true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool src_dev = self.is_privateuseone();
  const bool dst_dev = dst.is_privateuseone();
  const bool offload = src_dev && !dst_dev && is_offload(dst, non_blocking);
  if (config().no_data) {
    if (!dst_dev && !offload) {
      shape_only_error("copy the values to the host (.cpu(), .numpy(), .tolist(), print)", self);
    }
  } else {
    at::Tensor s = src_dev ? host_alias(self) : self;
    at::Tensor d = dst_dev ? host_alias(dst) : dst;
    at::native::copy_(d, s, non_blocking);
  }
  notify("copy", self, &dst, non_blocking, offload);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sym_sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (config().no_data) {
    shape_only_error("read the value (.item(), bool(), float(), print, data-dependent control flow)", self);
  }
  notify("item", self, nullptr);
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

// Module._apply (module.to("tpu"), .cpu(), .to_empty(), .half()) and `param.data = t` ask this whether
// a tensor's data may be swapped in place (`.data =`), which keeps each Parameter object: ties stay
// tied and an optimizer built before the move keeps working. c10 answers yes for dense tensors on
// CPU, CUDA and the other built-in accelerators, and leaves PrivateUse1 to the backend (the comment
// above TensorImpl::has_compatible_shallow_copy_type; OpenReg overrides this op too). Answer as for
// CUDA: a dense tpu tensor is compatible with any dense tensor of those backends; everything else
// (sparse, meta: a meta -> tpu to_empty makes new Parameters on CUDA too) keeps c10's answer.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) {
    return true;
  }
  auto is_dense = [](c10::DispatchKeySet ks) {
    using B = c10::BackendComponent;
    constexpr auto backends = c10::DispatchKeySet({B::CPUBit, B::CUDABit, B::MPSBit, B::HIPBit, B::XPUBit, B::HPUBit,
                                                   B::MTIABit, B::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
  };
  return is_dense(self.key_set()) && is_dense(from.key_set());
}

// ---------------------------------------------------------------- host aliases

struct AliasCtx {
  c10::intrusive_ptr<c10::StorageImpl> target;
};

void delete_alias(void* ctx) { delete static_cast<AliasCtx*>(ctx); }

const AliasCtx* alias_ctx(const c10::StorageImpl* s) {
  const auto& dp = s->data_ptr();
  if (dp.get_deleter() != &delete_alias) {
    return nullptr;
  }
  return static_cast<const AliasCtx*>(dp.get_context());
}

void copy_math_bits(const at::Tensor& from, const at::Tensor& to) {
  if (from.is_conj()) {
    to.unsafeGetTensorImpl()->_set_conj(true);
  }
  if (from.is_neg()) {
    to.unsafeGetTensorImpl()->_set_neg(true);
  }
}

}  // namespace

bool is_host_alias(const c10::StorageImpl* storage) { return alias_ctx(storage) != nullptr; }

[[noreturn]] void shape_only_error(const char* what, const at::Tensor& t) {
  std::ostringstream shape;
  shape << t.sizes();
  TORCH_CHECK(false, "tpusim: cannot ", what, " of a tpu tensor (shape ", shape.str(), ", ", t.scalar_type(),
              ") in shape-only mode (TPUSIM_NUMERICS=off): tensors have shapes but no values. Remove the value "
              "read, or run with TPUSIM_NUMERICS=on",
              std::strncmp(what, "copy", 4) == 0 ? " (to keep an activation on the host, copy it with "
                                                   "non_blocking=True or under torch.autograd.graph.save_on_cpu)."
                                                 : ".");
}

// A CPU tensor over the same memory as `t` (meta in shape-only mode) covering its whole storage,
// so storage offsets, views and in-place writes carry over unchanged. Its storage is resizable:
// if a CPU kernel grows an out= argument, sync_back() moves the result into device memory.
at::Tensor host_alias(const at::Tensor& t) {
  auto* si = t.storage().unsafeGetStorageImpl();
  const bool meta = config().no_data;
  auto* ctx = new AliasCtx{c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(si)};
  const c10::Device dev = meta ? c10::Device(c10::DeviceType::Meta) : c10::Device(c10::DeviceType::CPU);
  void* data = meta ? nullptr : si->mutable_data();
  c10::DataPtr dp(data, ctx, &delete_alias, dev);
  c10::Allocator* alloc = meta ? c10::GetAllocator(c10::DeviceType::Meta) : c10::GetCPUAllocator();
  c10::Storage storage(c10::Storage::use_byte_size_t(), si->nbytes(), std::move(dp), alloc, true);
  const auto keys = c10::DispatchKeySet(meta ? c10::DispatchKey::Meta : c10::DispatchKey::CPU);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  copy_math_bits(t, out);
  return out;
}

// Map host results of a fallback op back to the device: a view of a host alias becomes a view
// of the device storage it aliases; a fresh host result is adopted without a copy (its bytes are
// counted against HBM). Outputs sharing one host storage share one device storage.
std::vector<at::Tensor> to_device(const std::vector<at::Tensor>& outs, c10::DeviceIndex device) {
  std::vector<at::Tensor> result;
  result.reserve(outs.size());
  std::unordered_map<const c10::StorageImpl*, c10::Storage> seen;
  for (const auto& o : outs) {
    if (!o.defined() || o.is_privateuseone()) {
      result.push_back(o);
      continue;
    }
    TORCH_CHECK(o.layout() == c10::Layout::Strided, "tpusim: an op returned a ", o.layout(),
                " tensor; only strided tensors are supported on tpu");
    auto* si = o.storage().unsafeGetStorageImpl();
    c10::Storage target;
    auto it = seen.find(si);
    if (it != seen.end()) {
      target = it->second;
    } else if (const auto* ctx = alias_ctx(si)) {
      target = c10::Storage(ctx->target);
    } else {
      const size_t n = si->nbytes();
      TORCH_CHECK(config().no_data || n == 0 || si->data() != nullptr, "tpusim: an op returned a tensor of shape ",
                  o.sizes(), " whose ", n, " bytes have no memory", o._is_zerotensor() ? " (a ZeroTensor)" : "",
                  "; the tpu device cannot adopt it. Add a kernel for the op in tpusim/backend/aten/handwritten_kernels.py.");
      c10::DataPtr dp = config().no_data
                            ? allocate_on(n, device)
                            : adopt_host_storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(si), n, device);
      target = c10::Storage(c10::Storage::use_byte_size_t(), n, std::move(dp), device_allocator(), true);
    }
    seen.emplace(si, target);
    auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(target), kDeviceKeys, o.dtype());
    t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes(), o.strides(), o.storage_offset());
    copy_math_bits(o, t);
    result.push_back(std::move(t));
  }
  return result;
}

// After a fallback op: give the device tensor `dst` what the kernel did to its alias (a new
// shape from an out= resize, and new bytes if the storage had to grow).
void sync_back(const at::Tensor& dst, const at::Tensor& alias) {
  auto* di = dst.storage().unsafeGetStorageImpl();
  auto* ai = alias.storage().unsafeGetStorageImpl();
  const bool meta = config().no_data;
  const bool regrown = meta ? ai->nbytes() > di->nbytes() : ai->data() != di->data();
  if (regrown) {
    const size_t n = ai->nbytes();
    c10::DataPtr fresh = allocate_on(n, dst.device().index());
    if (!meta && n > 0) {
      std::memcpy(fresh.get(), ai->data(), n);
    }
    di->set_data_ptr_noswap(std::move(fresh));
    di->set_nbytes(n);
  }
  auto* impl = dst.unsafeGetTensorImpl();
  if (regrown || impl->sizes() != alias.sizes() || impl->strides() != alias.strides() ||
      impl->storage_offset() != alias.storage_offset()) {
    impl->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
  }
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// The op is CompositeImplicitAutograd: with a PrivateUse1 kernel, its autograd key would no longer
// take the composite and would fall through to the Python key first, where a tensor subclass on tpu
// (DTensor) would be asked about it in __torch_dispatch__. Answer at the autograd key too, as the
// composite does for CUDA.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// A conjugate/negative view copied to or from the device: let the copy kernel see the bit (it
// resolves it) instead of the math-bit fallback, which would clone, i.e. copy, i.e. recurse.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace tpusim
