"""k5's configurations: the two instantiations of kernels/k5_adaptive.cu (host or device schedule) and
the named variants of chapter 06, each a schedule, a remainder policy and an order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from moe_gemm.variants.k5.mixed_tiles import BM, BN, FIXED_128, Order, Policy
from moe_gemm.variants.sm90.config import BK, SWIZZLE_ALIGN, BLayout

SOURCE = "k5_adaptive.cu"
KERNEL_FUNCTION = "k5_adaptive"
MAX_EXPERTS = 256  # kernels/k5_adaptive.cu, k5::MAX_EXPERTS
STAGES = 4  # 4 x 40 KB of ring + 48 KB of C staging: k3/tmastore-bn192's budget
TOKEN_BOX_ROWS = 16  # the A boxes of M64 and SWAP tiles
B_LAYOUT: BLayout = "kn"  # B [E, K, N] as given: its TMA map and descriptor plan are k3/tmastore-bn192's
POLICY_DTYPE = np.dtype([("swap_max", "<i4"), ("m64_max", "<i4")])
Schedule = Literal["host", "device"]
PolicyChoice = Literal["model", "greedy"] | Policy


@dataclass(frozen=True)
class K5Config:
    schedule: Schedule
    policy: PolicyChoice  # a fixed Policy, the cost model's choice per routing, or the greedy rule
    order: Order = "expert"
    graph: bool = False  # replay one captured CUDA graph instead of launching

    @property
    def kernel_name(self) -> str:
        return f"{KERNEL_FUNCTION}<{STAGES}, {'true' if self.schedule == 'device' else 'false'}>"

    @property
    def dynamic_smem_bytes(self) -> int:
        stage = (BM + BN) * BK * 2  # an M128 stage, the widest: A 128 x 64 and B 64 x 192
        return STAGES * stage + BM * BN * 2 + SWIZZLE_ALIGN  # ring, C staging, alignment slack


VARIANT_CONFIGS: dict[str, K5Config] = {
    "k5/host": K5Config("host", "model"),
    "k5/host-lpt": K5Config("host", "model", order="kind"),
    "k5/device": K5Config("device", "greedy"),
    "k5/device-graph": K5Config("device", "greedy", graph=True),
    "k5/m128": K5Config("host", FIXED_128),
    "k5/m64": K5Config("host", Policy(0, 64)),
    "k5/swap": K5Config("host", Policy(64, 64)),
}
CHECKED = ("k5/m128", "k5/m64", "k5/swap", "k5/host", "k5/device", "k5/device-graph")
# compute-sanitizer's set: each tile kind's code path, the cost model's mixed list, the device schedule.
SANITIZED = ("k5/m64", "k5/swap", "k5/host", "k5/device")


def policy_argument(policy: Policy) -> np.void:
    return np.array([(policy.swap_max, policy.m64_max)], dtype=POLICY_DTYPE)[0]
