"""What the Hopper steps (k3 of chapter 04, k5, k6; k4 loads its operands the same way) share on the
host, one module per side of the C++ headers they include: :mod:`.config` as kernels/wgmma_config.cuh
(the K step, the boxes, the ring's alignment, the block's shared-memory budget, the target) and
:mod:`.maps` as kernels/tma_pipeline.cuh (the TMA tensor maps, the input rules they impose, the
descriptor plans the kernels take by value). Not a kernel family: no variants live here.
"""
