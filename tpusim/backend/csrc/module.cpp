// Python bindings of the shim (imported as tpusim.backend's compiled module; see tpusim/backend/plumbing/shim.py).
#include "tpu_shim.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using namespace tpusim;

namespace tpusim {  // fallback.cpp, record.cpp
void install_fallback(py::object python_fallback, py::object planner, py::object shaped_cost);
void park_other_threads();
void register_fallback(const std::vector<std::string>& names);
void configure_source(py::object is_internal, py::object tensor_str, unsigned long main_ident);
py::tuple user_source_py();
void record_start();
void record_stop();
py::tuple record_drain(Py_ssize_t seq);
void record_classes(py::object memory_record, py::object tensor_meta, py::object op, py::object host,
                    py::object counted_cost, py::object copy_family);
py::tuple record_metas(const std::vector<at::Tensor>& tensors);
int64_t record_tensor_id();
void set_pack_hook_check(py::object check);
int64_t record_host_peak();
}  // namespace tpusim

namespace {

void configure(int device_count, int64_t hbm_bytes, bool no_data, const std::string& chip,
               const std::string& chip_display) {
  TORCH_CHECK(device_count >= 1 && device_count <= kMaxDevices, "tpusim: TPUSIM_DEVICES must be 1..", kMaxDevices);
  auto& c = config();
  c.device_count = static_cast<c10::DeviceIndex>(device_count);
  c.hbm_bytes = hbm_bytes;
  c.no_data = no_data;
  c.chip = chip;
  c.chip_display = chip_display;
  register_hooks();
}

std::vector<at::Tensor> host_aliases(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) {
    out.push_back(t.defined() && t.is_privateuseone() ? host_alias(t) : t);
  }
  return out;
}

void sync_back_list(const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& aliases) {
  TORCH_CHECK(dsts.size() == aliases.size(), "tpusim: sync_back_list length mismatch");
  for (size_t i = 0; i < dsts.size(); ++i) {
    if (dsts[i].defined() && aliases[i].defined() && dsts[i].is_privateuseone()) {
      sync_back(dsts[i], aliases[i]);
    }
  }
}

std::vector<int64_t> storage_ids(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> out;
  out.reserve(ts.size());
  for (const auto& t : ts) {
    out.push_back(t.defined() && t.has_storage() ? storage_id(t.storage().unsafeGetStorageImpl()) : -1);
  }
  return out;
}

py::dict stats_dict(int device) {
  auto s = stats(static_cast<c10::DeviceIndex>(device));
  py::dict d;
  d["allocated_bytes"] = s.allocated;
  d["peak_bytes"] = s.peak;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["allocated_bytes_total"] = s.allocated_total;
  d["live_blocks"] = s.live_blocks;
  return d;
}

void set_native_hook(py::object fn) {
  if (fn.is_none()) {
    g_native_hook_on = false;
    return;
  }
  auto* keep = new py::object(std::move(fn));  // lives for the process: no destructor at exit without the GIL
  g_native_hook = [keep](const char* kind, const at::Tensor& a, const at::Tensor* b) {
    py::gil_scoped_acquire gil;
    if (b != nullptr) {
      (*keep)(kind, a, *b);
    } else {
      (*keep)(kind, a, py::none());
    }
  };
  g_native_hook_on = true;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tpusim: C++ shim of the PrivateUse1 'tpu' device";
  m.def("configure", &configure);
  m.def("host_alias", &host_alias);
  m.def("host_aliases", &host_aliases);
  m.def("to_device", [](const std::vector<at::Tensor>& outs, int device) {
    return to_device(outs, static_cast<c10::DeviceIndex>(device));
  });
  m.def("sync_back", &sync_back);
  m.def("sync_back_list", &sync_back_list);
  m.def("storage_ids", &storage_ids);
  m.def("stats", &stats_dict);
  m.def("eager_cache", []() {
    const EagerCacheSnapshot snap = eager_cache_snapshot();
    return py::make_tuple(snap.requests, snap.hits, snap.entries);
  });
  m.def("eager_cache_clear", &eager_cache_clear);
  m.def("reset_peak", [](int device) { reset_peak(static_cast<c10::DeviceIndex>(device)); });
  m.def("install_fallback", &install_fallback);
  m.def("park_other_threads", &park_other_threads);
  m.def("register_fallback", &register_fallback);
  m.def("set_fast", &set_fast);
  m.def("set_meta_cache", &set_meta_cache);
  m.def("configure_source", &configure_source);
  m.def("user_source", &user_source_py);
  m.def("record_start", &record_start);
  m.def("record_stop", &record_stop);
  m.def("record_drain", &record_drain);
  m.def("record_classes", &record_classes);
  m.def("record_metas", &record_metas);
  m.def("record_tensor_id", &record_tensor_id);
  m.def("set_pack_hook_check", &set_pack_hook_check);
  m.def("record_host_peak", &record_host_peak);
  m.def("set_native_hook", &set_native_hook);
  m.def("device_count", []() { return static_cast<int>(config().device_count); });
  m.def("current_device", []() { return static_cast<int>(current_device()); });
  m.def("set_device", [](int d) { set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(d))));
  });
}
