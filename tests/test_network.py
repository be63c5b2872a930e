"""ICI/DCN channels against timings worked out by hand.

Toy chip: one-way link 1e9 B/s (1e6 B = 1000 us), 1 us per hop; DCN 1e8 B/s per chip, 10 us.
"""

import dataclasses

import pytest
import simpy

from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip
from tpusim.network.links import DCN_AXIS, Network, channel_name, ici_path
from tpusim.slice.topology import build_slice

US = 1e-6


def toy():
    return dataclasses.replace(load_chip("v5p"), name="toy", ici_link_bytes_per_s=1e9, ici_hop_latency_ns=1000.0,
                               dcn_bytes_per_s=1e8, dcn_latency_ns=10_000.0, collective_overhead_ns=0.0)


def ring8(**kw):
    return build_slice("3d:8x1x1", chip=toy(), wrap=(True, False, False), **kw)


def finish_times(slice_, flows, chunk=100_000):
    env = simpy.Environment()
    net = Network(env, slice_, chunk)
    ends = []

    def watch(proc, i):
        yield proc
        ends.append((i, env.now / US))

    for i, (a, b, n) in enumerate(flows):
        env.process(watch(net.send(a, b, n), i))
    env.run()
    return [t for _, t in sorted(ends)], net


def test_one_hop_is_latency_plus_bytes_over_bandwidth():
    # 1e6 B at 1e9 B/s = 1000 us, plus 1 us of propagation
    (t,), _ = finish_times(ring8(), [((0, 0, 0), (1, 0, 0), 1e6)])
    assert t == pytest.approx(1001)


@pytest.mark.parametrize("chunk", [50_000, 300_000, 1_000_000, 4 * 2**20])
def test_cut_through_multi_hop_time_does_not_depend_on_chunk_size(chunk):
    # 3 hops (0 -> 3): 3 x 1 us + 1000 us, whatever the chunk (store-and-forward would add
    # 2 x chunk/W of pipeline fill)
    (t,), _ = finish_times(ring8(), [((0, 0, 0), (3, 0, 0), 1e6)], chunk)
    assert t == pytest.approx(1003)


def test_route_takes_the_wraparound_when_shorter():
    # 0 -> 7 on a wrapped ring of 8 is one hop backwards over the wrap link
    assert len(ici_path(ring8(), (0, 0, 0), (7, 0, 0))) == 1
    (t,), _ = finish_times(ring8(), [((0, 0, 0), (7, 0, 0), 1e6)])
    assert t == pytest.approx(1001)


def test_two_flows_on_one_channel_share_it_chunk_by_chunk():
    # Both 0->1, 1e6 B each, chunks of 1e5 B (100 us): they alternate, so the first ends after
    # 19 chunk slots (1900 us) + 1 us, the second after 20 slots (2000 us) + 1 us.
    ends, net = finish_times(ring8(), [((0, 0, 0), (1, 0, 0), 1e6)] * 2)
    assert ends == pytest.approx([1901, 2001])
    stats = net.link_stats(2001 * US)
    assert stats.channels[0].busy_s == pytest.approx(2000 * US)
    assert stats.channels[0].bytes == pytest.approx(2e6)
    assert stats.max_utilisation == pytest.approx(2000 / 2001)


def test_the_two_directions_of_a_link_do_not_contend():
    ends, net = finish_times(ring8(), [((0, 0, 0), (1, 0, 0), 1e6), ((1, 0, 0), (0, 0, 0), 1e6)])
    assert ends == pytest.approx([1001, 1001])
    assert len(net.link_stats(1e-3).channels) == 2


def test_a_flow_through_a_busy_channel_waits_only_there():
    # A: 0->2 (channels 0+, 1+), B: 1->2 (channel 1+) start together. Chunks 1e5 B.
    # B holds 1+ from 0; A's first chunk reaches 1+ at 1 us and queues; they alternate on 1+,
    # which carries 2e6 B, ending at 2000 us (+1 us latency); A's last chunk is the last.
    ends, _ = finish_times(ring8(), [((0, 0, 0), (2, 0, 0), 1e6), ((1, 0, 0), (2, 0, 0), 1e6)])
    assert max(ends) == pytest.approx(2001, abs=1)
    assert min(ends) < max(ends)


def test_dcn_transfer_is_egress_then_ingress_at_the_dcn_rate():
    # 1e6 B at 1e8 B/s = 10 000 us, plus 10 us DCN latency
    s = ring8(slices=2)
    env = simpy.Environment()
    net = Network(env, s, 100_000)
    proc = net.send((0, 0, 0), (0, 0, 0), 1e6, src_slice=0, dst_slice=1)
    env.run()
    assert proc.triggered and env.now / US == pytest.approx(10_010)
    names = sorted(channel_name(c.key) for c in net.link_stats(env.now).channels)
    assert names == ["s0 (0,0,0) dcn-out", "s1 (0,0,0) dcn-in"]
    assert all(c.key[2] == DCN_AXIS for c in net.link_stats(env.now).channels)


def test_link_stats_are_per_directed_channel_busiest_first():
    ends, net = finish_times(ring8(), [((0, 0, 0), (2, 0, 0), 1e6), ((5, 0, 0), (4, 0, 0), 5e5)])
    stats = net.link_stats(max(ends) * US)
    assert [c.name for c in stats.channels] == ["s0 (0,0,0) x+", "s0 (1,0,0) x+", "s0 (5,0,0) x-"]
    assert stats.total_bytes == pytest.approx(2.5e6)
    assert stats.to_dict()["channels_used"] == 3


def test_bad_chunk_size_is_a_clear_error():
    with pytest.raises(TpusimError, match="chunk size"):
        Network(simpy.Environment(), ring8(), 0)


def test_a_held_job_is_realized_before_any_other_flow_starts():
    # the fast-forward hook (tpusim.network.collectives.fastforward uses it): a job held on an idle
    # network is told to turn into a real simulation before anyone else's flow starts
    env = simpy.Environment()
    net = Network(env, ring8(), 100_000)
    seen = []

    class Job:
        def realize(self):
            seen.append((env.now, net.active_flows, net.flows_started))

    assert net.idle
    net.hold(Job())
    assert not net.idle

    def later():
        yield env.timeout(5 * US)
        yield net.send((0, 0, 0), (1, 0, 0), 1e6)

    env.process(later())
    env.run()
    assert seen == [(pytest.approx(5 * US), 0, 0)]   # called once, before the flow started
    assert net.idle and net.flows_started == 1 and net.active_flows == 0
