// The recording log of the "tpu" device: what tpusim/backend/program_trace/recorder.py turns into the program trace.
//
// While a recording is on, the device appends here, in the order things happen: allocations and
// frees of device memory (runtime.cpp), the ops the C++ fallback ran (fallback.cpp), copies
// between devices and host syncs (kernels.cpp). The recorder drains the log before it appends a
// record of its own, so the trace keeps that order. Tensors are indices into a table of tensor
// metas (tensor id, shape, dtype, bytes, storage id) grown as tensors are first seen: a tensor id
// names (storage id, offset, shape, strides), so views of the same bytes read the same way are the
// same tensor (the recorder's docstring), and ids are given in the order tensors are first seen,
// whoever sees them (ops here, collectives and compiled programs through record_metas).
//
// Each event carries the user's source line: the first Python frame outside torch and tpusim,
// walked here (tpusim/backend/plumbing/source.py says which files are internal, once per code object). A backward op (run
// by the autograd engine, on its device thread or the caller's) is attributed to the forward line that created its
// autograd node: each forward line is kept by the node's (thread, sequence number), the pair the profiler uses to
// tie a backward node to its forward op; failing that (a node no recorded op created), to the line the main thread
// waits on (the ``loss.backward()`` call).
#include "tpu_shim.h"

#include <ATen/SavedTensorHooks.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tpusim {

std::atomic<bool> g_recording{false};

namespace {

namespace py = pybind11;

// ---------------------------------------------------------------- the log

enum Kind : int { kAlloc = 0, kFree = 1, kOp = 2, kCopy = 3, kHost = 4 };

struct Event {
  int kind;
  int64_t a = 0;               // alloc/free: storage id; host: bytes
  int64_t b = 0;               // alloc/free: bytes; host: the device storage a copy reads or writes
  int64_t c = 0;               // host: the host buffer a copy writes or reads (0: not an offload's)
  bool non_blocking = false;   // host: a copy asked non_blocking
  PyObject* name = nullptr;    // op: its name; host: the event ("sync", "d2h", "h2d")  (never freed)
  PyObject* reason = nullptr;  // host: why ("item", "print", "cpu", "to_device")      (never freed)
  PyObject* source = nullptr;  // the user's line                                       (never freed)
  PyObject* cost = nullptr;    // op: a costs.Cost computed at the op, or null (owned)
  int32_t first = 0;           // op, copy: where its tensors start in g_refs
  int32_t n_in = 0;
  int32_t n_out = 0;
};

struct NewMeta {
  int64_t tid;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
  int64_t nbytes;
  int64_t storage;
  int64_t numel;
};

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a over the words
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

std::mutex g_log_mu;  // a leaf lock: nothing else is taken (and the GIL never waited for) while holding it
std::vector<Event> g_events;
std::vector<int32_t> g_refs;
std::vector<NewMeta> g_new_metas;
std::unordered_map<std::vector<int64_t>, int32_t, VecHash> g_meta_index;  // (tensor key, dtype) -> meta
std::unordered_map<std::vector<int64_t>, int64_t, VecHash> g_tensor_ids;  // tensor key -> tensor id
int64_t g_last_tid = 0;
int32_t g_metas = 0;

// The meta index of `t` (a new meta if unseen); call with g_log_mu held.
int32_t meta_of(const at::Tensor& t) {
  const int64_t sid = t.has_storage() ? storage_id(t.storage().unsafeGetStorageImpl()) : -1;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  static std::vector<int64_t> key;  // reused: g_log_mu is held (no allocation per tensor)
  key.clear();
  key.push_back(sid);
  key.push_back(t.storage_offset());
  key.push_back(static_cast<int64_t>(sizes.size()));
  key.insert(key.end(), sizes.begin(), sizes.end());
  key.insert(key.end(), strides.begin(), strides.end());
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  auto found = g_meta_index.find(key);
  if (found != g_meta_index.end()) {
    return found->second;
  }
  const int32_t index = g_metas++;
  g_meta_index.emplace(key, index);
  key.pop_back();
  auto tid = g_tensor_ids.find(key);
  const int64_t id = tid != g_tensor_ids.end() ? tid->second : g_tensor_ids.emplace(key, ++g_last_tid).first->second;
  const auto numel = static_cast<int64_t>(t.numel());
  g_new_metas.push_back({id, sizes.vec(), t.scalar_type(), numel * static_cast<int64_t>(t.element_size()), sid, numel});
  return index;
}

// Empty the log (g_log_mu held); returns the costs it held, to be released once the lock is not held.
std::vector<PyObject*> clear_log() {
  std::vector<PyObject*> costs;
  for (auto& e : g_events) {
    if (e.cost != nullptr) {
      costs.push_back(e.cost);
    }
  }
  g_events.clear();
  g_refs.clear();
  g_new_metas.clear();
  g_meta_index.clear();
  g_tensor_ids.clear();
  g_last_tid = 0;
  g_metas = 0;
  return costs;
}

// NOTE: no Python object is made or released while g_log_mu is held: that can run the garbage
// collector, whose finalizers can free device memory, which logs a free and takes g_log_mu again.
void release_all(const std::vector<PyObject*>& objects) {
  for (PyObject* o : objects) {
    Py_DECREF(o);
  }
}

// ---------------------------------------------------------------- strings (created once, never freed)

PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) {
    throw python_error();
  }
  return o;
}

struct Names {
  PyObject* empty = intern("");
  PyObject* sync = intern("sync");
  PyObject* d2h = intern("d2h");
  PyObject* h2d = intern("h2d");
  PyObject* item = intern("item");
  PyObject* print = intern("print");
  PyObject* cpu = intern("cpu");
  PyObject* to_device = intern("to_device");
  PyObject* offload = intern("offload");
  PyObject* copy = intern("aten::copy_");
  PyObject* alloc = intern("alloc");
  PyObject* free = intern("free");
  PyObject* dma = intern("dma");
  PyObject* float32 = intern("float32");
};

const Names& names() {
  static const Names* n = new Names();  // first use holds the GIL
  return *n;
}

PyObject* dtype_name(c10::ScalarType st) {
  static std::unordered_map<int, PyObject*> cache;  // GIL held
  auto it = cache.find(static_cast<int>(st));
  if (it != cache.end()) {
    return it->second;
  }
  py::str full = py::str(reinterpret_cast<PyObject*>(torch::getTHPDtype(st)));  // "torch.float32"
  std::string text = full.cast<std::string>();
  PyObject* name = intern(text.substr(text.find('.') + 1).c_str());
  cache.emplace(static_cast<int>(st), name);
  return name;
}

// ---------------------------------------------------------------- the user's source line

struct CodeInfo {
  bool internal;
  bool tensor_str;
  PyObject* base;  // the file's base name
};

PyObject* g_is_internal = nullptr;  // tpusim/backend/plumbing/source.py is_internal_file
PyObject* g_tensor_str = nullptr;   // torch/_tensor_str.py: a frame there means a print
unsigned long g_main_ident = 0;
std::unordered_map<PyObject*, CodeInfo> g_codes;  // code objects stay alive (a reference each)
struct LineHash {
  size_t operator()(const std::pair<PyObject*, int>& k) const noexcept {
    return std::hash<void*>()(k.first) ^ (static_cast<size_t>(k.second) * 0x9e3779b97f4a7c15ULL);
  }
};
std::unordered_map<std::pair<PyObject*, int>, PyObject*, LineHash> g_lines;

const CodeInfo& code_info(PyCodeObject* code) {
  auto key = reinterpret_cast<PyObject*>(code);
  auto it = g_codes.find(key);
  if (it != g_codes.end()) {
    return it->second;
  }
  PyObject* filename = code->co_filename;
  PyObject* flag = PyObject_CallOneArg(g_is_internal, filename);
  if (flag == nullptr) {
    throw python_error();
  }
  const bool internal = PyObject_IsTrue(flag) == 1;
  Py_DECREF(flag);
  const bool tensor_str = PyUnicode_Compare(filename, g_tensor_str) == 0;
  std::string path = py::cast<std::string>(py::handle(filename));
  PyObject* base = intern(path.substr(path.rfind('/') + 1).c_str());
  Py_INCREF(key);
  return g_codes.emplace(key, CodeInfo{internal, tensor_str, base}).first->second;
}

// The first user frame from `frame` (a new reference, consumed) outward; null if none.
PyObject* walk(PyFrameObject* frame, bool* printing) {
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const CodeInfo& info = code_info(code);
    if (!info.internal) {
      const int line = PyFrame_GetLineNumber(frame);
      Py_DECREF(frame);
      auto key = std::make_pair(reinterpret_cast<PyObject*>(code), line);
      Py_DECREF(code);  // g_codes holds it
      auto it = g_lines.find(key);
      if (it != g_lines.end()) {
        return it->second;
      }
      PyObject* text = PyUnicode_FromFormat("%U:%d", info.base, line);
      if (text == nullptr) {
        throw python_error();
      }
      g_lines.emplace(key, text);
      return text;
    }
    Py_DECREF(code);
    if (info.tensor_str) {
      *printing = true;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return nullptr;
}

// Forward lines by autograd node: (forward thread, sequence number) -> the line (g_lines holds it). The GIL guards it.
struct NodeHash {
  size_t operator()(const std::pair<uint64_t, uint64_t>& k) const noexcept {
    return std::hash<uint64_t>()(k.first) ^ (k.second * 0x9e3779b97f4a7c15ULL);
  }
};
std::unordered_map<std::pair<uint64_t, uint64_t>, PyObject*, NodeHash> g_forward_lines;
constexpr size_t kForwardLinesKept = 1 << 22;  // a bound on memory: past it, older forward lines are dropped

// A forward op's line, kept for the autograd node its op created just before its kernel ran: autograd makes the
// node (taking the thread's next sequence number) and then calls the device kernel, so the last number taken is
// that node's. The first line wins: an op that makes no node (no grad) leaves the previous node's line alone.
void keep_forward_line(PyObject* line) {
  const uint64_t next = at::sequence_number::peek();
  if (next == 0 || !at::GradMode::is_enabled()) {
    return;
  }
  if (g_forward_lines.size() >= kForwardLinesKept) {
    g_forward_lines.clear();
  }
  g_forward_lines.emplace(std::make_pair(at::RecordFunction::currentThreadId(), next - 1), line);
}

// The forward line of the autograd node running now (backward), or null outside backward or when none was kept.
PyObject* backward_line() {
  auto node = torch::autograd::get_current_node();
  if (!node) {
    return nullptr;
  }
  auto it = g_forward_lines.find(std::make_pair(node->thread_id(), node->sequence_nr()));
  return it != g_forward_lines.end() ? it->second : nullptr;
}

}  // namespace

void configure_source(py::object is_internal, py::object tensor_str, unsigned long main_ident) {
  g_is_internal = is_internal.release().ptr();
  g_tensor_str = tensor_str.release().ptr();
  g_main_ident = main_ident;
}

PyObject* user_source(bool* printing) {
  TORCH_CHECK(g_is_internal != nullptr, "tpusim: the source walk is not configured (tpusim/backend/plumbing/source.py)");
  PyThreadState* ts = PyThreadState_Get();
  const bool main = ts->thread_id == g_main_ident;
  if (main) {
    if (PyObject* forward = backward_line()) {  // backward on the caller's thread: the forward op's line
      return forward;
    }
  }
  PyObject* found = walk(PyThreadState_GetFrame(ts), printing);
  if (found != nullptr) {
    if (main) {
      keep_forward_line(found);
    }
    return found;
  }
  if (!main) {  // the autograd engine's device thread: the forward op's line, else the line the main thread waits on
    if (PyObject* forward = backward_line()) {
      return forward;
    }
    for (PyThreadState* t = PyInterpreterState_ThreadHead(ts->interp); t != nullptr; t = PyThreadState_Next(t)) {
      if (t->thread_id == g_main_ident) {
        bool ignored = false;
        found = walk(PyThreadState_GetFrame(t), &ignored);
        break;
      }
    }
  }
  return found != nullptr ? found : names().empty;
}

py::tuple user_source_py() {
  bool printing = false;
  PyObject* source = user_source(&printing);
  return py::make_tuple(py::reinterpret_borrow<py::object>(source), printing);
}

// ---------------------------------------------------------------- writing the log

void log_memory(bool alloc, int64_t storage, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  Event e{alloc ? kAlloc : kFree};
  e.a = storage;
  e.b = bytes;
  g_events.push_back(e);
}

void log_op(PyObject* name, const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs, PyObject* source,
            PyObject* cost) {
  std::unique_lock<std::mutex> lock(g_log_mu);
  if (!g_recording.load(std::memory_order_relaxed)) {  // stopped meanwhile
    lock.unlock();
    Py_XDECREF(cost);                                  // (the GIL is held by every caller that has a cost)
    return;
  }
  Event e{kOp};
  e.name = name;
  e.source = source;
  e.cost = cost;
  e.first = static_cast<int32_t>(g_refs.size());
  e.n_in = static_cast<int32_t>(ins.size());
  e.n_out = static_cast<int32_t>(outs.size());
  for (const auto& t : ins) {
    g_refs.push_back(meta_of(t));
  }
  for (const auto& t : outs) {
    g_refs.push_back(meta_of(t));
  }
  g_events.push_back(e);
}

namespace {

void log_host(PyObject* event, PyObject* reason, int64_t bytes, PyObject* source, int64_t storage = 0,
              int64_t host = 0, bool non_blocking = false) {
  Event e{kHost};
  e.name = event;
  e.reason = reason;
  e.a = bytes;
  e.b = storage;
  e.c = host;
  e.non_blocking = non_blocking;
  e.source = source;
  g_events.push_back(e);
}

// ---------------------------------------------------------------- host memory held by offloaded tensors
//
// A host buffer an offload copies into is tracked from that copy until torch frees it: its storage's data
// pointer is wrapped (same address, so pinned-ness and views are unchanged) by one whose deleter counts the
// bytes off before the original deleter runs. Live and peak bytes are per recording (an epoch); the recorder
// reads the peak at its stop (TraceMeta.host_peak_bytes). The counters have their own leaf lock: a deleter
// may run on any thread, with or without the GIL, and never takes g_log_mu.

struct HostBuffer {
  c10::DataPtr inner;  // the storage's own data pointer (its deleter frees the memory)
  int64_t id;
  int64_t bytes;
  uint64_t epoch;      // the recording that counted it
};

std::mutex g_host_mu;
int64_t g_host_ids = 0;
uint64_t g_host_epoch = 0;
int64_t g_host_live = 0;
int64_t g_host_peak = 0;

void delete_host_buffer(void* ctx) {
  auto* buffer = static_cast<HostBuffer*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_host_mu);
    if (buffer->epoch == g_host_epoch) {
      g_host_live -= buffer->bytes;
    }
  }
  delete buffer;  // the inner DataPtr frees the memory
}

void count_host(HostBuffer* buffer) {  // g_host_mu held
  buffer->epoch = g_host_epoch;
  g_host_live += buffer->bytes;
  g_host_peak = std::max(g_host_peak, g_host_live);
}

// The id of the tracked host buffer under `t`, tracking it first (counted in this recording's host memory).
int64_t track_host_buffer(const at::Tensor& t) {
  if (!t.has_storage()) {
    return 0;
  }
  auto* si = t.storage().unsafeGetStorageImpl();
  void* data = si->mutable_data();  // a copy-on-write storage materializes first: the address to keep
  const auto& dp = si->data_ptr();
  std::lock_guard<std::mutex> lock(g_host_mu);
  if (dp.get_deleter() == &delete_host_buffer) {
    auto* buffer = static_cast<HostBuffer*>(dp.get_context());
    if (buffer->epoch != g_host_epoch) {
      count_host(buffer);
    }
    return buffer->id;
  }
  if (data == nullptr) {
    return 0;
  }
  auto* buffer = new HostBuffer{c10::DataPtr(), ++g_host_ids, static_cast<int64_t>(si->nbytes()), 0};
  buffer->inner = si->set_data_ptr(c10::DataPtr(data, buffer, &delete_host_buffer, dp.device()));
  count_host(buffer);
  return buffer->id;
}

// The id of the tracked host buffer under `t`, or 0 when it is none (an h2d from an ordinary host tensor).
int64_t host_buffer_id(const at::Tensor& t) {
  if (!t.has_storage()) {
    return 0;
  }
  const auto& dp = t.storage().unsafeGetStorageImpl()->data_ptr();
  return dp.get_deleter() == &delete_host_buffer ? static_cast<const HostBuffer*>(dp.get_context())->id : 0;
}

int64_t nbytes_of(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

}  // namespace

// A native kernel's event (kernels.cpp: "item" before reading, "copy" after copying) while recording.
void log_native(const char* kind, const at::Tensor& a, const at::Tensor* b, bool non_blocking, bool offload) {
  py::gil_scoped_acquire gil;
  bool printing = false;
  PyObject* source = user_source(&printing);
  const Names& n = names();
  if (std::string(kind) == "item") {
    std::lock_guard<std::mutex> lock(g_log_mu);
    log_host(n.sync, printing ? n.print : n.item, static_cast<int64_t>(a.element_size()), source);
    return;
  }
  TORCH_INTERNAL_ASSERT(b != nullptr);
  const bool src_dev = a.is_privateuseone();
  const bool dst_dev = b->is_privateuseone();
  const int64_t size = nbytes_of(a);
  if (src_dev && dst_dev) {
    PyObject* dtype = dtype_name(b->scalar_type());
    std::lock_guard<std::mutex> lock(g_log_mu);
    Event e{kCopy};
    e.name = dtype;
    e.source = source;
    e.a = size;
    e.b = nbytes_of(*b);
    e.first = static_cast<int32_t>(g_refs.size());
    e.n_in = 1;
    e.n_out = 1;
    g_refs.push_back(meta_of(a));
    g_refs.push_back(meta_of(*b));
    g_events.push_back(e);
    return;
  }
  const at::Tensor& dev = src_dev ? a : *b;
  const int64_t storage = dev.has_storage() ? storage_id(dev.storage().unsafeGetStorageImpl()) : 0;
  const int64_t host = offload ? track_host_buffer(*b) : src_dev ? 0 : host_buffer_id(a);
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (src_dev && offload) {  // no sync: the engine prices it as a copy (a blocking one waits for the device)
    log_host(n.d2h, n.offload, size, source, storage, host, non_blocking);
  } else if (src_dev) {
    PyObject* reason = printing ? n.print : n.cpu;
    log_host(n.sync, reason, 0, source);
    log_host(n.d2h, reason, size, source, storage, host, non_blocking);
  } else {
    log_host(n.h2d, n.to_device, size, source, storage, host, non_blocking);
  }
}

// In a pack hook now? The thread's saved-tensors hook stack first (no Python when empty), then
// tpusim/backend/dispatch/offload.py's check of the Python stack for the top pack hook's frame.
PyObject* g_in_pack_hook = nullptr;

bool in_pack_hook() {
  if (g_in_pack_hook == nullptr || at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) {
    return false;
  }
  py::gil_scoped_acquire gil;
  PyObject* answer = PyObject_CallNoArgs(g_in_pack_hook);
  if (answer == nullptr) {
    throw python_error();
  }
  const bool yes = PyObject_IsTrue(answer) == 1;
  Py_DECREF(answer);
  return yes;
}

void set_pack_hook_check(py::object check) { g_in_pack_hook = check.release().ptr(); }

int64_t record_host_peak() {
  std::lock_guard<std::mutex> lock(g_host_mu);
  return g_host_peak;
}

// ---------------------------------------------------------------- reading the log (tpusim/backend/program_trace/recorder.py)

namespace {

// The record classes (tpusim.trace.records MemoryRecord, TensorMeta, OpRecord, HostRecord), tpusim/backend/program_trace/costs.py's
// counted_cost and the copy's family, set by tpusim/backend/program_trace/recorder.py.
PyObject* g_memory_record = nullptr;
PyObject* g_tensor_meta = nullptr;
PyObject* g_op_record = nullptr;
PyObject* g_host_record = nullptr;
PyObject* g_counted_cost = nullptr;
PyObject* g_copy_family = nullptr;

void untrack(PyObject* o) {
  if (PyObject_IS_GC(o) && PyObject_GC_IsTracked(o)) {
    PyObject_GC_UnTrack(o);
  }
}

// An instance of the frozen dataclass `cls` with `values` as its fields (in field order): what
// cls(*values) makes, without its per-field setattr. Untracked by the garbage collector: records and tensor
// metas are frozen and hold only numbers, strings, tuples of metas and enum members, so no reference cycle
// passes through them, and a recording's hundreds of thousands of them made every full collection walk
// them all (once most of the recorder's time). Refcounting still frees them.
PyObject* make_record(PyObject* cls, std::initializer_list<std::pair<const char*, PyObject*>> values) {
  static std::unordered_map<const char*, PyObject*> keys;  // interned field names
  static std::unordered_map<PyObject*, PyObject*> templates;  // cls -> its fields, all None (sized once)
  static PyObject* no_args = PyTuple_New(0);
  auto made = templates.find(cls);
  if (made == templates.end()) {
    PyObject* fields = PyDict_New();
    for (const auto& [name, value] : values) {
      auto it = keys.find(name);
      PyObject* key = it != keys.end() ? it->second : keys.emplace(name, intern(name)).first->second;
      if (fields == nullptr || PyDict_SetItem(fields, key, Py_None) != 0) {
        Py_CLEAR(fields);
        break;
      }
    }
    made = templates.emplace(cls, fields).first;
  }
  // A copy of the template (its key table copied whole) and the values set: no resize per record.
  PyObject* dict = made->second != nullptr && PyDict_GET_SIZE(made->second) == static_cast<Py_ssize_t>(values.size())
                       ? PyDict_Copy(made->second)
                       : PyDict_New();
  if (dict == nullptr) {
    for (const auto& [name, value] : values) {
      Py_XDECREF(value);
    }
    throw python_error();
  }
  bool failed = false;
  for (const auto& [name, value] : values) {  // each value a new reference, consumed
    if (!failed) {
      auto it = keys.find(name);
      PyObject* key = it != keys.end() ? it->second : keys.emplace(name, intern(name)).first->second;
      failed = value == nullptr || PyDict_SetItem(dict, key, value) != 0;
    }
    Py_XDECREF(value);
  }
  if (failed) {
    Py_DECREF(dict);
    throw python_error();
  }
  PyObject* obj = PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(cls), no_args, nullptr);
  if (obj == nullptr || PyObject_GenericSetDict(obj, dict, nullptr) != 0) {
    Py_XDECREF(obj);
    Py_DECREF(dict);
    throw python_error();
  }
  Py_DECREF(dict);
  untrack(obj);
  PyObject** own = _PyObject_GetDictPtr(obj);
  if (own != nullptr && *own != nullptr) {
    untrack(*own);
  }
  return obj;
}

PyObject* new_ref(PyObject* o) {
  Py_INCREF(o);
  return o;
}

// Every tensor meta of the recording, by index (GIL held): the object, and what a record reads of it.
struct MetaObj {
  PyObject* obj;    // the TensorMeta (a reference)
  PyObject* dtype;  // its dtype name (never freed)
  int64_t nbytes;
  int64_t numel;
};
std::vector<MetaObj> g_meta_objs;

std::vector<PyObject*> clear_meta_objs() {  // the references to release (outside g_log_mu)
  std::vector<PyObject*> objects;
  for (const auto& m : g_meta_objs) {
    objects.push_back(m.obj);
  }
  g_meta_objs.clear();
  return objects;
}

py::list metas_to_py(const std::vector<NewMeta>& metas) {
  py::list out;
  for (const auto& m : metas) {
    PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(m.shape.size()));
    for (size_t i = 0; i < m.shape.size(); ++i) {
      PyTuple_SET_ITEM(shape, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(m.shape[i]));
    }
    PyObject* dtype = dtype_name(m.dtype);
    PyObject* meta = make_record(
        g_tensor_meta, {{"id", PyLong_FromLongLong(m.tid)}, {"shape", shape}, {"dtype", new_ref(dtype)},
                        {"nbytes", PyLong_FromLongLong(m.nbytes)}, {"storage", PyLong_FromLongLong(m.storage)}});
    g_meta_objs.push_back({new_ref(meta), dtype, m.nbytes, m.numel});
    out.append(py::reinterpret_steal<py::object>(meta));
  }
  return out;
}

py::object borrow(PyObject* o) { return py::reinterpret_borrow<py::object>(o); }

// ---------------------------------------------------------------- an op's cost, as its record reads it

// The fields of a costs.Cost an OpRecord reads (references), and its unit.
struct CostFacts {
  PyObject* family = nullptr;
  PyObject* unit = nullptr;
  PyObject* flops = nullptr;
  PyObject* transcendentals = nullptr;
  PyObject* matmul = nullptr;
  PyObject* bytes_read = nullptr;     // null: all inputs
  PyObject* bytes_written = nullptr;  // null: all outputs
  PyObject* dtype = nullptr;          // null: the first output's (or input's)

  void release() {
    for (PyObject* o : {family, unit, flops, transcendentals, matmul, bytes_read, bytes_written, dtype}) {
      Py_XDECREF(o);
    }
  }
};

PyObject* attr(PyObject* o, const char* name) {
  PyObject* v = PyObject_GetAttrString(o, name);
  if (v == nullptr) {
    throw python_error();
  }
  return v;
}

PyObject* unless_none(PyObject* v) {  // consumes v
  if (v == Py_None) {
    Py_DECREF(v);
    return nullptr;
  }
  return v;
}

CostFacts facts_of(PyObject* cost) {
  static std::unordered_map<PyObject*, PyObject*> units;  // family -> unit (both kept alive)
  CostFacts f;
  f.family = attr(cost, "family");
  auto unit = units.find(f.family);
  if (unit == units.end()) {
    unit = units.emplace(new_ref(f.family), attr(cost, "unit")).first;
  }
  f.unit = new_ref(unit->second);
  f.flops = attr(cost, "flops");
  f.transcendentals = attr(cost, "transcendentals");
  f.matmul = attr(cost, "matmul");
  f.bytes_read = unless_none(attr(cost, "bytes_read"));
  f.bytes_written = unless_none(attr(cost, "bytes_written"));
  PyObject* dtype = attr(cost, "dtype");
  const int truthy = PyObject_IsTrue(dtype);
  if (truthy < 0) {
    Py_DECREF(dtype);
    throw python_error();
  }
  if (truthy == 0) {  // cost.dtype or ...
    Py_DECREF(dtype);
    dtype = nullptr;
  }
  f.dtype = dtype;
  return f;
}

// counted_cost(name, input numels, output numels) per (name, numels), kept here (GIL held): most ops'
// costs depend on nothing else, and asking Python per op was most of a record's cost.
std::unordered_map<std::vector<int64_t>, CostFacts, VecHash> g_counted;

const CostFacts& counted_facts(PyObject* name, const std::vector<int32_t>& refs, int32_t first, int32_t n_in,
                               int32_t n_out) {
  std::vector<int64_t> key;
  key.reserve(3 + n_in + n_out);
  key.push_back(reinterpret_cast<int64_t>(name));  // op names are interned and never freed (fallback.cpp plans)
  key.push_back(n_in);
  for (int32_t i = 0; i < n_in + n_out; ++i) {
    key.push_back(g_meta_objs[refs[first + i]].numel);
  }
  auto found = g_counted.find(key);
  if (found != g_counted.end()) {
    return found->second;
  }
  auto numels = [&](int32_t from, int32_t count) {
    py::tuple out(count);
    for (int32_t i = 0; i < count; ++i) {
      out[i] = py::int_(g_meta_objs[refs[first + from + i]].numel);
    }
    return out;
  };
  py::object cost = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(
      g_counted_cost, name, numels(0, n_in).ptr(), numels(n_in, n_out).ptr(), nullptr));
  if (!cost) {
    throw python_error();
  }
  if (g_counted.size() > 100000) {  // a program of ever-new shapes: keep the memory bounded
    for (auto& [k, f] : g_counted) {
      f.release();
    }
    g_counted.clear();
  }
  return g_counted.emplace(std::move(key), facts_of(cost.ptr())).first->second;
}

// A tuple of the metas refs[first, first + count), untracked (it holds metas only).
PyObject* meta_tuple(const std::vector<int32_t>& refs, int32_t first, int32_t count) {
  PyObject* out = PyTuple_New(count);
  if (out == nullptr) {
    throw python_error();
  }
  for (int32_t i = 0; i < count; ++i) {
    PyTuple_SET_ITEM(out, i, new_ref(g_meta_objs[refs[first + i]].obj));
  }
  untrack(out);
  return out;
}

PyObject* bytes_of(PyObject* given, const std::vector<int32_t>& refs, int32_t first, int32_t count) {
  if (given != nullptr) {
    const double v = PyFloat_AsDouble(given);
    if (v == -1.0 && PyErr_Occurred()) {
      throw python_error();
    }
    return PyFloat_FromDouble(v);
  }
  int64_t total = 0;
  for (int32_t i = 0; i < count; ++i) {
    total += g_meta_objs[refs[first + i]].nbytes;
  }
  return PyFloat_FromDouble(static_cast<double>(total));
}

// An op's OpRecord, as tpusim/backend/program_trace/recorder.py's _op_record makes it.
PyObject* op_record(Py_ssize_t seq, const Event& e, const std::vector<int32_t>& refs, const CostFacts& cost) {
  PyObject* dtype = cost.dtype;
  if (dtype == nullptr) {
    dtype = e.n_out > 0 ? g_meta_objs[refs[e.first + e.n_in]].dtype
          : e.n_in > 0  ? g_meta_objs[refs[e.first]].dtype
                        : names().float32;
  }
  return make_record(g_op_record, {{"seq", PyLong_FromSsize_t(seq)}, {"op", new_ref(e.name)},
                                   {"unit", new_ref(cost.unit)}, {"dtype", new_ref(dtype)},
                                   {"inputs", meta_tuple(refs, e.first, e.n_in)},
                                   {"outputs", meta_tuple(refs, e.first + e.n_in, e.n_out)},
                                   {"flops", new_ref(cost.flops)}, {"transcendentals", new_ref(cost.transcendentals)},
                                   {"bytes_read", bytes_of(cost.bytes_read, refs, e.first, e.n_in)},
                                   {"bytes_written", bytes_of(cost.bytes_written, refs, e.first + e.n_in, e.n_out)},
                                   {"matmul", new_ref(cost.matmul)}, {"source", new_ref(e.source)},
                                   {"rank", PyLong_FromLong(0)}, {"program", PyLong_FromLong(0)},
                                   {"family", new_ref(cost.family)}});
}

}  // namespace

void record_classes(py::object memory_record, py::object tensor_meta, py::object op, py::object host,
                    py::object counted_cost, py::object copy_family) {
  g_memory_record = memory_record.release().ptr();
  g_tensor_meta = tensor_meta.release().ptr();
  g_op_record = op.release().ptr();
  g_host_record = host.release().ptr();
  g_counted_cost = counted_cost.release().ptr();
  g_copy_family = copy_family.release().ptr();
}

void record_start() {
  names();
  std::vector<PyObject*> costs;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    costs = clear_log();
    g_recording = true;
  }
  {
    std::lock_guard<std::mutex> lock(g_host_mu);
    ++g_host_epoch;
    g_host_live = 0;
    g_host_peak = 0;
  }
  release_all(costs);
  release_all(clear_meta_objs());
}

void record_stop() {
  std::vector<PyObject*> costs;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_recording = false;
    costs = clear_log();
  }
  release_all(costs);
  release_all(clear_meta_objs());
}

// (new tensor metas, records) since the last drain, the records numbered from `seq` on: each event as
// the record tpusim/backend/program_trace/recorder.py appends (OpRecord, MemoryRecord, HostRecord), untracked by the
// garbage collector; an op's cost is the one computed at the op, else costs.counted_cost's.
py::tuple record_drain(Py_ssize_t seq) {
  const Names& n = names();
  std::vector<Event> events;
  std::vector<int32_t> all_refs;
  std::vector<NewMeta> new_metas;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    events.swap(g_events);
    all_refs.swap(g_refs);
    new_metas.swap(g_new_metas);
    g_events.reserve(events.size());  // the next step logs about as much: no regrowth per op
    g_refs.reserve(all_refs.size());
  }
  struct Costs {  // the costs computed at ops: released however the drain ends
    std::vector<Event>& events;
    ~Costs() {
      for (auto& e : events) {
        Py_XDECREF(e.cost);
        e.cost = nullptr;
      }
    }
  } owned{events};
  py::list metas = metas_to_py(new_metas);
  py::list out;
  for (auto& e : events) {
    const Py_ssize_t at = seq++;
    PyObject* record = nullptr;
    switch (e.kind) {
      case kAlloc:
      case kFree:
        record = make_record(
            g_memory_record, {{"seq", PyLong_FromSsize_t(at)}, {"event", new_ref(e.kind == kAlloc ? n.alloc : n.free)},
                              {"storage", PyLong_FromLongLong(e.a)}, {"bytes", PyLong_FromLongLong(e.b)},
                              {"rank", PyLong_FromLong(0)}});
        break;
      case kOp:
        if (e.cost != nullptr) {
          CostFacts facts = facts_of(e.cost);
          try {
            record = op_record(at, e, all_refs, facts);
          } catch (...) {
            facts.release();
            throw;
          }
          facts.release();
        } else {
          record = op_record(at, e, all_refs, counted_facts(e.name, all_refs, e.first, e.n_in, e.n_out));
        }
        break;
      case kCopy: {
        PyObject* dtype = e.name;  // a copy's event name is its destination's dtype
        record = make_record(g_op_record, {{"seq", PyLong_FromSsize_t(at)}, {"op", new_ref(n.copy)},
                                           {"unit", new_ref(n.dma)}, {"dtype", new_ref(dtype)},
                                           {"inputs", meta_tuple(all_refs, e.first, 1)},
                                           {"outputs", meta_tuple(all_refs, e.first + 1, 1)},
                                           {"flops", PyFloat_FromDouble(0.0)}, {"transcendentals", PyFloat_FromDouble(0.0)},
                                           {"bytes_read", PyFloat_FromDouble(static_cast<double>(e.a))},
                                           {"bytes_written", PyFloat_FromDouble(static_cast<double>(e.b))},
                                           {"matmul", new_ref(Py_None)}, {"source", new_ref(e.source)},
                                           {"rank", PyLong_FromLong(0)}, {"program", PyLong_FromLong(0)},
                                           {"family", new_ref(g_copy_family)}});
        break;
      }
      default:
        record = make_record(g_host_record, {{"seq", PyLong_FromSsize_t(at)}, {"event", new_ref(e.name)},
                                             {"reason", new_ref(e.reason)}, {"bytes", PyLong_FromLongLong(e.a)},
                                             {"seconds", PyFloat_FromDouble(0.0)}, {"source", new_ref(e.source)},
                                             {"rank", PyLong_FromLong(0)}, {"storage", PyLong_FromLongLong(e.b)},
                                             {"host", PyLong_FromLongLong(e.c)},
                                             {"non_blocking", PyBool_FromLong(e.non_blocking ? 1 : 0)}});
    }
    out.append(py::reinterpret_steal<py::object>(record));
  }
  return py::make_tuple(std::move(metas), std::move(out));
}

// (new tensor metas, the meta index of each of `tensors`) for records the recorder makes itself.
py::tuple record_metas(const std::vector<at::Tensor>& tensors) {
  std::vector<int32_t> indices;
  std::vector<NewMeta> new_metas;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    for (const auto& t : tensors) {
      indices.push_back(meta_of(t));
    }
    new_metas.swap(g_new_metas);
  }
  py::list out;
  for (int32_t i : indices) {
    out.append(py::int_(i));
  }
  return py::make_tuple(metas_to_py(new_metas), std::move(out));
}

// A fresh tensor id, for values that live only inside a compiled program (tpusim/backend/program_trace/recorder.py).
int64_t record_tensor_id() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  return ++g_last_tid;
}

}  // namespace tpusim
