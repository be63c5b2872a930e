"""The tpu device's settings: one typed ``DeviceConfig``, handed over by a caller or read from the environment.

A caller that knows what it wants (``tpusim run``) builds a ``DeviceConfig`` and hands it to
``tpusim.backend.configure(config)`` while no tensor lives on the device (the chip is the
``ChipSpec`` itself, so a chip loaded from any TOML file works). A plain ``python script.py`` or
torchrun user sets environment variables instead, read once, at import, by ``load_config``:

TPUSIM_CHIP        chip generation simulated (a topologies/chips/*.toml name, or a TOML file's
                   path), default: the chip file marked ``default = true`` (v5p): gives the HBM
                   capacity per device and the devices of a host (chips per host x devices per chip)
TPUSIM_DEVICES     number of tpu devices in this process, 1..64 (default: this host's devices of the slice,
                   TORCH_TPU_TOPOLOGY or tpusim run's --topology: its chips up to the chip's chips per host, x
                   devices per chip; without a slice, the chip's devices per host)
TPUSIM_HBM_BYTES   HBM capacity per device in bytes (default: the chip's per device; 0 = unlimited)
TPUSIM_NUMERICS    "on" (default), "off" (also 1/0, true/false, yes/no: tpusim/envvars.py's ``yes_no``) or
                   "tpu": off is shape-only mode, no host memory, values unreadable; tpu computes f32
                   matmuls, convolutions and attention as a TPU does (tpusim/backend/dispatch/tpu_numerics.py)
TPUSIM_F64         "warn" (default): float64/complex ops run on the host with a warning once
                   per op; "error": they raise; "allow": silent
TPUSIM_TARGET      "sim" (default): ops computed by CPU kernels on host memory; "pjrt": through
                   JAX (tpusim/backend/targets/)
TPUSIM_XLA_OPS     yes/no (default no): the recording keeps each distinct eager op's one-op program for the
                   TPU compiler (``DeviceConfig.op_programs``; ``tpusim run`` sets the field from --compiler)
TPUSIM_DEVICE_CONFIG  a whole DeviceConfig as JSON (``DeviceConfig.env()``): how a process hands
                   its config to the worker processes it starts (``--ranks all`` ranks); when
                   set, the variables above and below are not read

TorchTPU's variables, read with TorchTPU's precedence (its csrc/common/environment.cc and
env_vars.h), after tpusim's own: a TPUSIM_* variable wins where both say the same thing.

TPU_VISIBLE_DEVICES  the devices this process sees, "0" or "0,1,2,3" (device ids of the host,
                   below its devices per host): their count is the device count unless
                   TPUSIM_DEVICES is set. TorchTPU's source of truth for visibility
TPU_VISIBLE_CHIPS  the same in chips (on v7 a chip is two devices), read only when
                   TPU_VISIBLE_DEVICES is unset (TorchTPU overwrites it to match TPU_VISIBLE_DEVICES)
TORCH_TPU_TOPOLOGY the slice's shape in chips, "2,2,1" or "2x2x1"; on a chip with two devices per
                   chip (v7) a fourth number gives them, "2,2,1,2"; read by topology_aware_mesh
                   and get_local_device_attributes (``DeviceConfig.topology``)
TORCH_TPU_DEVICES_PER_HOST  devices per host (default: the chip's chips per host x devices per
                   chip): the process index of a rank in get_local_device_attributes
ACCELERATOR_TYPE   Cloud TPU's accelerator type, "v6e-8", "v5litepod-4", "v5p-16", "tpu7x-8" (TorchTPU's
                   notebooks set it): the chip when TPUSIM_CHIP is unset, and the devices of this host
                   when TORCH_TPU_DEVICES_PER_HOST is unset: the slice's chips (the number counts
                   TensorCores: chips x the chip's TensorCores per chip), at most a host's, x devices per chip

Chips with two devices per chip (``ChipSpec.devices_per_chip``, v7) show each device with half of
the chip's HBM and twice the chip's chips per host as the default device count, as TorchTPU does.

A bad value raises one ``TpusimError`` naming the variable, its value and what is accepted.

Read elsewhere, next to what they drive: TPUSIM_EAGER_MODE (tpusim/eager/state.py: debug, strict or
fused; ``DeviceConfig.eager_mode`` overrides it), TPUSIM_DEBUG_CHECK and TPUSIM_DEBUG_LOG
(tpusim/backend/dispatch/debug_mode.py: debug mode's NaN/Inf check and per-op log), TPUSIM_RANKS,
TPUSIM_HANG_TIMEOUT_S and TPUSIM_HANG_GRACE_S (tpusim/backend/distributed/), TPUSIM_DUMP_STABLEHLO
(tpusim/backend/torch_compile/jax_backend.py). tpusim/envvars.py lists every variable with what it accepts;
``tpusim run`` checks them all before it loads the device.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from tpusim import envvars
from tpusim.eager import state as eager
from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec, default_chip, load_chip
from tpusim.units import ascii_whole

F64_POLICIES = ("warn", "error", "allow")
TARGETS = ("sim", "pjrt")                  # tpusim/backend/targets/: what computes op values
MAX_DEVICES = 64                           # the shim's limit (tpusim/backend/csrc: kMaxDevices)
MAX_HBM_BYTES = 2**62                      # the shim counts bytes in int64: larger capacities overflow it
CONFIG_ENV = "TPUSIM_DEVICE_CONFIG"


@dataclass(frozen=True)
class DeviceConfig:
    """What the tpu device simulates and how it computes. ``None`` fields take the chip's values."""

    chip: ChipSpec                         # the chip simulated (tpusim.hardware.spec), not its name
    numerics: bool = True                  # False: shape-only mode (no host memory; values unreadable)
    tpu_numerics: bool = False             # True: f32 contractions at a TPU's precision (dispatch/tpu_numerics.py)
    f64: str = "warn"                      # float64/complex policy (aten/float64_policy.py): F64_POLICIES
    device_count: int | None = None        # devices tpu:0..N-1 in this process; None: the visible devices,
                                           # else this host's devices of the slice (``host_devices``)
    hbm_bytes: int | None = None           # HBM capacity per device; None: the chip's per device; 0: unlimited
    target: str = "sim"                    # what computes op values: TARGETS
    eager_mode: str | None = None          # the eager mode to start in; None: as tpusim/eager/state.py has it
    topology: tuple[int, ...] | None = None    # the slice in chips (x, y, z), TORCH_TPU_TOPOLOGY; None: unsaid
    visible_devices: tuple[int, ...] | None = None   # host device ids this process sees (TPU_VISIBLE_DEVICES)
    devices_per_host: int | None = None    # None: the chip's chips per host x devices per chip
    op_programs: bool = False              # keep each distinct eager op's one-op program for the TPU compiler
    #                                        (backend/program_trace/op_programs.py; tpusim run sets it from --compiler)

    def __post_init__(self) -> None:
        if not isinstance(self.chip, ChipSpec):
            raise TpusimError(f"DeviceConfig.chip={self.chip!r}; accepted: a tpusim.hardware.spec.ChipSpec "
                              f"(tpusim.hardware.spec.load_chip(name or path))")
        per_chip = self.chip.devices_per_chip
        for name in ("topology", "visible_devices"):       # JSON gives lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.devices_per_host is None:
            object.__setattr__(self, "devices_per_host", self.chip.chips_per_host * per_chip)
        if self.device_count is None:
            count = len(self.visible_devices) if self.visible_devices else self.host_devices()
            object.__setattr__(self, "device_count", min(count, MAX_DEVICES))
        if self.hbm_bytes is None:
            object.__setattr__(self, "hbm_bytes", self.chip.hbm_bytes // per_chip)
        checks = (("numerics", isinstance(self.numerics, bool), "True or False"),
                  ("tpu_numerics", isinstance(self.tpu_numerics, bool) and (
                      not self.tpu_numerics or (self.numerics and self.target == "sim")),
                   "True or False; True needs numerics=True (shape-only mode computes no values) and the sim "
                   "target (the pjrt target computes through JAX: a TPU's own numbers on a TPU)"),
                  ("f64", self.f64 in F64_POLICIES, ", ".join(F64_POLICIES)),
                  ("op_programs", isinstance(self.op_programs, bool), "True or False"),
                  ("device_count", _whole(self.device_count) and 1 <= self.device_count <= MAX_DEVICES,
                   f"1..{MAX_DEVICES}"),
                  ("hbm_bytes", _whole(self.hbm_bytes) and self.hbm_bytes >= 0, "bytes >= 0 (0: unlimited)"),
                  ("target", self.target in TARGETS, ", ".join(TARGETS)),
                  ("devices_per_host", _whole(self.devices_per_host) and self.devices_per_host >= 1,
                   "a whole number >= 1"),
                  ("topology", self.topology is None or (isinstance(self.topology, tuple) and
                                                         1 <= len(self.topology) <= 3 and
                                                         all(_whole(n) and n >= 1 for n in self.topology)),
                   "None or 1 to 3 whole numbers >= 1, chips along x, y, z"),
                  ("visible_devices", self.visible_devices is None or (
                      isinstance(self.visible_devices, tuple) and len(self.visible_devices) >= 1 and
                      len(set(self.visible_devices)) == len(self.visible_devices) and
                      all(_whole(d) and 0 <= d < self.devices_per_host for d in self.visible_devices)),
                   f"None or distinct device ids 0..{self.devices_per_host - 1}"))
        for name, ok, accepted in checks:
            if not ok:
                raise TpusimError(f"DeviceConfig.{name}={getattr(self, name)!r}; accepted: {accepted}")
        if self.visible_devices and len(self.visible_devices) != self.device_count:
            raise TpusimError(f"DeviceConfig.device_count={self.device_count} but visible_devices="
                              f"{self.visible_devices!r} names {len(self.visible_devices)} devices; give one or the "
                              f"other (TPUSIM_DEVICES wins over TPU_VISIBLE_DEVICES in the environment)")

    def host_devices(self) -> int:
        """The devices a process sees with no TPU_VISIBLE_DEVICES: its host's, as JAX's ``local_devices()`` and
        TorchTPU show them. A host of the slice holds the slice's chips up to the chip's chips per host (a
        one-chip slice: one chip), each with its devices per chip; without a slice, a whole host."""
        per_host = self.devices_per_host
        slice_given = isinstance(self.topology, tuple) and all(_whole(n) and n >= 1 for n in self.topology)
        if not slice_given or not _whole(per_host):
            return per_host                      # no slice given (a bad value is refused by __post_init__'s checks)
        return min(per_host, math.prod(self.topology) * self.chip.devices_per_chip)

    def to_json(self) -> str:
        """This config as JSON (the chip with every field), for ``from_json`` in another process."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeviceConfig:
        data = json.loads(text)
        chip = {k: tuple(v) if isinstance(v, list) else v for k, v in data.pop("chip").items()}
        return cls(chip=ChipSpec(**chip), **data)

    def env(self) -> dict[str, str]:
        """The environment that gives a worker process this config (read by its ``load_config``)."""
        return {CONFIG_ENV: self.to_json()}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raw(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def _choice(name: str, default: str, accepted: tuple[str, ...], shown: str = "") -> str:
    raw = _raw(name)
    value = raw.lower() if raw else default
    if value not in accepted:
        raise TpusimError(f"{name}={raw!r}; accepted: {shown or ', '.join(accepted)}")
    return value


def _count(name: str, low: int, high: int | None, accepted: str) -> int | None:
    """A whole number from ``name`` (float notation allowed: 16e9; integers read exactly), None when unset."""
    raw = _raw(name)
    if raw is None:
        return None
    try:
        return envvars.whole(low, high)(raw)
    except (ValueError, OverflowError):
        raise TpusimError(f"{name}={raw!r}; accepted: {accepted}") from None


ACCELERATOR_TYPE_ENV = "ACCELERATOR_TYPE"


def _accelerator_type() -> tuple[ChipSpec, int] | None:
    """ACCELERATOR_TYPE "v6e-8" -> (the chip, the slice's chips); None when unset or not a chip tpusim has."""
    raw = _raw(ACCELERATOR_TYPE_ENV)
    if raw is None:
        return None
    name, _, cores = raw.rpartition("-")
    try:
        if not name.isascii() or not name.isalnum() or not ascii_whole(cores) or int(cores) < 1:
            # a type names a chip, never a file: "/etc/passwd-8" was read as a chip TOML (issue 44, NA3)
            raise TpusimError('accepted: a Cloud TPU accelerator type such as "v6e-8", "v5litepod-4" or "tpu7x-8"')
        chip = load_chip(name)
    except TpusimError as err:       # TorchTPU's variable, set for hardware: one tpusim lacks is not an error here
        warnings.warn(f"tpusim: {ACCELERATOR_TYPE_ENV}={raw!r} ignored ({err}); TPUSIM_CHIP names the chip",
                      RuntimeWarning, stacklevel=2)
        return None
    return chip, max(int(cores) // chip.tensorcores_per_chip, 1)


def _chip(name: str, accelerator: Callable[[], tuple[ChipSpec, int] | None]) -> ChipSpec:
    raw = _raw(name)
    if raw is None:
        found = accelerator()
        return default_chip() if found is None else found[0]
    try:
        return load_chip(raw)
    except TpusimError as err:
        raise TpusimError(f"{name}={raw!r}: {err}") from None


TOPOLOGY_ENV = "TORCH_TPU_TOPOLOGY"
DEVICES_PER_HOST_ENV = "TORCH_TPU_DEVICES_PER_HOST"
VISIBLE_DEVICES_ENV, VISIBLE_CHIPS_ENV = "TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS"


def _accelerator_host(chip: ChipSpec, accelerator: Callable[[], tuple[ChipSpec, int] | None]) -> int | None:
    """The devices of this host ACCELERATOR_TYPE gives for ``chip``: its slice's chips, at most a host's."""
    found = accelerator()
    if found is None:
        return None
    return min(found[1], chip.chips_per_host) * chip.devices_per_chip


def _topology(name: str, chip: ChipSpec) -> tuple[int, ...] | None:
    """TORCH_TPU_TOPOLOGY: "2,2,1" or "2x2x1" chips along x, y, z; a fourth number is the devices per chip
    (TorchTPU writes "2,2,1,2" on v7) and must be the chip's."""
    raw = _raw(name)
    if raw is None:
        return None
    parts = [p.strip() for p in raw.lower().replace("x", ",").split(",")]
    accepted = ('chips along x, y, z as "2,2,1" or "2x2x1"' +
                (f', optionally with the {chip.devices_per_chip} devices per chip of {chip.name} as a fourth '
                 f'number ("2,2,1,{chip.devices_per_chip}")' if chip.devices_per_chip > 1 else ""))
    if not all(ascii_whole(p) and int(p) >= 1 for p in parts) or not 1 <= len(parts) <= 4:
        raise TpusimError(f"{name}={raw!r}; accepted: {accepted}")
    dims = tuple(int(p) for p in parts)
    if len(dims) == 4:
        if dims[3] != chip.devices_per_chip or chip.devices_per_chip == 1:
            raise TpusimError(f"{name}={raw!r}: a fourth number gives the devices per chip, and {chip.name} has "
                              f"{chip.devices_per_chip}; accepted: {accepted}")
        dims = dims[:3]
    while len(dims) > chip.torus_dims and dims[-1] == 1:     # "2,2,1" on a 2-D torus chip (v5e, v6e)
        dims = dims[:-1]
    if len(dims) > chip.torus_dims:
        raise TpusimError(f"{name}={raw!r}: {chip.name} is a {chip.torus_dims}-D torus; accepted: {accepted}")
    return dims


def _ids(name: str, raw: str, limit: int, unit: str) -> tuple[int, ...]:
    parts = [p.strip() for p in raw.split(",")]
    if not all(ascii_whole(p) for p in parts) or len(set(parts)) != len(parts) or \
            not all(int(p) < limit for p in parts):
        raise TpusimError(f"{name}={raw!r}; accepted: distinct {unit} ids 0..{limit - 1} separated by commas, "
                          f"e.g. \"0\" or \"0,1\"")
    return tuple(int(p) for p in parts)


def _visible(chip: ChipSpec, per_host: int) -> tuple[int, ...] | None:
    """TPU_VISIBLE_DEVICES, else TPU_VISIBLE_CHIPS (each chip = its devices), as device ids; None when unset."""
    raw = _raw(VISIBLE_DEVICES_ENV)
    if raw is not None:
        return _ids(VISIBLE_DEVICES_ENV, raw, per_host, "device")
    raw = _raw(VISIBLE_CHIPS_ENV)
    if raw is None:
        return None
    per_chip = chip.devices_per_chip
    chips = _ids(VISIBLE_CHIPS_ENV, raw, max(per_host // per_chip, 1), "chip")
    return tuple(c * per_chip + d for c in chips for d in range(per_chip))


def load_config(**given: object) -> DeviceConfig:
    """The config the TPUSIM_* variables describe (see the module docstring); the chip's numbers come
    from its ChipSpec (tpusim.hardware.spec). ``given`` fields (``DeviceConfig`` names) are taken as they are and
    their variables are not read: ``load_config(chip=spec, numerics=False)`` keeps, say, TPUSIM_F64."""
    serialised = _raw(CONFIG_ENV)
    if serialised is not None:
        try:
            return dataclasses.replace(DeviceConfig.from_json(serialised), **given)
        except (ValueError, TypeError, KeyError, AttributeError, TpusimError) as err:
            raise TpusimError(f"{CONFIG_ENV}={serialised[:80]!r}...: not a DeviceConfig ({err}); tpusim sets "
                              f"it for the processes it starts, unset it to use the other TPUSIM_* variables") from None
    accelerator = functools.cache(_accelerator_type)      # read (and warned about) once, only when needed
    readers = {
        "chip": lambda: _chip("TPUSIM_CHIP", accelerator),
        "numerics": lambda: envvars.read("TPUSIM_NUMERICS"),      # the check's own parser (envvars.numerics_word)
        "f64": lambda: _choice("TPUSIM_F64", "warn", F64_POLICIES),
        "device_count": lambda: _count("TPUSIM_DEVICES", 1, MAX_DEVICES, f"a whole number 1..{MAX_DEVICES}"),
        "hbm_bytes": lambda: _count("TPUSIM_HBM_BYTES", 0, MAX_HBM_BYTES,
                                    "a whole number of bytes >= 0, e.g. 16e9 (0: unlimited)"),
        "target": lambda: _choice("TPUSIM_TARGET", "sim", TARGETS),
        "op_programs": lambda: bool(envvars.read("TPUSIM_XLA_OPS")),
    }
    fields = {name: given[name] if name in given else read() for name, read in readers.items()}
    word = fields["numerics"]                     # "on", "off" or "tpu" from the variable; a given bool as it is
    if isinstance(word, str):
        fields["numerics"] = word != "off"
    fields["tpu_numerics"] = given.get("tpu_numerics", word == "tpu")
    chip = fields["chip"]
    torch_tpu = {
        "devices_per_host": lambda: _count(DEVICES_PER_HOST_ENV, 1, None, "a whole number >= 1")
        or _accelerator_host(chip, accelerator),
        "topology": lambda: _topology(TOPOLOGY_ENV, chip),
    }
    fields.update({name: given[name] if name in given else read() for name, read in torch_tpu.items()})
    if "visible_devices" not in given and "device_count" not in given and fields["device_count"] is None:
        per_host = fields["devices_per_host"] or chip.chips_per_host * chip.devices_per_chip
        fields["visible_devices"] = _visible(chip, per_host)
    if fields["target"] == "pjrt" and _raw("TPUSIM_PJRT_MODE") and not _raw(eager.ENV):
        warnings.warn("tpusim pjrt: TPUSIM_PJRT_MODE is gone and ignored; the target follows the eager mode "
                      f"({eager.ENV}=debug|strict|fused)", RuntimeWarning, stacklevel=2)
    return DeviceConfig(**{**given, **fields})
