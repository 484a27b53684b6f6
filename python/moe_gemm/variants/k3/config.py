"""k3's configurations: the template instantiations of kernels/k3_wgmma.cu and how each launches.

Each rung of chapter 04's ladder is one :class:`K3Config` in :data:`LADDER`, named for what it adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_gemm.variants.sm90.config import BK, SWIZZLE_ALIGN, WARPGROUP, BLayout

SOURCE = "k3_wgmma.cu"
KERNEL_FUNCTION = "k3_wgmma"  # the __global__ templates' common prefix (for profiler filters)


@dataclass(frozen=True)
class K3Config:
    """One instantiation of the kernel template plus how it is launched."""

    bm: int
    bn: int
    consumers: int  # consumer warpgroups: 1 or 2
    stages: int
    cluster: int = 1  # 2: B multicast across a cluster of two blocks
    persistent: bool = False  # one block (cluster) per SM slot instead of one per tile
    b_layout: BLayout = "kn"
    tma_store: bool = False  # the epilogue through shared memory (stmatrix + TMA store)

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers + (WARPGROUP if self.consumers == 2 else 32)  # a producer warpgroup or warp

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def staging_bytes(self) -> int:
        """The C tile staged for the TMA store: each warpgroup's slice, bf16."""
        return self.bm * self.bn * 2 if self.tma_store else 0

    @property
    def dynamic_smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + self.staging_bytes + SWIZZLE_ALIGN

    @property
    def kernel_name(self) -> str:
        entry = KERNEL_FUNCTION if self.cluster == 1 else f"{KERNEL_FUNCTION}_cluster2"
        flags = ", ".join("true" if flag else "false" for flag in (self.b_layout == "nk", self.tma_store))
        return f"{entry}<{self.bm}, {self.bn}, {self.consumers}, {self.stages}, {flags}>"


# --8<-- [start:ladder]
LADDER: dict[str, K3Config] = {
    # (a) one consumer warpgroup + a producer warp; 3 x 32 KB stages so that two blocks share an SM
    "k3/1wg-bn128": K3Config(bm=128, bn=128, consumers=1, stages=3),
    # (b) two consumer warpgroups + a producer warpgroup, setmaxnreg 40 / 232; one block per SM
    "k3/2wg-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6),
    "k3/2wg-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4),
    # (c) persistent: one block per SM walks the tile list; as many stages as fit 227 KB
    "k3/persistent-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6, persistent=True),
    "k3/persistent-bn192": K3Config(bm=128, bn=192, consumers=2, stages=5, persistent=True),
    "k3/persistent-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    "k3/persistent-bm64-bn256": K3Config(bm=64, bn=256, consumers=2, stages=5, persistent=True),
    # (d) clusters of two with B multicast
    "k3/multicast-bn128": K3Config(bm=128, bn=128, consumers=2, stages=6, cluster=2, persistent=True),
    "k3/multicast-bn192": K3Config(bm=128, bn=192, consumers=2, stages=5, cluster=2, persistent=True),
    "k3/multicast-bn256": K3Config(bm=128, bn=256, consumers=2, stages=4, cluster=2, persistent=True),
    # (e) the epilogue through shared memory and TMA stores; the C staging costs a stage
    "k3/tmastore-bn128": K3Config(bm=128, bn=128, consumers=2, stages=5, persistent=True, tma_store=True),
    "k3/tmastore-bn192": K3Config(bm=128, bn=192, consumers=2, stages=4, persistent=True, tma_store=True),
    "k3/tmastore-bn256": K3Config(bm=128, bn=256, consumers=2, stages=3, persistent=True, tma_store=True),
    "k3/tmastore-bm64-bn256": K3Config(bm=64, bn=256, consumers=2, stages=4, persistent=True, tma_store=True),
    "k3/multicast-tmastore-bn192": K3Config(bm=128, bn=192, consumers=2, stages=4, cluster=2, persistent=True,
                                            tma_store=True),
    "k3/multicast-tmastore-bn256": K3Config(bm=128, bn=256, consumers=2, stages=3, cluster=2, persistent=True,
                                            tma_store=True),
    # B^T [E, N, K]: both operands K-major
    "k3/persistent-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=5, persistent=True, b_layout="nk"),
    "k3/multicast-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=5, cluster=2, persistent=True,
                                          b_layout="nk"),
    "k3/tmastore-bn192-kmajor": K3Config(bm=128, bn=192, consumers=2, stages=4, persistent=True, tma_store=True,
                                         b_layout="nk"),
}
# --8<-- [end:ladder]

# The rungs compute-sanitizer runs on: together they take every branch of the template (producer
# warp and warpgroup, one and two M slices per warpgroup, split by rows and by columns, one block
# per tile and persistent, cluster with and without multicast pairs, register and TMA-store
# epilogues, both B layouts) at a fraction of the ladder's sanitizer time.
SANITIZED = ("k3/1wg-bn128", "k3/2wg-bn256", "k3/tmastore-bm64-bn256", "k3/multicast-tmastore-bn192",
             "k3/multicast-bn192-kmajor", "k3/persistent-bn128")
