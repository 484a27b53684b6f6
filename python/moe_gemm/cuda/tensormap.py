"""TMA tensor maps: the host-side descriptors that chapter 03's kernel hands to the copy engine.

A tensor map tells the Tensor Memory Accelerator everything about one global tensor except which
piece to copy: the base address, the extent of each dimension, the byte stride between rows (and
planes), the *box* one copy moves, how the box is laid out in shared memory (the swizzle), how much
L2 prefetches around it, and what out-of-bounds elements read as. The kernel later names a box by
its starting coordinates only. Dimensions are listed innermost first, the opposite of numpy::

    A [M_tot, K] row-major      dims (K, M_tot)      strides (K*2,)           box (64, 128)
    B [E, K, N]  row-major      dims (N, K, E)       strides (N*2, K*N*2)     box (64, 64, 1)

:class:`TiledMap` holds those numbers and checks them against ``cuTensorMapEncodeTiled``'s rules
(cuda.h documents them) *before* the driver sees them, so a bad input fails with a ValueError that
names the rule, on any machine, rather than with CUDA_ERROR_INVALID_VALUE on the GPU one.
:meth:`TiledMap.encode` then asks the driver for the 128-byte descriptor, which a kernel takes by
value as a ``const __grid_constant__ CUtensorMap`` parameter (launch it with
:class:`~moe_gemm.cuda.launch.TensorMapArg`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_RANK = 5
MAX_DIM = 2**32  # globalDim[i] <= 2^32
MAX_STRIDE = 2**40  # globalStrides[i] < 2^40
MAX_BOX = 256  # boxDim[i] <= 256
GLOBAL_ALIGN = 16  # the base address and every stride are multiples of 16 bytes
SWIZZLE_BYTES = (0, 32, 64, 128)  # CU_TENSOR_MAP_SWIZZLE_NONE / 32B / 64B / 128B
L2_PROMOTION_BYTES = (0, 64, 128, 256)
# The element types encoded here: the driver's data type and the bytes of one element. TMA copies bytes
# and converts nothing; the type matters to the driver's checks and to the box's width in bytes.
# fp8 e4m3 goes as bytes (the driver's 8-bit unsigned type): the copy is the same whatever the byte means.
ELEMENTS: dict[str, tuple[str, int]] = {"bf16": ("BFLOAT16", 2), "fp16": ("FLOAT16", 2), "fp32": ("FLOAT32", 4),
                                        "e4m3": ("UINT8", 1)}


def element_bytes(element: str, name: str = "") -> int:
    """The bytes of one ``element``; a ValueError (naming tensor map ``name``) for a type not encoded here."""
    if element not in ELEMENTS:
        raise ValueError(f"tensor map {name}: the element must be one of {', '.join(ELEMENTS)}, got {element!r}")
    return ELEMENTS[element][1]


@dataclass(frozen=True)
class TiledMap:
    """One tiled tensor map for a bf16, fp16, fp32 or e4m3 tensor. Dimensions innermost first; strides in bytes."""

    name: str  # for error messages, e.g. "A"
    address: int  # device address of element (0, 0, ...)
    dims: tuple[int, ...]  # elements per dimension, innermost first
    strides: tuple[int, ...]  # bytes between consecutive indices of dims[1:], so rank - 1 of them
    box: tuple[int, ...]  # elements one copy moves per dimension
    element: str = "bf16"  # a key of ELEMENTS
    swizzle_bytes: int = 128
    # 256-byte L2 promotion: every box row here is 128 bytes, and the neighbouring 128 bytes of the
    # same global row are wanted next (A: the following K step; B: the tile's second 64-column
    # panel in the same stage). Fetching 256 bytes per L2 miss brings both in one DRAM request.
    l2_promotion_bytes: int = 256
    # A panel map (panel_map) views each row as 64-element panels in its own last dimension, whose stride
    # (the box's inner extent) is smaller than the row stride before it: the one dimension exempt from the
    # rule that a stride covers the dimensions below it.
    panel_dim: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def element_bytes(self) -> int:
        return element_bytes(self.element, self.name)

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory: the whole box, out-of-bounds parts included."""
        total = self.element_bytes
        for extent in self.box:
            total *= extent
        return total

    def validate(self) -> TiledMap:
        """ValueError naming the first cuTensorMapEncodeTiled rule these numbers break."""
        name, rank = self.name, len(self.dims)
        element_bytes(self.element, name)
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"tensor map {name}: rank must be 1..{MAX_RANK}, got {rank}")
        if len(self.strides) != rank - 1 or len(self.box) != rank:
            raise ValueError(f"tensor map {name}: {rank} dims need {rank - 1} strides and {rank} box extents, "
                             f"got {len(self.strides)} and {len(self.box)}")
        if self.address % GLOBAL_ALIGN:
            raise ValueError(f"tensor map {name}: the global address must be {GLOBAL_ALIGN}-byte aligned for TMA, "
                             f"got {self.address:#x} ({self.address % GLOBAL_ALIGN} bytes past a boundary)")
        for i, dim in enumerate(self.dims):
            if not 1 <= dim <= MAX_DIM:
                raise ValueError(f"tensor map {name}: dimension {i} must be 1..2^32 elements, got {dim}")
        extent = self.dims[0] * self.element_bytes  # bytes spanned by the dimensions below stride i
        for i, stride in enumerate(self.strides):
            if stride % GLOBAL_ALIGN:
                raise ValueError(f"tensor map {name}: stride {i} must be a multiple of {GLOBAL_ALIGN} bytes for TMA, "
                                 f"got {stride} bytes")
            if i + 1 == self.panel_dim:  # the panels of a row: side by side within the row stride
                if not (stride == self.box[0] * self.element_bytes and self.dims[i + 1] * stride <= self.strides[0]):
                    raise ValueError(f"tensor map {name}: the panels of dimension {i + 1} must lie side by side "
                                     f"(stride = the box's inner {self.box[0] * self.element_bytes} bytes) within "
                                     f"the {self.strides[0]}-byte rows, got stride {stride} x {self.dims[i + 1]}")
                continue
            if not extent <= stride < MAX_STRIDE:
                raise ValueError(f"tensor map {name}: stride {i} must cover the {extent} bytes below it and be "
                                 f"< 2^40, got {stride}")
            extent = stride * self.dims[i + 1]
        for i, extent in enumerate(self.box):
            if not 1 <= extent <= MAX_BOX:
                raise ValueError(f"tensor map {name}: box extent {i} must be 1..{MAX_BOX}, got {extent}")
        inner = self.box[0] * self.element_bytes
        if inner % 16:
            raise ValueError(f"tensor map {name}: the box's inner extent must be a multiple of 16 bytes, got {inner}")
        if self.swizzle_bytes not in SWIZZLE_BYTES:
            raise ValueError(f"tensor map {name}: swizzle must be one of {SWIZZLE_BYTES} bytes, "
                             f"got {self.swizzle_bytes}")
        if self.swizzle_bytes and inner > self.swizzle_bytes:
            raise ValueError(f"tensor map {name}: with a {self.swizzle_bytes}-byte swizzle the box's inner extent "
                             f"must be <= {self.swizzle_bytes} bytes, got {inner}")
        if self.l2_promotion_bytes not in L2_PROMOTION_BYTES:
            raise ValueError(f"tensor map {name}: L2 promotion must be one of {L2_PROMOTION_BYTES} bytes, "
                             f"got {self.l2_promotion_bytes}")
        return self

    # --8<-- [start:encode]
    def encode(self) -> Any:
        """The driver's 128-byte CUtensorMap (needs a GPU of compute capability 9.0 or newer)."""
        from cuda.bindings import driver

        from moe_gemm.cuda.device import check_driver, cuda_device

        cuda_device()  # a current context
        swizzle = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}[self.swizzle_bytes]
        promotion = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}[self.l2_promotion_bytes]
        return check_driver(driver.cuTensorMapEncodeTiled(
            getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{ELEMENTS[self.element][0]}"),
            self.rank,
            self.address,
            [driver.cuuint64_t(d) for d in self.dims],  # list arguments must be wrapped: a plain
            [driver.cuuint64_t(s) for s in self.strides],  # int list is rejected by the bindings
            [driver.cuuint32_t(b) for b in self.box],
            [driver.cuuint32_t(1)] * self.rank,  # element strides: every element, no skipping
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
            getattr(driver.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}"),
            # Out-of-bounds elements read as zero (not NaN): a zero row of A or column of B adds
            # nothing to any accumulator, so boxes may hang over the tensor's edges.
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ))
    # --8<-- [end:encode]


# --8<-- [start:checks]
def check_tma_gemm(kernel: str, K: int, N: int, bk: int, a_address: int = 0, b_address: int = 0) -> None:
    """ValueError naming the first rule of TMA, or of a kernel that loads ``bk`` of K per box, that
    these inputs break (the rules of every TMA-fed kernel here: k2, k3, k4, k5).

    K = 0 passes every divisibility rule but gives the pipeline no K step: the consumers would
    store accumulators no MMA wrote (k3 stores the previous tile's) or wait on a full barrier that
    no copy ever arrives at (k5 hangs), so it is refused first, as is N = 0.
    """
    if K < 1:
        raise ValueError(f"{kernel} needs K to be a positive multiple of BK = {bk} (at least one K step to load "
                         f"and multiply), got K = {K}")
    if N < 1:
        raise ValueError(f"{kernel} needs N >= 1, got N = {N}")
    if K % 8:
        raise ValueError(f"{kernel} needs K to be a multiple of 8: TMA row strides (K * 2 bytes) must be multiples "
                         f"of 16 bytes, got K = {K}")
    if N % 8:
        raise ValueError(f"{kernel} needs N to be a multiple of 8: TMA row strides (N * 2 bytes) must be multiples "
                         f"of 16 bytes, got N = {N}")
    if K % bk:
        raise ValueError(f"{kernel} needs K to be a multiple of BK = {bk} (one TMA box per K step), got K = {K}")
    for name, address in (("A", a_address), ("B", b_address)):
        if address % GLOBAL_ALIGN:
            raise ValueError(f"{kernel} needs {name} to start on a {GLOBAL_ALIGN}-byte boundary (a TMA global "
                             f"address rule), got {address:#x}")
# --8<-- [end:checks]


def matrix_map(name: str, address: int, rows: int, cols: int, box_rows: int, box_cols: int, element: str = "bf16",
               **options: Any) -> TiledMap:
    """A row-major [rows, cols] matrix of ``element`` (bf16 unless said), boxes of box_rows x box_cols."""
    size = element_bytes(element, name)
    return TiledMap(name, address, (cols, rows), (cols * size,), (box_cols, box_rows), element=element, **options)


# --8<-- [start:panel_map]
def panel_map(name: str, address: int, rows: int, cols: int, box_rows: int, box_panels: int, element: str = "bf16",
              panel: int = 64, **options: Any) -> TiledMap:
    """A row-major [rows, cols] matrix as (panel, rows, cols / panel): each row's ``panel``-element pieces
    (128 bytes of bf16: one swizzle row) side by side in a third dimension, so that one box of
    box_rows x box_panels panels lands in shared memory as box_panels separate [box_rows, panel] boxes, back
    to back, in one copy. Panels past the last are out of bounds (zeros); ``cols`` must be a multiple of
    ``panel``, or the last panel would read the next row."""
    if cols % panel:
        raise ValueError(f"tensor map {name}: a panel map needs the columns to be a multiple of {panel}, got {cols}")
    size = element_bytes(element, name)
    return TiledMap(name, address, (panel, rows, cols // panel), (cols * size, panel * size),
                    (panel, box_rows, box_panels), element=element, panel_dim=2, **options)
# --8<-- [end:panel_map]


def batched_matrix_map(name: str, address: int, batch: int, rows: int, cols: int, box_rows: int, box_cols: int,
                       element: str = "bf16", **options: Any) -> TiledMap:
    """A row-major [batch, rows, cols] tensor of ``element``, boxes of box_rows x box_cols within one matrix."""
    size = element_bytes(element, name)
    return TiledMap(name, address, (cols, rows, batch), (cols * size, rows * cols * size), (box_cols, box_rows, 1),
                    element=element, **options)
