// The C++ half of the "tpu" PrivateUse1 device: what PyTorch only lets C++ provide.
//
// runtime.cpp  allocator (simulated HBM, stats, alloc/free log), device guard (devices, streams,
//              events), hooks (generators, pinned memory, storage resize)
// kernels.cpp  the native kernels that must not go through the fallback
//              (factories, views, set_, resize_, copies, _local_scalar_dense) and the
//              zero-copy host aliases the fallback runs ops on
// fallback.cpp the boxed fallback every other op runs through (Python only where it must)
// record.cpp   the recording log: allocations, ops, copies, host syncs, with source lines
// compile_cache.cpp the eager compile cache's counters (torch.tpu._get_cache_stats)
// autocast.cpp autocast for "tpu" (bf16 lower-precision list, fp32 list: the CUDA lists)
// module.cpp   the Python bindings
#pragma once

#include <Python.h>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace tpusim {

constexpr int kMaxDevices = 64;

// Set once from Python (tpusim/backend/plumbing/config.py) before the first tensor is made.
struct Config {
  c10::DeviceIndex device_count = 1;
  int64_t hbm_bytes = 0;        // per device; 0 = unlimited
  bool no_data = false;         // shape-only mode: storages have no host memory
  std::string chip = "v5p";
  std::string chip_display = "TPU v5p";
};
Config& config();

struct DeviceStats {
  int64_t allocated = 0;        // bytes live now
  int64_t peak = 0;             // high-water mark since the last reset
  int64_t allocations = 0;      // number of allocations ever
  int64_t frees = 0;
  int64_t allocated_total = 0;  // bytes ever allocated
  int64_t live_blocks = 0;
};
DeviceStats stats(c10::DeviceIndex device);
void reset_peak(c10::DeviceIndex device);

c10::Allocator* device_allocator();

// The eager compile cache's counters (compile_cache.cpp): one lookup per op the fallback runs.
struct EagerCacheSnapshot {
  int64_t requests = 0;
  int64_t hits = 0;
  std::vector<std::tuple<std::string, int64_t, double>> entries;  // (label, reads, last read in epoch seconds)
};
void count_eager_compile(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);
EagerCacheSnapshot eager_cache_snapshot();
void eager_cache_clear();
// Unique id of a device storage (never reused); -1 for storages we did not allocate.
int64_t storage_id(const c10::StorageImpl* storage);
// A device DataPtr that owns `host` (a CPU storage made by a kernel on a host alias): zero copy.
c10::DataPtr adopt_host_storage(c10::intrusive_ptr<c10::StorageImpl> host, size_t nbytes,
                                c10::DeviceIndex device);
// A device DataPtr of nbytes on `device` (counted against HBM).
c10::DataPtr allocate_on(size_t nbytes, c10::DeviceIndex device);
// Grow/shrink a device storage keeping its StorageImpl (FSDP2 relies on identity).
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex device);
void check_device_index(c10::DeviceIndex device);

void register_hooks();
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

// Host aliases (kernels.cpp)
at::Tensor host_alias(const at::Tensor& t);
std::vector<at::Tensor> to_device(const std::vector<at::Tensor>& outs, c10::DeviceIndex device);
void sync_back(const at::Tensor& dst, const at::Tensor& alias);
bool is_host_alias(const c10::StorageImpl* storage);  // a storage host_alias made (its views too)

// Called by native kernels while recording (copies, item); set by module.cpp.
using NativeHook = std::function<void(const char* kind, const at::Tensor& a, const at::Tensor* b)>;
extern std::atomic<bool> g_native_hook_on;
extern NativeHook g_native_hook;

// The boxed fallback (fallback.cpp)
void set_fast(bool on);        // the simulator target is held outside debug eager mode: ops may stay in C++
void set_meta_cache(bool on);  // shape-only mode: reuse an op's result shapes per signature (default on)

// The recording log (record.cpp), drained by tpusim/backend/program_trace/recorder.py
extern std::atomic<bool> g_recording;
void log_memory(bool alloc, int64_t storage, int64_t bytes);
// a, b: a copy's source and destination; non_blocking as asked; offload: a device->host copy that keeps an
// activation on the host (is_offload), recorded with its host buffer tracked (host memory held)
void log_native(const char* kind, const at::Tensor& a, const at::Tensor* b, bool non_blocking = false,
                bool offload = false);
// Whether a saved-tensors pack hook (save_on_cpu, saved_tensors_hooks) is running now (asks Python once the
// thread's hook stack is non-empty; tpusim/backend/dispatch/offload.py)
bool in_pack_hook();
// The user's source line (a str, never freed) and whether torch's tensor printing is on the way; GIL held.
PyObject* user_source(bool* printing);
void log_op(PyObject* name, const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
            PyObject* source, PyObject* cost);

[[noreturn]] void shape_only_error(const char* what, const at::Tensor& t);

}  // namespace tpusim
