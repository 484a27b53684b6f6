"""Host-side wrappers of the kernels: one package per kernel step, each exposing Variant classes
and holding its own helpers; ``sm90/`` holds what the Hopper steps share, ``peer/`` the peers.

A wrapper validates the problem for its kernel (ValueError naming the constraint, before any
launch), builds the kernel's tile list and launch configuration, and returns a
:class:`~moe_gemm.cuda.variant.Prepared` launch. The kernels themselves live in ``kernels/``.
"""
