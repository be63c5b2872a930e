// The boxed fallback of the "tpu" device: every op without a kernel of its own runs here.
//
// The common call never enters Python: the op runs as its CPU kernel (meta in shape-only mode)
// on zero-copy host aliases of its tpu tensors, its results are mapped back to the device
// exactly as tpusim/backend/dispatch/fallback.py's docstring describes (aliases of an input become that input,
// fresh results are adopted, written arguments get the kernel's shape and bytes; random ops draw
// from the device's generator), and, while recording, the op goes into the recording log
// (record.cpp) with its user source line. In shape-only mode the results of a signature seen
// before are made without running the (often Python) meta kernel again.
//
// Everything else is handed to the Python fallback (tpusim/backend/dispatch/fallback.py), called as a Python
// fallback registered with torch.library would be: ops its plan sends there (hand-written
// kernels, device arguments, ops outside aten; asked once per overload), calls only
// it handles (float64/complex tensors: the policy; tensors of two devices: the error; CPU
// tensors: index ops; tensor subclasses and dispatch modes), and every call while the simulator
// target is not held or debug eager mode is on (set_fast). In shape-only mode a kernel error is
// rerun there, so the user reads the Python fallback's explanation of it. Costs whose rule reads
// an op's arguments are asked of tpusim/backend/program_trace/recorder.py once per signature (shaped_cost).
#include "tpu_shim.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <pthread.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tpusim {

namespace {

namespace py = pybind11;
using c10::DispatchKey;

std::atomic<bool> g_fast{false};
PyObject* g_python_fallback = nullptr;  // tpusim/backend/dispatch/fallback.py fallback(op, *args, **kwargs)
PyObject* g_planner = nullptr;          // tpusim/backend/dispatch/fallback.py native_plan("aten::add.Tensor") -> tuple
PyObject* g_shaped_cost = nullptr;      // tpusim/backend/program_trace/recorder.py shaped_cost(name, inputs, outputs, args)

// ---------------------------------------------------------------- fused RNN cells
//
// ATen hands an accelerator's LSTM/GRU cell arithmetic to one op, _thnn_fused_*_cell, whose only kernels
// are CUDA's. tpusim/backend/aten/handwritten_kernels.py defines them for the device as the sequence of CPU ops CPU's own cells
// run (so a cell on tpu gives CPU's bits); these are the same sequences, op for op, for the C++ path:
// the Python ones cost a Python call per time step (tests/backend/test_fallback_speed_invariants.py
// checks the two give the same bits). Each pops its arguments (host aliases) and pushes its results.
using NativeKernel = void (*)(torch::jit::Stack*);

at::Tensor opt_tensor(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

// What CPU's linear_ih(x) and linear_hh(h) return: the gate matmuls plus biases; the hidden one is fresh.
std::pair<at::Tensor, at::Tensor> rnn_gates(const at::Tensor& igates, const at::Tensor& hgates,
                                            const at::Tensor& ibias, const at::Tensor& hbias) {
  return {ibias.defined() ? at::add(igates, ibias) : igates, hbias.defined() ? at::add(hgates, hbias) : hgates.clone()};
}

void lstm_cell(torch::jit::Stack* stack) {  // (input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
  auto a = torch::jit::pop(*stack, 5);
  auto [i_gates, gates] = rnn_gates(a[0].toTensor(), a[1].toTensor(), opt_tensor(a[3]), opt_tensor(a[4]));
  gates.add_(i_gates);
  auto chunks = gates.unsafe_chunk(4, 1);
  chunks[0].sigmoid_();
  chunks[1].sigmoid_();
  chunks[2].tanh_();
  chunks[3].sigmoid_();
  at::Tensor cy = at::mul(chunks[1], a[2].toTensor()).add_(at::mul(chunks[0], chunks[2]));
  at::Tensor hy = at::mul(chunks[3], cy.tanh());
  torch::jit::push(stack, hy, cy, gates);
}

void lstm_cell_backward(torch::jit::Stack* stack) {  // (grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
  auto a = torch::jit::pop(*stack, 6);
  at::Tensor grad_hy = opt_tensor(a[0]);
  at::Tensor grad_cy = opt_tensor(a[1]);
  if (!grad_hy.defined() && !grad_cy.defined()) {
    torch::jit::push(stack, at::Tensor(), at::Tensor(), at::Tensor());
    return;
  }
  const at::Tensor& cx = a[2].toTensor();
  const at::Tensor& cy = a[3].toTensor();
  auto w = a[4].toTensor().unsafe_chunk(4, 1);  // ingate, forgetgate, cellgate, outgate
  at::Tensor grad_out;
  if (grad_hy.defined()) {  // hy = outgate * tanh(cy)
    at::Tensor tanh_cy = cy.tanh();
    grad_out = at::mul(grad_hy, tanh_cy);
    at::Tensor grad_c = at::tanh_backward(at::mul(grad_hy, w[3]), tanh_cy);
    grad_cy = grad_cy.defined() ? at::add(grad_cy, grad_c) : grad_c;
  }
  at::Tensor grad_cx = at::mul(grad_cy, w[1]);  // cy = forgetgate * cx + ingate * cellgate
  at::Tensor grad_gates = at::cat({at::sigmoid_backward(at::mul(grad_cy, w[2]), w[0]),
                                   at::sigmoid_backward(at::mul(grad_cy, cx), w[1]),
                                   at::tanh_backward(at::mul(grad_cy, w[0]), w[2]),
                                   grad_out.defined() ? at::sigmoid_backward(grad_out, w[3]) : at::zeros_like(grad_cx)},
                                  1);
  at::Tensor grad_bias = a[5].toBool() ? at::sum(grad_gates, c10::IntArrayRef{0}) : at::Tensor();
  torch::jit::push(stack, grad_gates, grad_cx, grad_bias);
}

void gru_cell(torch::jit::Stack* stack) {  // (input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
  auto a = torch::jit::pop(*stack, 5);
  const at::Tensor& hx = a[2].toTensor();
  auto [i_gates, h_gates] = rnn_gates(a[0].toTensor(), a[1].toTensor(), opt_tensor(a[3]), opt_tensor(a[4]));
  auto i = i_gates.unsafe_chunk(3, 1);
  auto h = h_gates.unsafe_chunk(3, 1);
  at::Tensor resetgate = h[0].add_(i[0]).sigmoid_();
  at::Tensor inputgate = h[1].add_(i[1]).sigmoid_();
  at::Tensor h_n_biased = h[2].clone();
  at::Tensor newgate = i[2].add(h[2].mul_(resetgate)).tanh_();
  at::Tensor hy = at::sub(hx, newgate).mul_(inputgate).add_(newgate);
  torch::jit::push(stack, hy, at::cat({resetgate, inputgate, newgate, hx, h_n_biased}, 1));
}

void gru_cell_backward(torch::jit::Stack* stack) {  // (grad_hy, workspace, has_bias)
  auto a = torch::jit::pop(*stack, 3);
  const at::Tensor& grad_hy = a[0].toTensor();
  auto w = a[1].toTensor().unsafe_chunk(5, 1);  // resetgate, inputgate, newgate, hx, h_n + b_hn
  at::Tensor newgate = w[2].contiguous();        // CPU's tanh_backward reads n as a whole tensor: same layout
  at::Tensor grad_hx = at::mul(grad_hy, w[1]);
  at::Tensor grad_z = at::sigmoid_backward(at::mul(grad_hy, at::sub(w[3], newgate)), w[1]);
  at::Tensor grad_pre_n = at::tanh_backward(at::add(grad_hy, grad_hx.neg()), newgate);
  at::Tensor grad_r = at::sigmoid_backward(at::mul(grad_pre_n, w[4]), w[0]);
  at::Tensor grad_input = at::cat({grad_r, grad_z, grad_pre_n}, 1);
  at::Tensor grad_hidden = at::cat({grad_r, grad_z, at::mul(grad_pre_n, w[0])}, 1);
  const bool bias = a[2].toBool();
  torch::jit::push(stack, grad_input, grad_hidden, grad_hx, bias ? at::sum(grad_input, c10::IntArrayRef{0}) : at::Tensor(),
                   bias ? at::sum(grad_hidden, c10::IntArrayRef{0}) : at::Tensor());
}

// Adding a native kernel = one row here (and its Python twin in tpusim/backend/aten/handwritten_kernels.py).
const std::unordered_map<std::string, NativeKernel>& native_kernels() {
  static const std::unordered_map<std::string, NativeKernel> table{
      {"aten::_thnn_fused_lstm_cell", &lstm_cell},
      {"aten::_thnn_fused_lstm_cell_backward_impl", &lstm_cell_backward},
      {"aten::_thnn_fused_gru_cell", &gru_cell},
      {"aten::_thnn_fused_gru_cell_backward", &gru_cell_backward},
  };
  return table;
}

// What the fallback needs to know about one overload, from tpusim/backend/dispatch/fallback.py's plan (asked once).
struct Plan {
  PyObject* op = nullptr;        // the OpOverload
  PyObject* name = nullptr;      // "aten::add": the recorded name
  bool python = true;            // always the Python fallback
  bool shaped = false;           // its cost rule reads its arguments (tpusim/backend/program_trace/costs.py): priced at the op
  bool mutable_kw = false;       // it writes kwarg-only (out=) arguments: kwarg tensors are not inputs
  bool views = false;            // a result may alias an input without writing it (a view op)
  bool random = false;           // it draws random numbers: from the device's generator
  int64_t generator = -1;        // its Generator? argument, or -1
  size_t kwarg_start = 0;        // first kwarg-only argument
  std::vector<uint8_t> written;  // per argument: the op writes it
  std::vector<uint8_t> dtype;    // per argument: a dtype argument (float64 goes to the policy)
  NativeKernel native = nullptr;  // a C++ kernel in place of the CPU one (native_kernels)
};

std::mutex g_plan_mu;
std::unordered_map<c10::OperatorHandle, std::unique_ptr<Plan>> g_plans;

std::unique_ptr<Plan> ask_plan(const c10::OperatorHandle& op) {
  TORCH_CHECK(g_planner != nullptr, "tpusim: the tpu device's fallback is not installed (tpusim/backend/dispatch/fallback.py)");
  const auto& name = op.operator_name();
  const std::string qualified = name.name + "." + (name.overload_name.empty() ? "default" : name.overload_name);
  const auto& arguments = op.schema().arguments();
  auto plan = std::make_unique<Plan>();
  plan->written.assign(arguments.size(), 0);
  plan->dtype.assign(arguments.size(), 0);
  plan->kwarg_start = arguments.size();
  while (plan->kwarg_start > 0 && arguments[plan->kwarg_start - 1].kwarg_only()) {
    --plan->kwarg_start;
  }
  py::gil_scoped_acquire gil;
  py::object answer = py::reinterpret_steal<py::object>(PyObject_CallOneArg(g_planner, py::str(qualified).ptr()));
  if (!answer) {
    throw python_error();
  }
  auto t = answer.cast<py::tuple>();  // (op, name, python, shaped, written, dtypes, views, random, generator,
                                      //  native_ok)
  plan->op = py::object(t[0]).release().ptr();
  plan->name = py::object(t[1]).release().ptr();
  plan->python = t[2].cast<bool>();
  plan->shaped = t[3].cast<bool>();
  for (auto i : t[4].cast<std::vector<size_t>>()) {
    plan->written.at(i) = 1;
    plan->mutable_kw = plan->mutable_kw || i >= plan->kwarg_start;
  }
  for (auto i : t[5].cast<std::vector<size_t>>()) {
    plan->dtype.at(i) = 1;
  }
  plan->views = t[6].cast<bool>();
  plan->random = t[7].cast<bool>();
  plan->generator = t[8].cast<int64_t>();
  auto native = native_kernels().find(name.name);
  if (native != native_kernels().end() && t[9].cast<bool>()) {  // its only Python reason was the kernel
    plan->native = native->second;
    plan->python = false;
  }
  return plan;
}

const Plan& plan_of(const c10::OperatorHandle& op) {
  {
    std::lock_guard<std::mutex> lock(g_plan_mu);
    auto it = g_plans.find(op);
    if (it != g_plans.end()) {
      return *it->second;
    }
  }
  auto plan = ask_plan(op);  // never while holding g_plan_mu: it takes the GIL
  std::lock_guard<std::mutex> lock(g_plan_mu);
  return *g_plans.emplace(op, std::move(plan)).first->second;  // a racing thread's plan wins: the same
}

// The Python fallback runs with the Python dispatch key off, as torch.library's Python kernels do.
struct PythonKeyOff {
  bool excluded = c10::impl::tls_is_dispatch_key_excluded(DispatchKey::Python);
  bool included = c10::impl::tls_is_dispatch_key_included(DispatchKey::Python);
  bool snapshot = c10::impl::tls_is_dispatch_key_included(DispatchKey::PythonTLSSnapshot);
  PythonKeyOff() {
    c10::impl::tls_set_dispatch_key_excluded(DispatchKey::Python, true);
    c10::impl::tls_set_dispatch_key_included(DispatchKey::Python, false);
    c10::impl::tls_set_dispatch_key_included(DispatchKey::PythonTLSSnapshot, false);
  }
  ~PythonKeyOff() {
    c10::impl::tls_set_dispatch_key_excluded(DispatchKey::Python, excluded);
    c10::impl::tls_set_dispatch_key_included(DispatchKey::Python, included);
    c10::impl::tls_set_dispatch_key_included(DispatchKey::PythonTLSSnapshot, snapshot);
  }
};

// ---------------------------------------------------------------- arguments as Python sees them

bool is_type(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) {
    return true;
  }
  auto opt = t->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == kind;
}

py::object to_py(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) {
    return py::none();
  }
  if (is_type(arg, c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
  }
  if (is_type(arg, c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
  }
  if (is_type(arg, c10::MemoryFormatType::Kind)) {
    return py::cast(static_cast<c10::MemoryFormat>(v.toInt()));
  }
  return torch::jit::toPyObject(v);
}

// Positional arguments up to the trailing ones left at their defaults, then the kwarg-only ones not
// at their defaults: how torch hands a boxed call to a Python kernel.
std::pair<py::tuple, py::dict> py_args(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                                       size_t leading, bool with_kwargs) {
  const auto& schema = op.schema().arguments();
  const size_t n = arguments.size();
  auto is_default = [&](size_t i) {
    const auto& d = schema[i].default_value();
    return d.has_value() && *d == arguments[i];
  };
  size_t kwarg_start = n;
  while (kwarg_start > 0 && schema[kwarg_start - 1].kwarg_only()) {
    --kwarg_start;
  }
  size_t positional = kwarg_start;
  while (positional > 0 && is_default(positional - 1)) {
    --positional;
  }
  py::tuple args(leading + positional);
  for (size_t i = 0; i < positional; ++i) {
    args[leading + i] = to_py(schema[i], arguments[i]);
  }
  py::dict kwargs;
  if (with_kwargs) {
    for (size_t i = kwarg_start; i < n; ++i) {
      if (!is_default(i)) {
        kwargs[py::str(schema[i].name())] = to_py(schema[i], arguments[i]);
      }
    }
  }
  return {std::move(args), std::move(kwargs)};
}

void call_python(const c10::OperatorHandle& op, const Plan& plan, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  auto arguments = torch::jit::pop(*stack, schema.arguments().size());
  py::gil_scoped_acquire gil;
  PythonKeyOff off;
  auto [args, kwargs] = py_args(op, arguments, 1, true);
  args[0] = py::reinterpret_borrow<py::object>(plan.op);
  auto out = py::reinterpret_steal<py::object>(PyObject_Call(g_python_fallback, args.ptr(), kwargs.ptr()));
  if (!out) {
    throw python_error();
  }
  const auto& returns = schema.returns();
  if (returns.empty()) {
    TORCH_CHECK(out.is_none(), "tpusim: the fallback of ", op.operator_name(), " returned a value");
  } else if (returns.size() == 1) {
    torch::jit::push(stack, torch::jit::toIValue(out, returns[0].real_type()));
  } else {
    auto outs = py::cast<py::sequence>(out);
    for (size_t i = 0; i < outs.size(); ++i) {
      torch::jit::push(stack, torch::jit::toIValue(outs[i], returns[i].real_type()));
    }
  }
}

// ---------------------------------------------------------------- the C++ path

bool non_native(c10::ScalarType st) {  // tpusim/backend/aten/float64_policy.py NON_NATIVE_DTYPES
  return st == c10::kDouble || st == c10::kComplexHalf || st == c10::kComplexFloat || st == c10::kComplexDouble;
}

// Whether this tensor argument lets the call stay in C++; picks the call's device from the first tpu tensor.
bool stays(const at::Tensor& t, int* device) {
  if (!t.defined()) {
    return true;
  }
  if (t.key_set().has(DispatchKey::Python)) {
    return false;
  }
  if (t.is_privateuseone()) {
    if (*device < 0) {
      *device = t.device().index();
    } else if (t.device().index() != *device) {
      return false;
    }
    return !non_native(t.scalar_type());
  }
  return t.dim() == 0;  // a CPU scalar is fine beside tpu tensors (CUDA's rule); anything bigger is not
}

bool stays_in_cpp(const Plan& plan, c10::ArrayRef<c10::IValue> args, int* device) {
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& v = args[i];
    if (v.isTensor()) {
      if (!stays(v.toTensor(), device)) {
        return false;
      }
    } else if (v.isList()) {
      for (const auto& e : v.toListRef()) {
        if (e.isTensor() && !stays(e.toTensor(), device)) {
          return false;
        }
      }
    } else if (plan.dtype[i] && v.isInt() && non_native(static_cast<c10::ScalarType>(v.toInt()))) {
      return false;
    }
  }
  return true;
}

// A CPU scalar beside meta aliases (shape-only mode, where meta kernels refuse CPU tensors): a meta
// scalar, as the Python fallback makes it (a Python number becomes torch.tensor(number)).
at::Tensor meta_scalar(const at::Tensor& t) {
  c10::ScalarType st = t.scalar_type();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    const auto floating = c10::typeMetaToScalarType(c10::get_default_dtype());
    if (c10::isFloatingType(st)) {
      st = floating;
    } else if (c10::isComplexType(st)) {
      st = c10::toComplexType(floating);
    }
  }
  return at::empty({}, at::TensorOptions().dtype(st).device(c10::kMeta));
}

struct Call {
  const Plan& plan;
  bool meta = config().no_data;
  bool recording = g_recording.load(std::memory_order_relaxed);
  struct Arg {
    at::Tensor alias;                    // the host alias passed to the kernel
    at::Tensor dev;                      // its device tensor
    bool written;                        // the op writes this argument
  };
  std::vector<Arg> args;                                               // one per tensor argument, in order
  std::vector<std::pair<at::Tensor, at::Tensor>> written;              // (device tensor, alias) the op writes
  std::vector<at::Tensor> inputs;                                      // recorded inputs

  // The host alias to pass for `t` (argument `i`).
  at::Tensor host(const at::Tensor& t, size_t i) {
    if (!t.defined()) {
      return t;
    }
    if (!t.is_privateuseone()) {
      return meta && t.is_cpu() ? meta_scalar(t) : t;
    }
    // The same device tensor twice (x.logical_and_(y) calls logical_and.out(x, y, out=x)): one host alias,
    // so the CPU kernel sees its output is also an input and refuses to resize it, as it does on CPU.
    at::Tensor alias;
    for (const Arg& a : args) {
      if (a.dev.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        alias = a.alias;
        break;
      }
    }
    if (!alias.defined()) {
      alias = host_alias(t);
    }
    args.push_back({alias, t, plan.written[i] != 0});
    if (plan.written[i]) {
      written.emplace_back(t, alias);
    }
    if (recording && !(plan.mutable_kw && i >= plan.kwarg_start)) {
      inputs.push_back(t);
    }
    return alias;
  }

  c10::IValue convert(const c10::IValue& v, size_t i) {
    if (v.isTensor()) {
      return host(v.toTensor(), i);
    }
    if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) {
        out.push_back(host(t, i));
      }
      return out;
    }
    if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        out.push_back(t.has_value() ? std::optional<at::Tensor>(host(*t, i)) : std::nullopt);
      }
      return out;
    }
    return v;
  }

  // The device tensor an output is, when it is an alias passed in (in-place and out= ops return it).
  const at::Tensor* device_of(const at::Tensor& t) const {
    for (const Arg& a : args) {
      if (a.alias.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return &a.dev;
      }
    }
    return nullptr;
  }
};

// ---------------------------------------------------------------- costs of shaped ops

// A shaped cost rule (tpusim/backend/program_trace/costs.py) reads the shapes, dtypes and sizes of an op's tensors and its
// other arguments, never values: its Cost is kept per (op, those facts), so the rule runs once per
// signature. A key word per fact; arguments of a kind not listed here make the call uncached.
struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t x : v) {
      h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};
std::unordered_map<std::vector<int64_t>, PyObject*, KeyHash> g_costs;  // GIL held; values owned

void key_tensor(std::vector<int64_t>& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  key.insert(key.end(), t.sizes().begin(), t.sizes().end());
}

bool key_value(std::vector<int64_t>& key, const c10::IValue& v) {
  if (v.isTensor()) {
    key.push_back(1);
    key_tensor(key, v.toTensor());
  } else if (v.isNone()) {
    key.push_back(2);
  } else if (v.isInt()) {
    key.push_back(3);
    key.push_back(v.toInt());
  } else if (v.isBool()) {
    key.push_back(v.toBool() ? 5 : 4);
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    key.push_back(6);
    key.push_back(bits);
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    key.push_back(7);
    key.push_back(static_cast<int64_t>(list.size()));
    for (int64_t x : list) {
      key.push_back(x);
    }
  } else if (v.isBoolList()) {
    auto list = v.toBoolList();
    key.push_back(8);
    key.push_back(static_cast<int64_t>(list.size()));
    for (bool x : list) {
      key.push_back(x ? 1 : 0);
    }
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    key.push_back(9);
    key.push_back(static_cast<int64_t>(list.size()));
    for (const at::Tensor& t : list) {
      key_tensor(key, t);
    }
  } else {
    return false;  // a kind this key does not spell: priced fresh each time
  }
  return true;
}

PyObject* shaped_cost(const c10::OperatorHandle& op, const Plan& plan, const std::vector<c10::IValue>& original,
                      const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs) {
  std::vector<int64_t> key{reinterpret_cast<int64_t>(&plan), static_cast<int64_t>(original.size())};
  bool cacheable = true;
  for (const auto& v : original) {
    cacheable = cacheable && key_value(key, v);
  }
  for (const auto* group : {&ins, &outs}) {
    key.push_back(static_cast<int64_t>(group->size()));
    for (const auto& t : *group) {
      key_tensor(key, t);
    }
  }
  if (cacheable) {
    auto it = g_costs.find(key);
    if (it != g_costs.end()) {
      Py_INCREF(it->second);
      return it->second;
    }
  }
  auto args = py_args(op, original, 0, false).first;
  PyObject* cost = PyObject_CallFunctionObjArgs(g_shaped_cost, plan.name, py::cast(ins).ptr(), py::cast(outs).ptr(),
                                                args.ptr(), nullptr);
  if (cost == nullptr) {
    throw python_error();
  }
  if (cacheable) {
    if (g_costs.size() > 100000) {  // a program of ever-new shapes: keep the memory bounded
      for (auto& [k, c] : g_costs) {
        Py_DECREF(c);
      }
      g_costs.clear();
    }
    Py_INCREF(cost);
    g_costs.emplace(std::move(key), cost);
  }
  return cost;
}

// ---------------------------------------------------------------- shape-only results per signature

// In shape-only mode an op's results are a function of its arguments' metadata (meta kernels read
// nothing else), and many meta kernels are Python (torch._refs, foreach ops): so the first call of
// each signature runs the kernel and notes what it returned (fresh tensors: their storage groups,
// sizes, strides, dtype; or the argument returned), and later calls make those results directly.
// Only for calls whose written arguments keep their shape and whose results are fresh tensors or
// arguments (never views of an input: those stay with the kernel).
std::atomic<bool> g_meta_cache{true};

struct Result {
  int kind = 0;  // 0: undefined; 1: the device tensor of argument tensor `arg`; 2: fresh, in storage `group`
  size_t arg = 0;
  size_t group = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
};

struct Signature {
  bool cacheable = false;
  std::vector<int64_t> group_bytes;        // each fresh storage's size
  std::vector<std::vector<Result>> rets;   // per return: one result, or a list's
  std::vector<uint8_t> is_list;
};

std::mutex g_sig_mu;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Signature>, KeyHash> g_signatures;

void sig_tensor(std::vector<int64_t>& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(static_cast<int64_t>(t.scalar_type()) * 16 + (t.is_privateuseone() ? 8 : 0) +
                (t.unsafeGetTensorImpl()->is_wrapped_number() ? 4 : 0) + (t.is_conj() ? 2 : 0) + (t.is_neg() ? 1 : 0));
  key.push_back(t.dim());
  key.insert(key.end(), t.sizes().begin(), t.sizes().end());
  key.insert(key.end(), t.strides().begin(), t.strides().end());
  key.push_back(t.storage_offset());
}

bool sig_value(std::vector<int64_t>& key, const c10::IValue& v) {
  if (v.isTensor()) {
    key.push_back(1);
    sig_tensor(key, v.toTensor());
  } else if (v.isString()) {
    const auto& text = v.toStringRef();
    key.push_back(10);
    key.push_back(static_cast<int64_t>(text.size()));
    key.insert(key.end(), text.begin(), text.end());
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    key.push_back(11);
    key.push_back(static_cast<int64_t>(list.size()));
    for (double d : list) {
      int64_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(bits);
    }
  } else if (v.isList() && !v.isIntList() && !v.isBoolList() && !v.isTensorList()) {
    key.push_back(12);  // Tensor?[]
    key.push_back(static_cast<int64_t>(v.toListRef().size()));
    for (const auto& e : v.toListRef()) {
      if (e.isNone()) {
        key.push_back(-3);
      } else if (e.isTensor()) {
        sig_tensor(key, e.toTensor());
      } else {
        return false;
      }
    }
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    key.push_back(9);
    key.push_back(static_cast<int64_t>(list.size()));
    for (const at::Tensor& t : list) {
      sig_tensor(key, t);
    }
  } else {
    return key_value(key, v);  // None, numbers, int and bool lists
  }
  return true;
}

// What the kernel returned (host results still on the stack), if later calls can make it themselves.
std::shared_ptr<const Signature> note_results(const torch::jit::Stack& stack, size_t nret, const Call& call) {
  auto sig = std::make_shared<Signature>();
  for (const auto& [dev, alias] : call.written) {  // a written argument that changed shape: not cacheable
    if (dev.sizes() != alias.sizes() || dev.strides() != alias.strides() ||
        dev.storage_offset() != alias.storage_offset() || alias.storage().nbytes() > dev.storage().nbytes()) {
      return sig;
    }
  }
  std::unordered_map<const c10::StorageImpl*, size_t> groups;
  auto note = [&](const at::Tensor& t, Result& out) {
    if (!t.defined()) {
      return true;
    }
    // the argument it is; one passed twice (x.logical_and_(y) runs logical_and.out(x, y, out=x)) is the
    // argument the op writes, which a later call of the same signature may pass apart from its inputs
    const auto& args = call.args;
    size_t pick = args.size();
    for (size_t k = 0; k < args.size(); ++k) {
      if (args[k].alias.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        if (args[k].written) {
          pick = k;
          break;
        }
        pick = pick < args.size() ? pick : k;
      }
    }
    if (pick < args.size()) {
      out.kind = 1;
      out.arg = pick;
      return true;
    }
    auto* si = t.storage().unsafeGetStorageImpl();
    if (t.is_privateuseone() || is_host_alias(si) || t.layout() != c10::Layout::Strided || t.is_conj() ||
        t.is_neg()) {
      return false;
    }
    auto found = groups.find(si);
    if (found == groups.end()) {
      found = groups.emplace(si, sig->group_bytes.size()).first;
      sig->group_bytes.push_back(static_cast<int64_t>(si->nbytes()));
    }
    out.kind = 2;
    out.group = found->second;
    out.sizes = t.sizes().vec();
    out.strides = t.strides().vec();
    out.offset = t.storage_offset();
    out.dtype = t.dtype();
    return true;
  };
  const size_t rbase = stack.size() - nret;
  for (size_t r = 0; r < nret; ++r) {
    const auto& v = stack[rbase + r];
    std::vector<Result> results;
    if (v.isTensor()) {
      results.emplace_back();
      if (!note(v.toTensor(), results.back())) {
        return sig;
      }
      sig->is_list.push_back(0);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        results.emplace_back();
        if (!note(t, results.back())) {
          return sig;
        }
      }
      sig->is_list.push_back(1);
    } else {
      return sig;
    }
    sig->rets.push_back(std::move(results));
  }
  sig->cacheable = true;
  return sig;
}

// The results of a call whose signature was seen: made on the device, no kernel run.
void push_results(torch::jit::Stack* stack, const Signature& sig, const std::vector<at::Tensor>& args, int device) {
  std::vector<c10::Storage> storages;
  storages.reserve(sig.group_bytes.size());
  for (int64_t nbytes : sig.group_bytes) {
    const auto n = static_cast<size_t>(nbytes);
    storages.emplace_back(c10::Storage::use_byte_size_t(), n, allocate_on(n, static_cast<c10::DeviceIndex>(device)),
                          device_allocator(), true);
  }
  auto make = [&](const Result& r) -> at::Tensor {
    if (r.kind == 0) {
      return at::Tensor();
    }
    if (r.kind == 1) {
      return args[r.arg];
    }
    auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storages[r.group]),
                                                      c10::DispatchKeySet(DispatchKey::PrivateUse1), r.dtype);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes, r.strides, r.offset);
    return t;
  };
  for (size_t i = 0; i < sig.rets.size(); ++i) {
    if (sig.is_list[i]) {
      c10::List<at::Tensor> list;
      for (const auto& r : sig.rets[i]) {
        list.push_back(make(r));
      }
      stack->emplace_back(std::move(list));
    } else {
      stack->emplace_back(make(sig.rets[i][0]));
    }
  }
}

// ---------------------------------------------------------------- random ops

// A random op draws from the device's generator (the call's Generator? if it is a tpu one, else the
// device's default), through CPU's default generator, as tpusim/backend/dispatch/fallback.py's _run_random does: the
// device generator's state goes into CPU's for the kernel and comes back after, so a seeded tpu
// program draws what the CPU one draws. A CPU generator passed in is used as it is.
struct DrawFrom {
  at::Generator host = at::detail::getDefaultCPUGenerator();
  at::Generator device;
  at::Tensor saved;

  DrawFrom(const Plan& plan, torch::jit::Stack* stack, size_t base, int index) {
    if (plan.generator >= 0) {
      auto& arg = (*stack)[base + static_cast<size_t>(plan.generator)];
      if (arg.isGenerator()) {
        at::Generator given = arg.toGenerator();
        if (given.device().type() != c10::DeviceType::PrivateUse1) {
          return;  // a CPU generator: used as given
        }
        device = given;
        arg = c10::IValue();
      }
    }
    if (!device.defined()) {
      device = default_generator(static_cast<c10::DeviceIndex>(index));
    }
    saved = host.get_state();
    host.set_state(device.get_state());
  }
  DrawFrom(const DrawFrom&) = delete;
  DrawFrom& operator=(const DrawFrom&) = delete;
  ~DrawFrom() {
    if (device.defined()) {
      device.set_state(host.get_state());
      host.set_state(saved);
    }
  }
};

// Where a fresh host result sits in the returns: (return index, list index or -1).
using Slot = std::pair<size_t, int64_t>;

void record_call(const c10::OperatorHandle& op, const Plan& plan, torch::jit::Stack* stack, size_t nret,
                 const Call& call, const std::vector<c10::IValue>& original);

void run_in_cpp(const c10::OperatorHandle& op, const Plan& plan, torch::jit::Stack* stack, int device) {
  const size_t n = op.schema().arguments().size();
  const size_t base = stack->size() - n;
  std::vector<c10::IValue> original(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  if (device < 0) {
    device = current_device();
  }
  const size_t nret = op.schema().returns().size();
  Call call{plan};
  std::vector<int64_t> signature;
  std::shared_ptr<const Signature> seen;
  if (call.meta && !plan.views && g_meta_cache.load(std::memory_order_relaxed)) {
    signature = {reinterpret_cast<int64_t>(&plan), device};
    bool keyed = true;
    for (const auto& v : original) {
      keyed = keyed && sig_value(signature, v);
    }
    if (!keyed) {
      signature.clear();
    } else {
      std::lock_guard<std::mutex> lock(g_sig_mu);
      auto it = g_signatures.find(signature);
      if (it != g_signatures.end()) {
        seen = it->second;
      }
    }
  }
  if (seen != nullptr && !seen->cacheable) {
    signature.clear();  // seen, and not makeable: run the kernel
  } else if (seen != nullptr) {
    std::vector<at::Tensor> args;  // the tpu tensors of the call, in argument order (Call::host's order)
    for (size_t i = 0; i < n; ++i) {
      auto add = [&](const at::Tensor& t) {
        if (t.defined() && t.is_privateuseone()) {
          args.push_back(t);
          if (plan.written[i]) {
            call.written.emplace_back(t, at::Tensor());
          }
          if (call.recording && !(plan.mutable_kw && i >= plan.kwarg_start)) {
            call.inputs.push_back(t);
          }
        }
      };
      const auto& v = original[i];
      if (v.isTensor()) {
        add(v.toTensor());
      } else if (v.isList()) {
        for (const auto& e : v.toListRef()) {
          if (e.isTensor()) {
            add(e.toTensor());
          }
        }
      }
    }
    stack->resize(base);
    push_results(stack, *seen, args, device);
    return record_call(op, plan, stack, nret, call, original);
  }
  for (size_t i = 0; i < n; ++i) {
    (*stack)[base + i] = call.convert(original[i], i);
  }
  try {
    PythonKeyOff off;
    std::optional<DrawFrom> draw;
    if (plan.random && !call.meta) {
      draw.emplace(plan, stack, base, device);
    }
    if (plan.native != nullptr) {
      plan.native(stack);
    } else {
      op.callBoxed(stack);
    }
  } catch (const python_error& err) {
    bool rerun = false;
    if (call.meta) {
      py::gil_scoped_acquire gil;
      rerun = err.type != nullptr && PyErr_GivenExceptionMatches(err.type, PyExc_Exception);  // not ^C
    }
    if (!rerun) {
      throw;
    }
    stack->resize(base);
    stack->insert(stack->end(), original.begin(), original.end());
    return call_python(op, plan, stack);
  } catch (const c10::Error&) {
    if (!call.meta) {
      throw;
    }
    stack->resize(base);
    stack->insert(stack->end(), original.begin(), original.end());
    return call_python(op, plan, stack);
  }

  if (!signature.empty()) {
    auto sig = note_results(*stack, nret, call);
    std::lock_guard<std::mutex> lock(g_sig_mu);
    if (g_signatures.size() > 200000) {  // a program of ever-new shapes: keep the memory bounded
      g_signatures.clear();
    }
    g_signatures.emplace(std::move(signature), std::move(sig));
  }
  for (const auto& [dev, alias] : call.written) {  // what the kernel did to written arguments
    sync_back(dev, alias);
  }
  const size_t rbase = stack->size() - nret;
  std::vector<at::Tensor> fresh;
  std::vector<Slot> slots;
  for (size_t r = 0; r < nret; ++r) {
    auto& v = (*stack)[rbase + r];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (const at::Tensor* dev = call.device_of(t)) {
        v = *dev;
      } else if (t.defined() && !t.is_privateuseone()) {
        fresh.push_back(t);
        slots.emplace_back(r, -1);
      }
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) {
        at::Tensor t = list.get(j);
        if (const at::Tensor* dev = call.device_of(t)) {
          list.set(j, *dev);
        } else if (t.defined() && !t.is_privateuseone()) {
          fresh.push_back(t);
          slots.emplace_back(r, static_cast<int64_t>(j));
        }
      }
    }
  }
  if (!fresh.empty()) {
    auto mapped = to_device(fresh, static_cast<c10::DeviceIndex>(device));
    for (size_t k = 0; k < slots.size(); ++k) {
      auto& v = (*stack)[rbase + slots[k].first];
      if (slots[k].second < 0) {
        v = mapped[k];
      } else {
        v.toTensorList().set(static_cast<size_t>(slots[k].second), mapped[k]);
      }
    }
  }
  record_call(op, plan, stack, nret, call, original);
}

void record_call(const c10::OperatorHandle& op, const Plan& plan, torch::jit::Stack* stack, size_t nret,
                 const Call& call, const std::vector<c10::IValue>& original) {
  if (!call.recording) {
    return;
  }
  const size_t rbase = stack->size() - nret;

  // What the recorder records (tpusim/backend/dispatch/fallback.py's record_op call): outputs in return order, then
  // written arguments not returned; tpu tensors only.
  std::vector<at::Tensor> outs;
  for (size_t r = 0; r < nret; ++r) {
    const auto& v = (*stack)[rbase + r];
    if (v.isTensor()) {
      if (v.toTensor().defined()) {
        outs.push_back(v.toTensor());
      }
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.defined()) {
          outs.push_back(t);
        }
      }
    }
  }
  for (const auto& [dev, alias] : call.written) {
    bool returned = false;
    for (const auto& o : outs) {
      returned = returned || o.unsafeGetTensorImpl() == dev.unsafeGetTensorImpl();
    }
    if (!returned) {
      outs.push_back(dev);
    }
  }
  outs.erase(std::remove_if(outs.begin(), outs.end(), [](const at::Tensor& t) { return !t.is_privateuseone(); }),
             outs.end());

  py::gil_scoped_acquire gil;
  bool printing = false;
  PyObject* source = user_source(&printing);
  PyObject* cost = plan.shaped ? shaped_cost(op, plan, original, call.inputs, outs) : nullptr;
  log_op(plan.name, call.inputs, outs, source, cost);
}

// At interpreter exit (tpusim/backend/device/shutdown.py), a thread other than the exiting one that still runs tpu ops
// (a daemon thread's loop) parks here for good, without the GIL. Why: returning to Python after finalization
// began, it would take the GIL, and Python ends such a thread mid-unwind: "terminate called without an active
// exception", exit 134, after the script succeeded. A parked thread ends with the process.
std::atomic<bool> g_parking{false};
pthread_t g_exiting_thread;

void park_if_exiting() {
  if (!g_parking.load(std::memory_order_acquire) || pthread_equal(pthread_self(), g_exiting_thread)) {
    return;
  }
  if (PyGILState_Check()) {
    PyEval_SaveThread();
  }
  for (;;) {
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void boxed_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  park_if_exiting();
  const Plan& plan = plan_of(op);
  count_eager_compile(op, torch::jit::last(*stack, op.schema().arguments().size()));
  int device = -1;
  if (plan.python || !g_fast.load(std::memory_order_relaxed) || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
      !stays_in_cpp(plan, torch::jit::last(*stack, op.schema().arguments().size()), &device)) {
    call_python(op, plan, stack);
  } else {
    run_in_cpp(op, plan, stack, device);
  }
  park_if_exiting();  // a thread that was inside this op when the exit began parks on its way out
}

torch::Library* g_fallback_library = nullptr;
torch::Library* g_op_library = nullptr;

}  // namespace

void park_other_threads() {
  g_exiting_thread = pthread_self();
  g_parking.store(true, std::memory_order_release);
}

void install_fallback(py::object python_fallback, py::object planner, py::object shaped_cost) {
  g_python_fallback = python_fallback.release().ptr();
  g_planner = planner.release().ptr();
  g_shaped_cost = shaped_cost.release().ptr();
  if (g_fallback_library == nullptr) {
    g_fallback_library = new torch::Library(torch::Library::IMPL, "_", DispatchKey::PrivateUse1, __FILE__, __LINE__);
    g_fallback_library->fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
  }
}

void register_fallback(const std::vector<std::string>& names) {
  if (g_op_library == nullptr) {
    g_op_library = new torch::Library(torch::Library::IMPL, "aten", DispatchKey::PrivateUse1, __FILE__, __LINE__);
  }
  for (const auto& name : names) {
    g_op_library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
  }
}

void set_fast(bool on) { g_fast = on; }

void set_meta_cache(bool on) { g_meta_cache = on; }

}  // namespace tpusim
