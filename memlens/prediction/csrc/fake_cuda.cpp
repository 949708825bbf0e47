// memlens fake-CUDA shim: lets a CPU-only build of PyTorch run whole training steps on fake `cuda`
// tensors (FakeTensorMode). Fake tensors carry a CUDA device but never touch memory; what a CPU build
// lacks is the glue that autograd and the dispatcher ask the device for:
//   * a DeviceGuardImpl for CUDA (autograd's engine switches device around every backward function,
//     and without one the process aborts: "PyTorch is not linked with support for cuda devices");
//   * CUDAHooks reporting one device, so that the engine starts its CUDA worker thread (as a real run
//     does: backward runs on its own thread, which matters for the per-thread cuBLAS workspace) and
//     `at::hasCUDA()` is true for code paths that check it.
// No CUDA call is made: streams and events are bookkeeping only. Kept separate from any other memlens
// extension so that each builds and loads on its own.
#include <torch/extension.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
#include <new>
#include <typeinfo>

namespace {

constexpr c10::DeviceIndex kDevices = 1;

// The hooks report a device only while a prediction runs (memlens switches this on and off), so that merely
// loading the shim never makes a CPU build of torch claim an accelerator (torch.accelerator, libraries that
// pick "cuda" when at::hasCUDA() says so). The device guard always reports one device: autograd's engine
// sizes its device threads once, at the first backward, which may come before any prediction.
std::atomic<bool> g_enabled{false};

struct FakeCUDAGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  FakeCUDAGuardImpl() = default;
  explicit FakeCUDAGuardImpl(c10::DeviceType) {}
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    current_device_ = d.index() < 0 ? 0 : d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, current_device_); }
  void setDevice(c10::Device d) const override { current_device_ = d.index() < 0 ? 0 : d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device_ = d.index() < 0 ? 0 : d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, d.index() < 0 ? 0 : d.index()), current_stream_);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA, d.index() < 0 ? 0 : d.index()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, d.index() < 0 ? 0 : d.index()), next_stream_id());
  }
  c10::Stream getNewStream(c10::Device d, int = 0) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, d.index() < 0 ? 0 : d.index()), next_stream_id());
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    current_stream_ = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (event != nullptr && *event == nullptr) *event = reinterpret_cast<void*>(uintptr_t{1});
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::StreamId next_stream_id() {
    static std::atomic<c10::StreamId> next{1};
    return next++;
  }
  thread_local static c10::DeviceIndex current_device_;
  thread_local static c10::StreamId current_stream_;
};
thread_local c10::DeviceIndex FakeCUDAGuardImpl::current_device_ = 0;
thread_local c10::StreamId FakeCUDAGuardImpl::current_stream_ = 0;

struct FakeCUDAHooks final : public at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_enabled.load(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return g_enabled.load(); }
  bool hasCUDA() const override { return g_enabled.load(); }
  c10::DeviceIndex deviceCount() const override { return g_enabled.load() ? kDevices : 0; }
  int getNumGPUs() const override { return g_enabled.load() ? kDevices : 0; }
  c10::DeviceIndex current_device() const override { return 0; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  void deviceSynchronize(c10::DeviceIndex) const override {}
};

FakeCUDAGuardImpl* guard_impl() {
  static FakeCUDAGuardImpl impl;   // leaked on purpose: torch keeps a raw pointer to it
  return &impl;
}

bool g_hooks_registered = false;
bool hooks_active();

// Put both pieces in torch's registries (no call that would make torch pick its hooks object).
void register_fakes() {
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  if (slot.load() == nullptr) {
    slot.store(guard_impl());
  }
  if (!g_hooks_registered) {
    at::CUDAHooksRegistry()->Register(
        "CUDAHooks",
        [](at::CUDAHooksArgs args) -> std::unique_ptr<at::CUDAHooksInterface> {
          return std::make_unique<FakeCUDAHooks>(args);
        });
    g_hooks_registered = true;
  }
}

// Loading the library registers them: when memlens loads it before `import torch` initialises torch, torch
// creates its CUDA hooks object (once, at first use, during its own import) from this registration.
struct RegisterAtLoad {
  RegisterAtLoad() { register_fakes(); }
} g_register_at_load;

// torch was imported before the shim loaded: `import torch` itself (torch._C's module initialisation) asks for
// the CUDA hooks, so on a CPU build torch already holds its own hooks object, a plain at::CUDAHooksInterface
// that it keeps for the life of the process. That object has no state of its own (only its virtual table), and
// FakeCUDAHooks adds none, so it is re-made in place as a FakeCUDAHooks: torch's pointer then reaches our
// functions, exactly as if the shim had been loaded first. Anything else in that slot (a real CUDA build,
// another library's hooks) is left alone and reported as not taken over.
bool adopt_hooks() {
  static_assert(sizeof(FakeCUDAHooks) == sizeof(at::CUDAHooksInterface), "FakeCUDAHooks must add no state");
  static_assert(alignof(FakeCUDAHooks) == alignof(at::CUDAHooksInterface), "same alignment as torch's hooks");
  const at::CUDAHooksInterface& hooks = at::detail::getCUDAHooks();
  if (dynamic_cast<const FakeCUDAHooks*>(&hooks) != nullptr) return true;
  if (typeid(hooks) != typeid(at::CUDAHooksInterface)) return false;
  new (const_cast<at::CUDAHooksInterface*>(&hooks)) FakeCUDAHooks(at::CUDAHooksArgs{});
  return true;
}

// Returns true when torch uses our hooks: registered before torch created its hooks object, or that CPU-only
// object taken over (adopt_hooks) when torch came first.
bool install() {
  register_fakes();
  if (!hooks_active()) adopt_hooks();
  return hooks_active();
}

bool hooks_active() {
  return dynamic_cast<const FakeCUDAHooks*>(&at::detail::getCUDAHooks()) != nullptr;
}

bool guard_active() {
  return c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)].load() == guard_impl();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "memlens fake-CUDA shim: a CUDA device guard and CUDA hooks reporting one device";
  m.def("install", &install, "register the fake CUDA guard and hooks; true when the hooks are in use");
  m.def("hooks_active", &hooks_active, "true when torch's CUDA hooks are memlens's fake ones");
  m.def("guard_active", &guard_active, "true when the CUDA device guard is memlens's fake one");
  m.def("set_enabled", [](bool on) { g_enabled.store(on); }, "report the fake device (during a prediction) or not");
  m.def("enabled", []() { return g_enabled.load(); }, "whether the hooks report the fake device now");
}
