// DDP's reducer times each iteration with a Timer registered per device type; without one for
// PrivateUse1 every DDP rank prints "Time stats are currently only collected for CPU and CUDA devices".
// The tpu device runs its kernels on the host (or records them for the simulator), so host timestamps
// are the device's own: the same rule as torch's CpuTimer.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace c10d {
namespace {

class TpuTimer : public Timer {
 public:
  explicit TpuTimer(c10::Device /* device */) {}

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t start_time = getTimeRef(start);
    int64_t end_time = getTimeRef(end);
    if (start_time == kUnsetTime || end_time == kUnsetTime || end_time < start_time) {
      return std::nullopt;
    }
    return end_time - start_time;
  }
};

C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, TpuTimer);

}  // namespace
}  // namespace c10d
