"""The problem on paper, no GPU needed: routing, the problem and its checks, the flat tile list and
eta, the numpy reference, the edge cases, the occupancy and issue model, the roofline, and the
workloads every chapter measures (the seed's defined once, in :mod:`.workloads`)."""
