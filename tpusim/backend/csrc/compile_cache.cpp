// The eager compile cache's counters: what torch.tpu._get_cache_stats() reports for eager work.
//
// Why: on TorchTPU every eager op (a cluster, under Fused eager) is a lookup of a compiled executable keyed by
// the program and its input shapes and dtypes; the first lookup of a key compiles (a miss), the next ones hit.
// TorchTPU's own notebooks read these counters, so the device keeps them for every op its fallback runs: the
// key is the operator, each tensor's dtype and shape, and the integer arguments that fix shapes. Counting one
// lookup per op under Fused eager too is a departure (TorchTPU looks up whole clusters; tpusim's report prices
// clusters). A label is built only on a miss, so a hit costs a hash and a map lookup.
#include "tpu_shim.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <chrono>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace tpusim {

namespace {

struct Entry {
  std::string label;
  int64_t reads = 0;
  double last_read = 0.0;  // seconds since the epoch; 0: never hit
};

std::mutex g_cache_mu;
std::unordered_map<uint64_t, Entry> g_entries;
int64_t g_requests = 0;
int64_t g_hits = 0;

void mix(uint64_t& h, uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); }

void mix_tensor(uint64_t& h, const at::Tensor& t) {
  if (!t.defined()) {
    mix(h, 1);
    return;
  }
  mix(h, static_cast<uint64_t>(t.scalar_type()) + 16);
  mix(h, static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) mix(h, static_cast<uint64_t>(s));
}

void describe(std::ostringstream& out, const at::Tensor& t) {
  if (!t.defined()) {
    out << "None";
    return;
  }
  out << c10::toString(t.scalar_type()) << t.sizes();
}

std::string label_of(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  std::ostringstream out;
  out << op.schema().name();
  if (!op.schema().overload_name().empty()) out << "." << op.schema().overload_name();
  out << "(";
  bool first = true;
  for (const auto& v : args) {
    if (!v.isTensor() && !v.isTensorList()) continue;
    out << (first ? "" : ", ");
    first = false;
    if (v.isTensor()) {
      describe(out, v.toTensor());
    } else {
      out << "[";
      for (const at::Tensor& t : v.toTensorList()) describe(out, t);
      out << "]";
    }
  }
  out << ")";
  return out.str();
}

}  // namespace

void count_eager_compile(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  // the operator's schema lives as long as the dispatcher: its address names the overload without hashing text
  uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&op.schema()));
  for (const auto& v : args) {
    if (v.isTensor()) {
      mix_tensor(h, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) mix_tensor(h, t);
    } else if (v.isInt()) {
      mix(h, static_cast<uint64_t>(v.toInt()));
    } else if (v.isIntList()) {
      for (int64_t i : v.toIntList()) mix(h, static_cast<uint64_t>(i));
    } else if (v.isBool()) {
      mix(h, v.toBool() ? 3 : 2);
    } else {
      mix(h, static_cast<uint64_t>(v.tagKind().size()));
    }
  }
  std::lock_guard<std::mutex> lock(g_cache_mu);
  ++g_requests;
  auto found = g_entries.find(h);
  if (found == g_entries.end()) {
    g_entries.emplace(h, Entry{label_of(op, args)});
    return;
  }
  ++g_hits;
  ++found->second.reads;
  found->second.last_read =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EagerCacheSnapshot eager_cache_snapshot() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  EagerCacheSnapshot snap{g_requests, g_hits, {}};
  snap.entries.reserve(g_entries.size());
  for (const auto& [key, e] : g_entries) snap.entries.emplace_back(e.label, e.reads, e.last_read);
  return snap;
}

void eager_cache_clear() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  g_entries.clear();
}

}  // namespace tpusim
