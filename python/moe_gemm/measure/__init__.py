"""Checking and timing variants the same way: the check against the reference, the run loop, the
ceilings, results files with provenance, the profiler and sanitizer targets, and the record of
kernels validated on the GPU."""
