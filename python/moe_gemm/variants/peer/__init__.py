"""The peers every chapter measures itself against, as variants of the family ``peer``.

``peer/torch_grouped_mm`` (CUTLASS's grouped GEMM inside torch, with B in either layout) and
``peer/torch_loop`` (one cuBLAS call per expert) live in :mod:`.torch`; a peer that is not
installed is left out with its reason, never faked.
"""

from moe_gemm.variants.peer.torch import VARIANTS

__all__ = ["VARIANTS"]
