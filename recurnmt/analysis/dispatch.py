"""What a region of PyTorch code asks of its device, counted on the CPU.

Eager decoding on a GPU is fast when the host queues kernels ahead of the device and never
waits for it. Three things undo that, and a ``TorchDispatchMode`` (which sees the aten
operations a backend would run, below autograd) shows all three without a GPU:

* **operations**: each is a kernel launch, or at least the dispatcher's time on the host;
* **host reads**: operations whose result on the host depends on a tensor's values. ``.item()``,
  ``bool(t)``, ``int(t)`` and ``if t.any():`` all go through ``aten._local_scalar_dense``;
  ``torch.equal`` returns a Python bool; ``nonzero``, ``masked_select``, ``unique``, boolean
  indexing and ``repeat_interleave`` without ``output_size`` make an output whose shape depends
  on the values; ``.cpu()`` and ``.tolist()`` of a device tensor copy it to the CPU. On a device
  each one waits for every queued kernel (a host synchronisation). They are found by the
  operators' own tags (``data_dependent_output``, ``dynamic_output_shape``, the tags
  ``torch.compile`` goes by), plus ``aten.equal`` and copies to the CPU;
* **host-to-device copies**: a tensor made on the CPU (``torch.tensor(...)``, a factory call
  without ``device=``) and then moved to the device (``.to(x)``, ``copy_``, a CPU index tensor,
  a CPU operand of a device operation).

The last two depend on where tensors live, which a run with the model on the CPU cannot show:
there ``torch.zeros(n).to(x)`` dispatches no copy at all, and ``.tolist()`` reads CPU memory
without dispatching anything. :class:`SimulatedDevice` therefore runs a region on the CPU with
the model's tensors reporting another device (``cuda`` by default, without a GPU): each is a
wrapper subclass around a real CPU tensor, every operation runs on the CPU data for real (so a
branch that reads a value takes the path it takes on a GPU), and its outputs report the device
again when an input or its ``device=`` argument did. A tensor made without naming the device
stays a plain CPU tensor, exactly where it would be on a GPU, and its move to the device shows
as a copy from the CPU.

Two alternatives were set aside. Fake tensors (``FakeTensorMode``) live on ``cuda`` without a
GPU but hold no values, so the first host read raises (fairseq's transformer makes one per
decoding step) and the region cannot be followed to its end. Recording CPU factory operations
followed by a copy to another device needs the copy, which a run on the CPU never makes.

Usage::

    sim = SimulatedDevice("cuda")
    with sim:
        model = sim.module(model)  # parameters and buffers now report cuda
        x = sim.tensor(x)
        with count_dispatch() as log:  # entered inside the simulation
            model(x)
    log.total, log.syncs, log.to_device

Limits: a simulated region runs inference only (the wrappers do not require gradients).
Operations are counted as dispatched, so count them on the plain CPU run where the device
changes a kernel's choice: under a simulated ``cuda`` scaled dot-product attention takes its
math path (several operations) instead of one fused kernel.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
CPU = torch.device("cpu")
_READ_TAGS = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}
_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


@dataclass(frozen=True)
class OpEvent:
    """One operation of interest.

    Attributes:
        op: the aten operation, e.g. ``aten._local_scalar_dense``.
        device: the device read from (host reads) or copied to (host-to-device copies).
        where: ``dir/file.py:line: source`` of the code that called it, outside torch.
    """

    op: str
    device: str
    where: str


@dataclass
class DispatchLog:
    """What a region dispatched (see :func:`count_dispatch`).

    Attributes:
        ops: the count of every aten operation, by name (``aten.addmm``).
        reads: host reads, on any device (a CPU tensor's read waits for nothing).
        to_device: copies of CPU tensors to another device.
    """

    ops: Counter[str] = field(default_factory=Counter)
    reads: list[OpEvent] = field(default_factory=list)
    to_device: list[OpEvent] = field(default_factory=list)

    @property
    def total(self) -> int:
        """All operations dispatched."""
        return sum(self.ops.values())

    @property
    def syncs(self) -> list[OpEvent]:
        """The host reads of tensors off the CPU: each waits for the device's queue."""
        return [e for e in self.reads if e.device != "cpu"]


@contextlib.contextmanager
def count_dispatch() -> Iterator[DispatchLog]:
    """Records the aten operations dispatched inside the ``with`` block.

    It reads the same events with a model on a real device. Inside a
    :class:`SimulatedDevice`, enter it after the simulation (the simulation runs the operations
    it receives on the CPU and hides them from modes entered before it).

    Yields:
        The log, filled as the block runs.
    """
    log = DispatchLog()
    with _Recorder(log):
        yield log


@contextlib.contextmanager
def count_python_calls() -> Iterator[Counter[str]]:
    """Counts the calls the interpreter makes inside the ``with`` block (this thread):
    ``call``, of Python functions (a generator's resumptions included), and ``c_call``, of
    built-in functions from Python (torch's operators and tensor methods among them).

    A region's host time is these calls plus the dispatcher's work on its operations
    (:func:`count_dispatch`); host work that launches nothing, such as a walk over a model's
    submodules, shows here only. Enter it without :func:`count_dispatch`, whose recorder is
    Python code called at every operation.

    Yields:
        The counts by event, filled as the block runs.
    """
    counts: Counter[str] = Counter()

    def profile(frame, event: str, arg) -> None:
        if event in ("call", "c_call"):
            counts[event] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(previous)


class _Recorder(TorchDispatchMode):
    def __init__(self, log: DispatchLog) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        self.log.ops[name] += 1
        read = _read_device(func, args, kwargs)
        if read is not None:
            self.log.reads.append(OpEvent(name, read.type, _caller()))
        for target in _moved_to(func, args, kwargs):
            self.log.to_device.append(OpEvent(name, target.type, _caller()))
        return func(*args, **kwargs)


def _tensors(args: Any, kwargs: dict) -> list[Tensor]:
    return [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Tensor)]


def _read_device(func, args: tuple, kwargs: dict) -> torch.device | None:
    """The device ``func`` reads values from to the host, None for no host read."""
    if func is aten._to_copy.default:
        target = kwargs.get("device")
        src = args[0].device
        return src if target is not None and target.type == "cpu" != src.type else None
    if func is aten.copy_.default:
        dst, src = args[0].device, args[1].device
        return src if dst.type == "cpu" != src.type else None
    if func in _INDEXING:
        indices = args[1]
        if not any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return None  # integer indices: the output shape is the indices'
    elif func is aten.repeat_interleave.Tensor:
        if kwargs.get("output_size") is not None:
            return None
    elif func is not aten.equal.default and not _READ_TAGS.intersection(func.tags):
        return None
    tensors = _tensors(args, kwargs)
    return tensors[0].device if tensors else None


def _moved_to(func, args: tuple, kwargs: dict) -> list[torch.device]:
    """The devices that CPU tensors are copied to by ``func`` (one entry per tensor)."""
    if func is aten._to_copy.default:
        target = kwargs.get("device")
        moved = target is not None and target.type != "cpu" and args[0].device.type == "cpu"
        return [target] if moved else []
    if func is aten.copy_.default:
        dst, src = args[0].device, args[1].device
        return [dst] if src.type == "cpu" != dst.type else []
    tensors = _tensors(args, kwargs)
    device = next((t.device for t in tensors if t.device.type != "cpu"), None)
    if device is None:
        return []
    # a 0-dim CPU operand is passed to a device kernel as a scalar (no copy); CPU index
    # tensors and larger operands are copied (or refused by the device's kernel)
    indices = set(map(id, args[1])) if func in _INDEXING else set()
    return [device for t in tensors if t.device.type == "cpu" and (t.dim() > 0 or id(t) in indices)]


def _caller() -> str:
    """``dir/file.py:line: source`` of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        path = str(Path(frame.filename).resolve())
        if path.startswith(_TORCH_DIR) or path == str(Path(__file__).resolve()):
            continue
        short = "/".join(Path(path).parts[-2:])
        return f"{short}:{frame.lineno}: {(frame.line or '').strip()}"
    return "?"


class _SimulatedTensor(Tensor):
    """A CPU tensor (``cpu_data``) that reports another device; see :class:`SimulatedDevice`."""

    cpu_data: Tensor

    @staticmethod
    def __new__(cls, data: Tensor, device: torch.device) -> _SimulatedTensor:
        out = Tensor._make_wrapper_subclass(
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=device,
        )
        out.cpu_data = data
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func}: a SimulatedDevice tensor used outside its `with` block")

    def tolist(self) -> Any:
        # as on a device: one copy to the CPU (torch refuses .tolist() of a subclass)
        return self.cpu().tolist()

    def __repr__(self) -> str:
        return f"SimulatedTensor(device={self.device}, {self.cpu_data!r})"


class _Simulation(TorchDispatchMode):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Tensor)]
        target = kwargs.get("device")
        # an explicit device decides (a copy to the CPU leaves the device), else the inputs
        on_device = (
            target.type == self.device.type
            if target is not None
            else any(isinstance(a, _SimulatedTensor) for a in inputs)
        )

        def unwrap(a: Any) -> Any:
            if isinstance(a, _SimulatedTensor):
                return a.cpu_data
            if isinstance(a, torch.device) and a.type == self.device.type:
                return CPU
            return a

        args, kwargs = tree_map(unwrap, (args, kwargs))
        with torch._C._DisableTorchDispatch():  # plain CPU tensors, no mode below sees them
            out = func(*args, **kwargs)
        # an in-place operation returns its input: the caller's own tensor again
        originals = {id(unwrap(a)): a for a in inputs}

        def wrap(o: Any) -> Any:
            if not isinstance(o, Tensor):
                return o
            original = originals.get(id(o))
            if original is None:
                return _SimulatedTensor(o, self.device) if on_device else o
            if original.shape != o.shape or original.stride() != o.stride():
                raise NotImplementedError(f"{func} changes a simulated tensor's shape in place")
            return original

        return tree_map(wrap, out)


class SimulatedDevice:
    """Runs code on the CPU while its tensors report ``device`` (see the module docstring).

    Inside the ``with`` block, tensors from :meth:`tensor` and :meth:`module` and everything
    computed from them (or made with ``device=`` this device) report the device; their values
    are computed on the CPU as usual.

    The block also enters a ``FakeTensorMode`` that receives no operation: while one is active,
    torch does not initialise CUDA for a factory call with ``device="cuda"`` (which fails
    without a GPU), and ``torch.tensor(data, device=...)`` dispatches its copy to the device.
    Scaled dot-product attention is held to its math kernel, which needs no GPU to be chosen.

    Args:
        device: the device to report; not the CPU.
    """

    def __init__(self, device: str | torch.device = "cuda") -> None:
        device = torch.device(device)
        if device.type == "cpu":
            raise ValueError("simulate a device other than the CPU")
        self.device = torch.device(device.type, 0 if device.index is None else device.index)
        self._stack: contextlib.ExitStack | None = None

    def supported(self) -> bool:
        """Whether this torch runs the simulation without the real device.

        torch 2.6 takes a device guard in Python indexing and ``nonzero`` (2.11 no longer
        does), and a CUDA guard needs a GPU.
        """
        probe = SimulatedDevice(self.device)  # self may be in use
        with probe:
            x = probe.tensor(torch.zeros(2))
            try:
                x[1:].nonzero()
            except RuntimeError:
                return False
        return True

    def tensor(self, t: Tensor) -> Tensor:
        """``t`` (on the CPU) on the simulated device, sharing its data; inference only."""
        if isinstance(t, _SimulatedTensor):
            return t
        if t.device.type != "cpu":
            raise ValueError(f"a simulated tensor holds CPU data, not {t.device}")
        return _SimulatedTensor(t.detach(), self.device)

    def module(self, module: nn.Module) -> nn.Module:
        """Moves ``module``'s parameters and buffers to the simulated device in place, as
        ``module.to(device)`` does; returns the module."""
        moved: dict[int, Tensor] = {}  # a tensor shared by several modules stays one tensor
        for m in module.modules():
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None:
                        store[name] = moved.setdefault(id(t), self.tensor(t))
        return module

    def __enter__(self) -> SimulatedDevice:
        from torch._subclasses.fake_tensor import FakeTensorMode

        stack = contextlib.ExitStack()
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        stack.enter_context(FakeTensorMode())  # an infra mode: below every user mode
        stack.enter_context(_Simulation(self.device))
        self._stack = stack
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


__all__ = ["DispatchLog", "OpEvent", "SimulatedDevice", "count_dispatch"]
