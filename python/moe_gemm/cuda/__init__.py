"""The GPU plumbing: which GPU is here, device buffers and the harness stream, NVRTC compilation with
a cache keyed on every included file, the ptxas and SASS reports, launching, CUDA graphs, TMA
tensor maps, shared-memory matrix descriptors and their interpreter, event timing, and the
Variant protocol every kernel and peer implements. cuda-python is imported lazily, so the modules
that need no GPU (descriptors, tensor-map rules, compile reports) work on any machine."""
