"""Checking and timing variants the same way: the check against the reference, the run loop, the
ceilings, results files with provenance (and merged from runs of separate parts), the profiler and
sanitizer targets, the record of kernels validated on the GPU, and chapter 08's measurements of a whole
MoE layer and of the op against its peers (the scoreboard)."""
