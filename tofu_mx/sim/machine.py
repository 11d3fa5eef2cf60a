"""Modelled machines: devices with their memory and speed, and the links between them.

A :class:`Machine` is what the simulator needs of the hardware, and no more: per device its
memory, its peak float32 FLOP/s, its memory bandwidth and the fixed cost of launching one
operator; between devices the links a transfer crosses. Devices sit in groups (a PCIe switch,
an NVLink domain): two devices of one group talk over ``peer``, two of different groups over
``bridge`` (the host bridge, or the slower path between NVLink quads), and every device
reaches host memory over ``host``. A transfer crossing a link costs its latency plus its bytes
over its bandwidth (:func:`tofu_mx.sim.formulas.transfer_time`). A machine may also have a
``network`` link to other machines (its network interfaces, all its devices sharing it), which
only :func:`tofu_mx.sim.cluster.project_to_machines` uses; ``None`` where it has none.

The presets (:data:`PRESETS`, :func:`machine`) take the devices' figures from the vendors'
data sheets (peak float32 FLOP/s, memory bandwidth, memory); the links' achieved bandwidths
and the latencies are assumptions (about 80% of the nominal), not measured here. The
``cpu`` preset is this machine's two ``cpu(i)`` devices, fitted by ``bench/calibrate.py``,
and has no network. The GPU presets' networks are InfiniBand, sized as in the servers they
model (one 100 Gb/s EDR adapter in a PCIe server, four in a DGX-1, eight HDR in a DGX A100,
eight NDR in a DGX H100), at the same 80% of the nominal and 5 µs a ring step (an assumption:
NCCL's per-step latency over InfiniBand, not measured here). Each preset states where its
numbers come from.
"""
from __future__ import annotations

from dataclasses import dataclass

from tofu_mx import arguments
from tofu_mx.errors import InvalidArgumentError

GiB = 1 << 30
GB = 10 ** 9
#: the operators one conversion between layouts runs on a device, about: the cross-device
#: copy MXNet inserts, the cut or join (SliceChannel, concatenate, stack), and a copy on the
#: sender or a reshape (nnvm_passes.emit)
CONVERSION_OPERATORS = 3


@dataclass(frozen=True)
class Link:
    """One direction of a connection: ``bandwidth`` bytes per second, and ``latency`` seconds
    for each transfer."""

    bandwidth: float
    latency: float

    def __post_init__(self):
        object.__setattr__(self, "bandwidth", arguments.real(
            self.bandwidth, "Link.bandwidth", minimum=0, strict=True,
            example="bandwidth=12e9 (bytes per second)"))
        object.__setattr__(self, "latency", arguments.real(
            self.latency, "Link.latency", minimum=0, example="latency=10e-6 (seconds)"))


@dataclass(frozen=True)
class Machine:
    """A machine of ``num_devices`` alike devices (see the module's docstring)."""

    name: str
    num_devices: int
    memory: int                 # bytes per device
    flops: float                # peak float32 FLOP/s per device
    memory_bandwidth: float     # bytes per second per device
    launch: float               # seconds to launch one operator on a device
    group_size: int             # devices per group (PCIe switch, NVLink domain)
    peer: Link                  # between two devices of one group
    bridge: Link                # between devices of different groups
    host: Link                  # between a device and host memory
    source: str = ""            # where the figures come from
    shared_compute: bool = False   # the devices share one processor (MXNet's cpu(i) devices)
    #: (operator, fraction of ``flops`` it reaches), measured where one falls short of the rest
    efficiency: tuple[tuple[str, float], ...] = ()
    host_shared: int = 1        # devices sharing one ``host`` link (a PCIe switch's uplink)
    bridge_shared: bool = False  # transfers between two groups share one ``bridge`` per way
    #: (operator, input position): kernels that loop over the batch (the output's first
    #: axis) one sample at a time, reading that input (the weight) once per sample
    per_sample: tuple[tuple[str, int], ...] = ()
    #: to the other machines of a cluster, all devices sharing it (None: a machine alone)
    network: Link | None = None
    #: an operator's memory traffic overlaps its arithmetic (the roofline: the longer of the
    #: two); False where they add up, as measured of MXNet's CPU kernels (bench/calibrate.py)
    memory_overlap: bool = True
    #: (operator, fraction of ``memory_bandwidth`` it reaches), measured where one's kernel
    #: falls short of the rest (MXNet's CPU LayerNorm: its backward pass's reductions)
    bandwidth_efficiency: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "num_devices", arguments.count(self.num_devices, "Machine.num_devices"))
        set_(self, "memory", arguments.count(self.memory, "Machine.memory"))
        for field, example in (("flops", "flops=14e12"), ("memory_bandwidth",
                                                          "memory_bandwidth=900e9")):
            set_(self, field, arguments.real(getattr(self, field), f"Machine.{field}",
                                             minimum=0, strict=True, example=example))
        set_(self, "launch", arguments.real(self.launch, "Machine.launch", minimum=0,
                                            example="launch=5e-6 (seconds)"))
        set_(self, "group_size", arguments.count(self.group_size, "Machine.group_size"))
        if self.num_devices % self.group_size:
            raise InvalidArgumentError(
                f"Machine {self.name!r}: {self.num_devices} devices do not make groups of "
                f"{self.group_size}; give a group size that divides the device count (e.g. "
                f"group_size={self.num_devices} for one NVLink domain)")
        set_(self, "host_shared", arguments.count(self.host_shared, "Machine.host_shared"))
        if self.num_devices % self.host_shared:
            raise InvalidArgumentError(
                f"Machine {self.name!r}: {self.num_devices} devices do not share host links "
                f"{self.host_shared} each; give a number that divides the device count")
        set_(self, "bridge_shared", arguments.flag(self.bridge_shared, "Machine.bridge_shared"))
        set_(self, "shared_compute", arguments.flag(self.shared_compute,
                                                    "Machine.shared_compute"))
        set_(self, "memory_overlap", arguments.flag(self.memory_overlap,
                                                    "Machine.memory_overlap"))
        set_(self, "efficiency", tuple(
            (op, arguments.real(e, f"Machine.efficiency[{op!r}]", minimum=0, strict=True,
                                maximum=1, example="efficiency=(('Convolution', 0.2),)"))
            for op, e in dict(self.efficiency).items()))
        set_(self, "bandwidth_efficiency", tuple(
            (op, arguments.real(e, f"Machine.bandwidth_efficiency[{op!r}]", minimum=0,
                                strict=True, maximum=1,
                                example="bandwidth_efficiency=(('LayerNorm', 0.1),)"))
            for op, e in dict(self.bandwidth_efficiency).items()))
        set_(self, "per_sample", tuple(
            (op, arguments.count(pos, f"Machine.per_sample[{op!r}]", minimum=0))
            for op, pos in dict(self.per_sample).items()))
        for field in ("peer", "bridge", "host"):
            if not isinstance(getattr(self, field), Link):
                raise InvalidArgumentError(
                    f"Machine.{field} must be a tofu_mx.sim.Link, got "
                    f"{arguments.show(getattr(self, field))}; e.g. Link(12e9, 10e-6)")
        if self.network is not None and not isinstance(self.network, Link):
            raise InvalidArgumentError(
                f"Machine.network must be a tofu_mx.sim.Link or None, got "
                f"{arguments.show(self.network)}; e.g. network=Link(10e9, 5e-6) for one "
                f"100 Gb/s InfiniBand EDR adapter")

    @property
    def conversion_bytes(self) -> float:
        """The bytes a conversion's fixed cost is worth on this machine: one transfer's
        latency over ``peer`` and :data:`CONVERSION_OPERATORS` launches, at ``peer``'s
        bandwidth (:attr:`tofu_mx.SearchOptions.conversion_bytes`; ``partition(machine=)``
        weighs the plan searched with it)."""
        return (self.peer.latency + CONVERSION_OPERATORS * self.launch) * self.peer.bandwidth

    def rate(self, op: str | None = None) -> float:
        """FLOP/s operator ``op`` reaches on one device (``flops`` times its efficiency)."""
        return self.flops * dict(self.efficiency).get(op, 1.0)

    def bandwidth(self, op: str | None = None) -> float:
        """Bytes per second of device memory operator ``op`` moves (``memory_bandwidth``
        times its ``bandwidth_efficiency``)."""
        return self.memory_bandwidth * dict(self.bandwidth_efficiency).get(op, 1.0)

    def link(self, a: int, b: int) -> Link:
        """The link a transfer from device ``a`` to device ``b`` crosses (the slowest on its
        way): ``peer`` within a group, ``bridge`` between groups."""
        for d in (a, b):
            arguments.count(d, "device", minimum=0, maximum=self.num_devices - 1)
        if a == b:
            raise InvalidArgumentError(f"a transfer from device {a} to itself crosses no link")
        return self.peer if a // self.group_size == b // self.group_size else self.bridge


def _pcie3() -> Link:
    return Link(12 * GB, 10e-6)


#: The preset machines, by name (see :func:`machine`).
PRESETS: dict[str, Machine] = {m.name: m for m in (
    Machine("8xV100-16GB-PCIe", 8, 16 * GiB, 14.0e12, 900 * GB, 5e-6, 4,
            peer=Link(10 * GB, 10e-6), bridge=Link(8 * GB, 15e-6), host=_pcie3(), host_shared=4,
            bridge_shared=True, network=Link(10 * GB, 5e-6),
            source="Tesla V100 PCIe data sheet (14 TFLOP/s float32, 900 GB/s, 16 GB); two "
                   "PCIe 3.0 x16 switches of 4 GPUs, each switch one x16 link to the host, "
                   "which the transfers between the switches share; "
                   "links assumed, not measured here: 10 GB/s peer-to-peer within a switch, "
                   "8 GB/s across the host bridge, 12 GB/s to host (of 15.75 GB/s nominal); "
                   "one 100 Gb/s InfiniBand EDR adapter to other machines, 10 GB/s of 12.5 "
                   "nominal, 5 us a ring step"),
    Machine("8xV100-32GB-NVLink", 8, 32 * GiB, 15.7e12, 900 * GB, 5e-6, 4,
            peer=Link(45 * GB, 5e-6), bridge=Link(22 * GB, 5e-6), host=_pcie3(), host_shared=2,
            network=Link(40 * GB, 5e-6),
            source="Tesla V100 SXM2 data sheet (15.7 TFLOP/s float32, 900 GB/s, 32 GB); DGX-1's "
                   "hybrid cube-mesh simplified, links assumed: two NVLinks (45 GB/s of 50 "
                   "nominal) within a quad, one (22 GB/s) between quads; two GPUs per PCIe "
                   "switch to the host; DGX-1's four 100 Gb/s InfiniBand EDR adapters to "
                   "other machines, 40 GB/s of 50 nominal, 5 us a ring step"),
    Machine("8xA100-40GB-NVLink", 8, 40 * GiB, 19.5e12, 1555 * GB, 5e-6, 8,
            peer=Link(240 * GB, 5e-6), bridge=Link(240 * GB, 5e-6), host=Link(24 * GB, 10e-6),
            host_shared=2, network=Link(160 * GB, 5e-6),
            source="A100 SXM4 40GB data sheet (19.5 TFLOP/s float32, 1,555 GB/s); NVSwitch, "
                   "300 GB/s nominal per direction, 240 GB/s assumed achieved; PCIe 4.0 host, "
                   "two GPUs per switch; DGX A100's eight 200 Gb/s InfiniBand HDR adapters to "
                   "other machines, 160 GB/s of 200 nominal, 5 us a ring step"),
    Machine("8xH100-80GB-NVLink", 8, 80 * GiB, 67e12, 3350 * GB, 4e-6, 8,
            peer=Link(360 * GB, 4e-6), bridge=Link(360 * GB, 4e-6), host=Link(50 * GB, 10e-6),
            network=Link(320 * GB, 5e-6),
            source="H100 SXM5 data sheet (67 TFLOP/s float32, 3.35 TB/s, 80 GB); NVSwitch, "
                   "450 GB/s nominal per direction, 360 GB/s assumed achieved; PCIe 5.0 host; "
                   "DGX H100's eight 400 Gb/s InfiniBand NDR adapters to other machines, "
                   "320 GB/s of 400 nominal, 5 us a ring step"),
    Machine("cpu", 2, 24 * GiB, 116.3e9, 17.8 * GB, 0.27e-6, 2,
            peer=Link(25.3 * GB, 15.4e-6), bridge=Link(25.3 * GB, 15.4e-6),
            host=Link(25.3 * GB, 15.4e-6), shared_compute=True,
            efficiency=(("Convolution", 0.70),), per_sample=(("Convolution", 1),),
            memory_overlap=False, bandwidth_efficiency=(("LayerNorm", 0.06),),
            source="this 2-core machine's cpu(0) and cpu(1), fitted by bench/calibrate.py on "
                   "2026-11-27 (bench/results/calibration.md): launch, bandwidth and link from "
                   "chains of operators as MXNet's executor runs them (in bulk, copying into "
                   "planned buffers); the devices share the cores; MXNet's CPU kernels do not "
                   "overlap memory traffic with arithmetic; its convolution (without oneDNN) "
                   "runs one matrix product per sample (src/operator/nn/convolution-inl.h), "
                   "reading its weight each time; its LayerNorm reaches 6% of the bandwidth"),
)}


def machine(name: str) -> Machine:
    """The preset called ``name`` (:data:`PRESETS`)."""
    if not isinstance(name, str) or name not in PRESETS:
        raise InvalidArgumentError(
            f"no machine preset called {arguments.show(name)}; the presets are "
            f"{', '.join(sorted(PRESETS))}, or build your own with tofu_mx.sim.Machine(...)")
    return PRESETS[name]


__all__ = ["GB", "GiB", "Link", "Machine", "PRESETS", "machine"]
