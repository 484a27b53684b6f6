"""The peers every chapter measures itself against: torch._grouped_mm and a per-expert torch loop.

Both are :class:`~moe_gemm.cuda.variant.Variant` s, so they are checked against the reference and timed
by the same code as the kernels, in the same run, on the same uploaded inputs: torch tensors
*view* the harness buffers (no copy) and every launch goes to the harness stream (a
``torch.cuda.ExternalStream`` over it), where the timing events are recorded.

* ``peer/torch_grouped_mm``: ``torch._grouped_mm(A, B, offs=<int32 cumulative row ends>,
  out_dtype=bfloat16)``, on sm_90 CUTLASS's grouped GEMM. Its rules, as torch 2.11 checks them: K and N
  multiples of 8 (16-byte strides), fewer than 1024 groups, sm_90 or newer; rows past
  ``offs[-1]`` would be left unwritten, which never happens here (``offs[-1] = M_tot``).
* ``peer/torch_grouped_mm-wgrad``: the weight gradient dB[e] = A_e^T dC_e through the same call's 2D x 2D
  form (chapter 09).
* ``peer/torch_scaled_grouped_mm`` and ``-fast``: torch's FP8 grouped GEMM with rowwise scales, its sums
  promoted to fp32 or accumulated in the tensor core (chapter 10).
* ``peer/torch_loop``: one ``torch.matmul`` (cuBLAS) per non-empty expert, written straight into
  the expert's rows of C. It is what grouped GEMM replaces: one launch per expert, issued from
  Python, so at small batches the host, not the GPU, sets its time.

torch is optional (``pip install -e '.[peers]'``); without it, or without a GPU,
:func:`available_peers` is empty and the chapters print their kernels alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moe_gemm.cuda.device import BF16_NAN_BITS, DeviceArray, DeviceProblem, stream_handle, synchronize, to_device
from moe_gemm.cuda.gpu import detect_gpu, require_capability
from moe_gemm.cuda.variant import Prepared
from moe_gemm.model.problem import BF16, FP8_ROWWISE
from moe_gemm.variants.compiled import require_takes

PEER_GROUPED_MM = "peer/torch_grouped_mm"
PEER_GROUPED_MM_KMAJOR = "peer/torch_grouped_mm-kmajor"  # the same call, B column-major (K contiguous)
PEER_LOOP = "peer/torch_loop"
PEER_GROUPED_MM_WGRAD = "peer/torch_grouped_mm-wgrad"  # the weight gradient: the 2D x 2D form
# torch's FP8 grouped GEMM with rowwise scales (chapter 10), its sums promoted to fp32 or not
PEER_SCALED_GROUPED_MM = "peer/torch_scaled_grouped_mm"
PEER_SCALED_GROUPED_MM_FAST = "peer/torch_scaled_grouped_mm-fast"
# One call, B in either layout: the faster of the two is the peer's number at a workload.
GROUPED_MM_PEERS = (PEER_GROUPED_MM, PEER_GROUPED_MM_KMAJOR)
GROUPED_MM_MIN_CAPABILITY = (9, 0)  # torch._grouped_mm's bf16 CUTLASS kernels are sm_90+
GROUPED_MM_MAX_GROUPS = 1023  # "fewer than 1024 groups"
GROUPED_MM_ELEMENT_MULTIPLE = 8  # K and N: 8 bf16 = 16-byte strides for TMA
LOOP_MIN_CAPABILITY = (8, 0)  # cuBLAS bf16 GEMM with fp32 accumulation: sm_80+


def _torch(variant: str):
    try:
        import torch
    except ImportError:
        raise ValueError(f"{variant} needs torch (pip install -e '.[peers]')") from None
    if not torch.cuda.is_available():
        raise ValueError(f"{variant} needs torch with CUDA and a GPU; torch.cuda.is_available() is False")
    return torch


class _Int16Interface:
    """A harness buffer re-labelled as int16 for torch: torch has read '<i2' from
    ``__cuda_array_interface__`` for as long as it has read the protocol ('<u2' only lately);
    the bits are then reinterpreted as bfloat16 without a copy."""

    def __init__(self, array: DeviceArray) -> None:
        self.base = array  # keeps the allocation alive as long as torch holds this object
        self.__cuda_array_interface__ = {**array.__cuda_array_interface__, "typestr": "<i2"}


def torch_view(array: DeviceArray) -> Any:
    """A torch tensor over a harness buffer, no copy: bf16 buffers come back as torch.bfloat16."""
    torch = _torch("a torch view")
    if array.dtype == BF16:
        return torch.as_tensor(_Int16Interface(array), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(array, device="cuda")


def torch_stream() -> Any:
    """The harness stream, as a torch stream: ``with torch.cuda.stream(torch_stream()): ...``."""
    torch = _torch("the harness stream in torch")
    return torch.cuda.ExternalStream(stream_handle())


def _u16_as_i16(bits: int) -> int:
    return int(np.array(bits, dtype=np.uint16).view(np.int16))


class TorchOutput:
    """The output of a peer that allocates its own: the tensor its latest launch returned.

    ``torch._grouped_mm`` has no ``out=`` argument, and copying its result into a harness
    buffer inside the launch would add a device copy of C (88 MB at the seed shape) to the time
    being measured. So the launch keeps torch's tensor, and this object is read in its place,
    with the two methods bench uses on a :class:`~moe_gemm.cuda.device.DeviceArray`:

    * :meth:`download` returns what the peer actually wrote in its latest launch;
    * :meth:`fill_u16` poisons the latest result in place. The next launch drops it just before
      calling the peer, on the same stream, so torch's caching allocator hands that poisoned
      block to the new result: an element the peer failed to write would still read NaN.
    """

    def __init__(self, shape: tuple[int, ...], stream: Any) -> None:
        import torch

        self.shape, self.dtype, self._stream = shape, BF16, stream
        with torch.cuda.stream(stream):  # a poisoned block of the result's size, for the first launch
            self.tensor = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        self.fill_u16(BF16_NAN_BITS)

    def fill_u16(self, bits: int) -> None:
        import torch

        with torch.cuda.stream(self._stream):
            self.tensor.view(torch.int16).fill_(_u16_as_i16(bits))

    def download(self) -> np.ndarray:
        import torch

        synchronize()  # the harness stream, where the peer ran
        host = self.tensor.view(torch.int16).cpu().numpy()
        return host.view(np.uint16).view(BF16).reshape(self.shape)


# --8<-- [start:grouped_mm]
def check_grouped_mm_inputs(experts: int, K: int, N: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of torch._grouped_mm that these inputs break."""
    multiple = GROUPED_MM_ELEMENT_MULTIPLE
    if K % multiple or N % multiple:
        raise ValueError(f"{PEER_GROUPED_MM} needs K and N to be multiples of {multiple} (16-byte strides), "
                         f"got K = {K}, N = {N}")
    if experts > GROUPED_MM_MAX_GROUPS:
        raise ValueError(f"{PEER_GROUPED_MM} takes fewer than 1024 groups, got E = {experts}")
    for name, address in (("A", a_address), ("B", b_address)):
        if address % 16:
            raise ValueError(f"{PEER_GROUPED_MM} needs {name} to start on a 16-byte boundary, got {address:#x}")


class TorchGroupedMM:
    """``peer/torch_grouped_mm``: one torch._grouped_mm over the harness buffers.

    ``k_major=True`` (``peer/torch_grouped_mm-kmajor``) hands it B column-major instead, a
    [E, K, N] view of a K-contiguous copy made once in prepare (the offline weight-layout step
    that k3's ``-kmajor`` variants also assume): torch accepts both layouts and dispatches a
    different CUTLASS kernel for each, so a fair comparison takes the faster.
    """

    uses_torch = True  # allocates through torch (measure.graph_replay captures it with torch.cuda.graph)

    def __init__(self, k_major: bool = False) -> None:
        self.k_major = k_major
        self.name = PEER_GROUPED_MM_KMAJOR if k_major else PEER_GROUPED_MM

    def __repr__(self) -> str:
        return f"TorchGroupedMM(k_major={self.k_major})"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        require_takes(self.name, problem)
        torch = _torch(self.name)
        require_capability(detect_gpu(), GROUPED_MM_MIN_CAPABILITY, f"{self.name} (CUTLASS grouped GEMM)")
        if not hasattr(torch, "_grouped_mm"):
            raise ValueError(f"{self.name} needs torch >= 2.8 (torch._grouped_mm); this is torch {torch.__version__}")
        check_grouped_mm_inputs(problem.experts, problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        stream = torch_stream()
        output = TorchOutput((problem.tokens, problem.N), stream)
        if problem.tokens == 0:  # M_tot = 0: nothing to multiply, an empty C
            return Prepared(launch=lambda: None, output=output, keep_alive=[dev])
        a, b = torch_view(dev.a), torch_view(dev.b)
        if self.k_major:
            with torch.cuda.stream(stream):
                b = b.transpose(1, 2).contiguous().transpose(1, 2)  # strides (K*N, 1, K)
        ends = to_device(problem.offsets[1:].astype(np.int32))  # offs: each group's cumulative end row
        offs = torch_view(ends)

        def run() -> None:
            with torch.cuda.stream(stream):
                output.tensor = None  # free the poisoned block first: the result reuses it
                output.tensor = torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)

        return Prepared(launch=run, output=output, keep_alive=[dev, ends, a, b, offs])
# --8<-- [end:grouped_mm]


# --8<-- [start:grouped_mm_wgrad]
class TorchWeightGrad:
    """``peer/torch_grouped_mm-wgrad``: the weight gradient as torch's autograd computes it for
    ``torch._grouped_mm``: its 2D x 2D form, ``torch._grouped_mm(A.t(), dC, offs=offs)`` -> dB [E, K, N],
    the groups running along the shared (reduced) axis. A.t() is the transposed view of the row-major A, as
    the backward of the forward receives it: no copy. bf16 out (torch's output dtype is its inputs')."""

    uses_torch = True

    name = PEER_GROUPED_MM_WGRAD
    ragged_axes = ("K",)

    def __repr__(self) -> str:
        return "TorchWeightGrad()"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        require_takes(self.name, problem, ragged_axes=self.ragged_axes)
        torch = _torch(self.name)
        require_capability(detect_gpu(), GROUPED_MM_MIN_CAPABILITY, f"{self.name} (CUTLASS grouped GEMM)")
        check_grouped_mm_inputs(problem.experts, problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        stream = torch_stream()
        output = TorchOutput(problem.out_shape, stream)
        if problem.tokens == 0:  # torch refuses a zero-length reduction (pytorch#192497): dB = 0
            return Prepared(launch=lambda: output.fill_u16(0), output=output, keep_alive=[dev])
        a, dc = torch_view(dev.a), torch_view(dev.b)
        ends = to_device(problem.offsets[1:].astype(np.int32))
        offs = torch_view(ends)

        def run() -> None:
            with torch.cuda.stream(stream):
                output.tensor = None  # free the poisoned block first: the result reuses it
                output.tensor = torch._grouped_mm(a.t(), dc, offs=offs, out_dtype=torch.bfloat16)

        return Prepared(launch=run, output=output, keep_alive=[dev, ends, a, dc, offs])
# --8<-- [end:grouped_mm_wgrad]


# --8<-- [start:scaled_grouped_mm]
class TorchScaledGroupedMM:
    """``peer/torch_scaled_grouped_mm`` (``-fast`` with ``fast_accum=True``): torch's FP8 grouped GEMM with rowwise
    scales, ``torch._scaled_grouped_mm(A, B, scale_a [M_tot], scale_b [E, N], offs=offs, out_dtype=bfloat16,
    use_fast_accum=...)``, on sm_90 CUTLASS's. A row-major e4m3; B the [E, K, N] view of B^T [E, N, K] (its FP8
    GEMM takes B column-major, K contiguous, made once in prepare as the k8 variants make theirs).
    ``use_fast_accum=False`` promotes the tensor core's sums into fp32 as k8 does; True lets it accumulate all
    of K (chapter 10)."""

    uses_torch = True
    formats = (FP8_ROWWISE,)
    out_dtypes = (BF16,)

    def __init__(self, fast_accum: bool = False) -> None:
        self.fast_accum = fast_accum
        self.name = PEER_SCALED_GROUPED_MM_FAST if fast_accum else PEER_SCALED_GROUPED_MM

    def __repr__(self) -> str:
        return f"TorchScaledGroupedMM(fast_accum={self.fast_accum})"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        from moe_gemm.variants.sm90.maps import transposed_b

        problem = dev.problem
        require_takes(self.name, problem, formats=self.formats, out_dtypes=self.out_dtypes)
        torch = _torch(self.name)
        require_capability(detect_gpu(), GROUPED_MM_MIN_CAPABILITY, f"{self.name} (CUTLASS FP8 grouped GEMM)")
        if not hasattr(torch, "_scaled_grouped_mm"):
            raise ValueError(f"{self.name} needs torch._scaled_grouped_mm; this is torch {torch.__version__}")
        if problem.K % 16 or problem.N % 16:
            raise ValueError(f"{self.name} needs K and N to be multiples of 16 (16-byte rows of e4m3 and of its "
                             f"B column-major), got K = {problem.K}, N = {problem.N}")
        check_grouped_mm_inputs(problem.experts, problem.K, problem.N, dev.a.ptr, dev.b.ptr)
        stream = torch_stream()
        output = TorchOutput((problem.tokens, problem.N), stream)
        if problem.tokens == 0:
            return Prepared(launch=lambda: None, output=output, keep_alive=[dev])
        b_t = transposed_b(dev)  # B^T [E, N, K]
        a = torch_view(dev.a).view(torch.float8_e4m3fn)
        b = torch_view(b_t).view(torch.float8_e4m3fn).transpose(1, 2)  # [E, K, N], column-major
        scale_a, scale_b = torch_view(dev.scale_a), torch_view(dev.scale_b)
        ends = to_device(problem.offsets[1:].astype(np.int32))
        offs = torch_view(ends)

        def run() -> None:
            with torch.cuda.stream(stream):
                output.tensor = None  # free the poisoned block first: the result reuses it
                output.tensor = torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=torch.bfloat16,
                                                         use_fast_accum=self.fast_accum)

        try:  # torch checks its rules (layouts, alignments, dtypes) at the call: refused here, before any timing
            run()
            synchronize()
        except RuntimeError as error:
            raise ValueError(f"{self.name} refuses these inputs: {str(error).splitlines()[0]}") from None
        output.fill_u16(BF16_NAN_BITS)
        return Prepared(launch=run, output=output, keep_alive=[dev, b_t, ends, a, b, scale_a, scale_b, offs])
# --8<-- [end:scaled_grouped_mm]


class TorchLoop:
    """``peer/torch_loop``: one torch.matmul per non-empty expert, into that expert's rows of C."""

    uses_torch = True  # allocates through torch (measure.graph_replay captures it with torch.cuda.graph)

    name = PEER_LOOP

    def __repr__(self) -> str:
        return "TorchLoop()"

    def prepare(self, dev: DeviceProblem) -> Prepared:
        problem = dev.problem
        require_takes(self.name, problem)
        torch = _torch(self.name)
        require_capability(detect_gpu(), LOOP_MIN_CAPABILITY, f"{self.name} (cuBLAS bf16 GEMM)")
        output = dev.new_output()
        if problem.tokens == 0:  # M_tot = 0: nothing to multiply, an empty C
            return Prepared(launch=lambda: None, output=output, keep_alive=[dev])
        a, b = torch_view(dev.a), torch_view(dev.b)
        c = torch_view(output)  # matmul writes straight into the harness buffer: no copy
        offsets = problem.offsets
        spans = [(e, int(offsets[e]), int(offsets[e + 1])) for e in range(problem.experts)
                 if offsets[e + 1] > offsets[e]]
        stream = torch_stream()

        def run() -> None:
            with torch.cuda.stream(stream):
                for e, lo, hi in spans:
                    torch.matmul(a[lo:hi], b[e], out=c[lo:hi])

        return Prepared(launch=run, output=output, keep_alive=[dev, a, b, c])


def torch_available() -> bool:
    """torch is installed and sees a GPU."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def available_peers() -> list[Any]:
    """The peers that can run here: none without torch or a GPU; torch._grouped_mm on sm_90+."""
    gpu = detect_gpu()
    if gpu is None or not torch_available():
        return []
    import torch

    peers: list[Any] = []
    if gpu.compute_capability >= GROUPED_MM_MIN_CAPABILITY and hasattr(torch, "_grouped_mm"):
        peers.append(TorchGroupedMM())
    if gpu.compute_capability >= LOOP_MIN_CAPABILITY:
        peers.append(TorchLoop())
    return peers


# Names the by-name entry points resolve (variants/registry.py maps the 'peer' family here).
VARIANTS = {PEER_GROUPED_MM: TorchGroupedMM, PEER_GROUPED_MM_KMAJOR: lambda: TorchGroupedMM(k_major=True),
            PEER_LOOP: TorchLoop, PEER_GROUPED_MM_WGRAD: TorchWeightGrad,
            PEER_SCALED_GROUPED_MM: TorchScaledGroupedMM,
            PEER_SCALED_GROUPED_MM_FAST: lambda: TorchScaledGroupedMM(fast_accum=True)}
