"""The home page's progression: every measured step, each beside the peer of its own run."""

from __future__ import annotations

from moe_gemm.measure.results import recorded
from moe_gemm.model.workloads import SEED, SEED_WORKLOADS
from moe_gemm.site.progression import PEERS, STEPS, progression


def test_every_measured_step_at_every_seed_workload():
    bars = progression()
    assert {(b.step, b.workload) for b in bars} == {(step, w) for step, _ in STEPS for w in SEED_WORKLOADS}


def test_each_bar_stands_beside_the_peer_of_its_own_run():
    for bar in progression():
        records = recorded(bar.chapter)["records"]
        peers = [r["useful_tflops"] for r in records if r["variant"] in PEERS and bar.workload.matches(r)]
        assert bar.peer_tflops == max(peers), bar
        assert any(r["variant"] == bar.variant and r["useful_tflops"] == bar.tflops for r in records), bar


def test_the_home_pages_claims():
    """'k3 then passes the peer' at the seed shape, and k5 stays ahead of it there too."""
    bars = {(b.step, b.workload): b for b in progression()}
    for step in ("k3", "k5"):
        assert bars[(step, SEED)].tflops > bars[(step, SEED)].peer_tflops, step
    assert bars[("k2", SEED)].tflops < bars[("k2", SEED)].peer_tflops
