"""The peers every chapter measures itself against, as variants of the family ``peer``.

``peer/torch_grouped_mm`` (CUTLASS's grouped GEMM inside torch, with B in either layout) and
``peer/torch_loop`` (one cuBLAS call per expert) live in :mod:`.torch`; ``peer/quack`` (quack's
autotuned varlen-M GEMM, the kernels SonicMoE runs on) and ``peer/quack-top1`` ... ``-top3``
(its autotuner's three fastest configurations) in :mod:`.quack`. A peer that is not installed
is left out with its reason, never faked.
"""

from moe_gemm.variants.peer.quack import VARIANTS as QUACK_VARIANTS
from moe_gemm.variants.peer.torch import VARIANTS as TORCH_VARIANTS

VARIANTS = {**TORCH_VARIANTS, **QUACK_VARIANTS}

__all__ = ["VARIANTS"]
