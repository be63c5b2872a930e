// Runtime of the "tpu" device: simulated-HBM allocator, device guard, streams/events, hooks,
// generators. Modelled on PyTorch's OpenReg (test/cpp_extensions/open_registration_extension).
#include "tpu_shim.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include <sys/mman.h>
#include <unistd.h>
#include <unordered_set>

namespace tpusim {

Config& config() {
  static Config c;
  return c;
}

// ---------------------------------------------------------------- allocator

namespace {

struct Block {
  int64_t id;
  size_t bytes;
  c10::DeviceIndex device;
  void* owned;                                    // from aligned_alloc, or null
  void* fake;                                     // shape-only: reserved PROT_NONE address range, or null
  size_t fake_bytes;
  c10::intrusive_ptr<c10::StorageImpl> adopted;   // host storage we took over, or null
};

std::mutex g_mu;
std::array<DeviceStats, kMaxDevices> g_stats;
std::atomic<int64_t> g_next_id{1};

std::string format_size(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  } else if (bytes < (1LL << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  } else if (bytes < (1LL << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  }
  return buf;
}

// Count `bytes` against the device's HBM; raise torch.OutOfMemoryError like CUDA does. Returns the
// peak before this charge, for `refund` when the host cannot back the block. Logged by make_block
// once the block exists, so a failed allocation never reaches the trace.
int64_t charge(c10::DeviceIndex device, size_t bytes) {
  const auto& cfg = config();
  int64_t in_use = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto& s = g_stats[device];
    if (cfg.hbm_bytes <= 0 || s.allocated + static_cast<int64_t>(bytes) <= cfg.hbm_bytes) {
      const int64_t prior_peak = s.peak;
      s.allocated += bytes;
      s.peak = std::max(s.peak, s.allocated);
      s.allocations += 1;
      s.allocated_total += bytes;
      s.live_blocks += 1;
      return prior_peak;
    }
    in_use = s.allocated;
  }
  const int64_t cap = cfg.hbm_bytes;
  TORCH_CHECK_WITH(OutOfMemoryError, false, "TPU out of memory. Tried to allocate ", format_size(bytes),
                   ". tpu:", static_cast<int>(device), " (simulated ", cfg.chip_display,
                   ") has a total HBM capacity of ", format_size(cap), " of which ",
                   format_size(cap - in_use), " is free. ", format_size(in_use),
                   " is allocated by tensors on this device. The capacity is the HBM of chip '", cfg.chip,
                   "' (set TPUSIM_CHIP to simulate another chip, or TPUSIM_HBM_BYTES to override the "
                   "capacity).");
  return 0;
}

// Undo `charge` for a block the host could not back: it never existed, so it is in no counter and
// not in the peak (issue 17: a failed host allocation was counted in the HBM peak).
void refund(c10::DeviceIndex device, size_t bytes, int64_t prior_peak) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& s = g_stats[device];
  s.allocated -= bytes;
  s.allocations -= 1;
  s.allocated_total -= bytes;
  s.live_blocks -= 1;
  s.peak = std::max(prior_peak, s.allocated);
}

void release(const Block* b) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& s = g_stats[b->device];
  s.allocated -= b->bytes;
  s.frees += 1;
  s.live_blocks -= 1;
  if (g_recording.load(std::memory_order_relaxed)) {
    log_memory(false, b->id, static_cast<int64_t>(b->bytes));
  }
}

void delete_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  release(b);
  if (b->owned != nullptr) {
    std::free(b->owned);
  }
  if (b->fake != nullptr) {
    munmap(b->fake, b->fake_bytes);
  }
  delete b;
}

// Shape-only mode: a storage has no host memory, but torch code compares and tests storage
// pointers (FSDP2's reset_sharded_param reads untyped_storage().data_ptr(), which refuses null
// with nonzero bytes). So each block gets its own address range reserved with PROT_NONE: unique,
// non-overlapping while live, costs no memory, and any dereference faults instead of reading
// garbage. Values are never read through it: host aliases are meta tensors in this mode.
void* reserve_fake(size_t nbytes, size_t* reserved) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  *reserved = (nbytes + page - 1) / page * page;
  void* p = mmap(nullptr, *reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

c10::DataPtr make_block(size_t nbytes, c10::DeviceIndex device, c10::intrusive_ptr<c10::StorageImpl> adopted) {
  check_device_index(device);
  const int64_t id = g_next_id.fetch_add(1);
  const int64_t prior_peak = charge(device, nbytes);
  auto* b = new Block{id, nbytes, device, nullptr, nullptr, 0, std::move(adopted)};
  void* data = nullptr;
  if (b->adopted) {
    data = b->adopted->mutable_data();
  } else if (nbytes > 0 && config().no_data) {
    b->fake = reserve_fake(nbytes, &b->fake_bytes);
    if (b->fake == nullptr) {
      refund(device, nbytes, prior_peak);
      delete b;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "tpusim: could not reserve ", format_size(nbytes),
                       " of address space for a shape-only tpu:", static_cast<int>(device), " storage");
    }
    data = b->fake;
  } else if (nbytes > 0) {
    b->owned = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (b->owned == nullptr) {
      refund(device, nbytes, prior_peak);
      delete b;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "tpusim: the host is out of memory allocating ",
                       format_size(nbytes), " of simulated HBM for tpu:", static_cast<int>(device),
                       " (TPUSIM_NUMERICS=off runs shapes only, without host memory)");
    }
    data = b->owned;
  }
  if (g_recording.load(std::memory_order_relaxed)) {
    log_memory(true, id, static_cast<int64_t>(nbytes));
  }
  return {data, b, &delete_block, c10::Device(c10::DeviceType::PrivateUse1, device)};
}

// A c10::DeviceAllocator, so torch.accelerator's memory API (memory_stats, memory_allocated,
// reset_peak_memory_stats, get_memory_info) reads the simulated HBM as it reads CUDA's. No caching:
// reserved equals allocated, and a block is freed when its storage dies.
struct DeviceAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return make_block(nbytes, current_device(), {}); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    if (count > 0 && dst != nullptr && src != nullptr && !config().no_data) {
      std::memcpy(dst, src, count);
    }
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const DeviceStats s = stats(device);
    c10::CachingDeviceAllocator::DeviceStats out;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, int64_t current, int64_t peak, int64_t allocated,
                   int64_t freed) {
      auto& all = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      all.current = current;
      all.peak = peak;
      all.allocated = allocated;
      all.freed = freed;
    };
    const int64_t freed_bytes = s.allocated_total - s.allocated;
    for (auto* bytes : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes, &out.requested_bytes}) {
      fill(*bytes, s.allocated, s.peak, s.allocated_total, freed_bytes);
    }
    for (auto* count : {&out.allocation, &out.segment, &out.active}) {
      fill(*count, s.live_blocks, s.live_blocks, s.allocations, s.frees);
    }
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const size_t total = static_cast<size_t>(config().hbm_bytes);
    const size_t used = static_cast<size_t>(stats(device).allocated);
    return {total > used ? total - used : 0, total};
  }
};

DeviceAllocator g_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

c10::Allocator* device_allocator() { return &g_allocator; }

c10::DataPtr allocate_on(size_t nbytes, c10::DeviceIndex device) { return make_block(nbytes, device, {}); }

c10::DataPtr adopt_host_storage(c10::intrusive_ptr<c10::StorageImpl> host, size_t nbytes, c10::DeviceIndex device) {
  return make_block(nbytes, device, std::move(host));
}

int64_t storage_id(const c10::StorageImpl* storage) {
  const auto& dp = storage->data_ptr();
  if (dp.get_deleter() != &delete_block) {
    return -1;
  }
  return static_cast<const Block*>(dp.get_context())->id;
}

DeviceStats stats(c10::DeviceIndex device) {
  check_device_index(device);
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats[device];
}

void reset_peak(c10::DeviceIndex device) {
  check_device_index(device);
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats[device].peak = g_stats[device].allocated;
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const auto old = storage->nbytes();
  const c10::DeviceIndex device = storage->device().index() >= 0 ? storage->device().index() : current_device();
  c10::DataPtr fresh = make_block(nbytes, device, {});
  const void* src = storage->data();
  if (fresh.get() != nullptr && src != nullptr && !config().no_data) {
    std::memcpy(fresh.get(), src, std::min<size_t>(old, nbytes));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

// ---------------------------------------------------------------- pinned host memory

namespace {

std::mutex g_pinned_mu;
std::unordered_set<const void*> g_pinned;

void delete_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(p);
  }
  std::free(p);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? std::aligned_alloc(64, (nbytes + 63) / 64 * 64) : nullptr;
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned.insert(p);
    }
    return {p, p, &delete_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_pinned; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }
};

PinnedAllocator g_pinned_allocator;

}  // namespace

// ---------------------------------------------------------------- devices, streams, events

namespace {

thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> t_stream{};  // 0 = default stream
std::atomic<c10::StreamId> g_next_stream{1};
constexpr c10::StreamId kPoolSize = 32;

struct TpuEvent {
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
  c10::DeviceIndex device = 0;
};

// Execution is synchronous on the simulator target: every stream is always idle, so waits are
// no-ops and events only carry a timestamp (elapsed_time works).
struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() >= 0 && d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  c10::Device getDevice() const override { return {kType, t_device}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "tpusim: expected a tpu device, got ", d);
    if (d.index() >= 0) {
      check_device_index(d.index());
      t_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < config().device_count) {
      t_device = d.index();
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    const auto i = d.index() >= 0 ? d.index() : t_device;
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, i), t_stream[i]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, d.index() >= 0 ? d.index() : t_device));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    const auto id = 1 + (g_next_stream.fetch_add(1) % kPoolSize);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() >= 0 ? d.index() : t_device), id);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const auto id = kPoolSize + g_next_stream.fetch_add(1);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, d.index() >= 0 ? d.index() : t_device), id);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return config().device_count; }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    if (*event == nullptr) {
      *event = new TpuEvent();
    }
    auto* e = static_cast<TpuEvent*>(*event);
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
    e->device = device_index >= 0 ? device_index : stream.device_index();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeEvent(void* /*event*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {}
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "tpusim: both events must be recorded before elapsed_time");
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

void check_device_index(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < config().device_count, "tpusim: invalid device tpu:",
              static_cast<int>(device), " (invalid device ordinal): this process sees ",
              static_cast<int>(config().device_count), " simulated device(s), tpu:0..tpu:",
              static_cast<int>(config().device_count) - 1,
              ", the slice's devices on its host. Set TPUSIM_DEVICES to change the count.");
}

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex device) {
  check_device_index(device);
  t_device = device;
}

// ---------------------------------------------------------------- generators

namespace {

// The CPU Philox-free mt19937 generator, labelled as a tpu device: with the same seed a tpu
// program draws the same numbers as the CPU one (the fallback runs CPU kernels on its state).
struct TpuGenerator final : at::CPUGeneratorImpl {
  explicit TpuGenerator(c10::DeviceIndex device) : at::CPUGeneratorImpl(c10::default_rng_seed_val) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device_.index());
    g->set_state(*get_state());
    return g;
  }
};

std::mutex g_gen_mu;
std::array<std::unique_ptr<at::Generator>, kMaxDevices> g_default_gens;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) {
    device = current_device();
  }
  check_device_index(device);
  std::lock_guard<std::mutex> lock(g_gen_mu);
  auto& slot = g_default_gens[device];
  if (!slot) {
    slot = std::make_unique<at::Generator>(at::make_generator<TpuGenerator>(device));
  }
  return *slot;
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) {
    device = current_device();
  }
  check_device_index(device);
  return at::make_generator<TpuGenerator>(device);
}

// ---------------------------------------------------------------- hooks

namespace {

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*device*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return config().device_count; }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    if (device >= 0) {
      set_current_device(device);
    }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override { return new_generator(device); }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, current_device()};
  }
  bool isPinnedPtr(const void* data) const override {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    return g_pinned.count(data) > 0;
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned_allocator; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

}  // namespace

void register_hooks() {
  static Hooks hooks;
  static bool done = false;
  if (!done) {
    at::RegisterPrivateUse1HooksInterface(&hooks);
    done = true;
  }
}

}  // namespace tpusim
