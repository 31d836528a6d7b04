"""Peer heal's per-step work (issue 55, bench item 17): the random states packed at every optimizer step are read
faster where nothing changed, and a payload the same as the last goes over the wire as a header alone. Checked
against the full reading a checkpoint makes (ckptstate.rng_state: numpy.random.get_state, random.getstate), after
any sequence of draws, and against what arrives at the other end of a real connection."""
from __future__ import annotations

import random
import socket
import threading
import time

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp.runtime import ckptstate, peerheal, peerstate, rngraw
from clusterddp.runtime.peerlink import Link

# Draws that change (or leave) the states in every way a script can: NumPy's Gaussian cache filled and taken (a
# Gaussian from the cache draws no word of the twister), a reseed to where it was, a set_state that caches one.
OPS = {
    "nothing": lambda: None,
    "numpy uniform": lambda: numpy.random.rand(3),
    "numpy one gaussian": lambda: numpy.random.standard_normal(),
    "numpy gaussians": lambda: numpy.random.randn(3),
    "numpy reseed": lambda: numpy.random.seed(7),
    "numpy cached gaussian set": lambda: numpy.random.set_state(numpy.random.get_state()[:3] + (1, 0.25)),
    "python": lambda: random.random(),
    "python reseed": lambda: random.seed(7),
    "python gauss": lambda: random.gauss(0, 1),
    "torch": lambda: torch.rand(2),
    # another twister put under NumPy's global functions: its memory is elsewhere (rngraw.NumpyRaw follows it)
    "numpy new bit generator": lambda: numpy.random.set_bit_generator(numpy.random.MT19937(5)),
}


@pytest.fixture(autouse=True)
def states_kept():
    saved = (random.getstate(), numpy.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(saved[0])
    numpy.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=12))
def test_the_packed_states_are_the_full_reading_after_any_draws(ops):
    for op in ["nothing", *ops]:
        OPS[op]()
        assert peerheal.unpack_rng(peerheal.pack_rng()) == ckptstate.rng_state(), op


def test_the_gaussian_numpy_cached_is_seen_taken():
    """The one change the twister's memory does not show: its cached Gaussian taken."""
    numpy.random.seed(3)
    numpy.random.standard_normal()  # two words drawn, one Gaussian cached
    cached = peerheal.unpack_rng(peerheal.pack_rng())["numpy"]
    numpy.random.standard_normal()  # the cached one: no word drawn
    taken = peerheal.unpack_rng(peerheal.pack_rng())["numpy"]
    assert cached[1:3] == taken[1:3] and (cached[3], taken[3]) == (1, 0), (cached[2:], taken[2:])
    assert taken == ckptstate.rng_state()["numpy"]


def test_the_states_are_read_as_memory_here_and_by_the_getters_where_a_layout_does_not_check_out(monkeypatch):
    """rngraw: on this interpreter and NumPy the layouts check out (else each step pays the getters' ~40 us); a
    reader whose check failed leaves pack_rng to the getters, with the same result."""
    assert rngraw.PythonRaw().ok and rngraw.NumpyRaw(numpy).ok
    numpy.random.standard_normal()
    random.gauss(0, 1)
    failed = [rngraw.PythonRaw(), rngraw.NumpyRaw(numpy)]
    for reader in failed:
        reader.ok = False
    monkeypatch.setattr(peerstate, "_RAW", failed)
    monkeypatch.setattr(peerstate, "_LAST", {})
    assert peerheal.unpack_rng(peerheal.pack_rng()) == ckptstate.rng_state()
    monkeypatch.setattr(peerstate, "_RAW", [])
    monkeypatch.setattr(peerstate, "_LAST", {})
    assert peerheal.unpack_rng(peerheal.pack_rng()) == ckptstate.rng_state()
    assert [r.ok for r in peerstate._RAW[:2]] == [True, True]


def test_getters_wrapped_by_another_library_are_used_and_never_read_past(monkeypatch):
    """A getter bound to something else (a wrapper, a replay tool's stand-in): no memory is read, the getters are."""
    real_np, real_py = numpy.random.get_state, random.getstate
    monkeypatch.setattr(numpy.random, "get_state", lambda *a, **k: real_np(*a, **k))
    monkeypatch.setattr(random, "getstate", lambda: real_py())
    readers = [rngraw.PythonRaw(), rngraw.NumpyRaw(numpy)]
    assert [r.ok for r in readers] == [False, False]
    monkeypatch.setattr(peerstate, "_RAW", readers)
    monkeypatch.setattr(peerstate, "_LAST", {})
    numpy.random.standard_normal()
    assert peerheal.unpack_rng(peerheal.pack_rng()) == ckptstate.rng_state()


def test_unchanged_states_are_the_same_bytes():
    first = peerheal.pack_rng()
    assert peerheal.pack_rng() is first
    torch.rand(1)
    assert peerheal.pack_rng() != first


def ring(n=2, timeout=30.0, late=0.0):
    """``n`` ranks' links over a real store and real TCP on this machine: each rank sends to the next (its buddy)
    and receives from the one before (its source); the last arrives ``late`` seconds after the others."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    made = {}

    def make(rank):  # (a client each: one client's wait holds its connection)
        client = TCPStore("127.0.0.1", store.port, 1, False)
        time.sleep(late if rank == n - 1 else 0)
        try:
            made[rank] = Link(client, "test", rank, (rank + 1) % n, (rank - 1) % n, "127.0.0.1", n, timeout=timeout)
        except Exception as exc:
            made[rank] = exc

    threads = [threading.Thread(target=make, args=(r,), name=f"rank {r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(made) == set(range(n)), made
    return [made[r] for r in range(n)]


def links():
    """Two ranks' links: rank 0 sends to rank 1, and back."""
    zero, one = ring()
    return zero, one


def test_a_rank_that_arrives_late_is_waited_for_and_its_link_is_made():
    """The wait for the source's connection counts from the source's arrival: a rank that loads its checkpoint
    slowly (after the collective before the links) is not a failed link."""
    made = ring(3, timeout=1.0, late=3.0)  # (rank 0 meets its buddy, rank 1, at once; its source, rank 2, is late)
    assert all(isinstance(link, Link) for link in made), made
    for link in made:
        link.close()


def test_a_link_that_cannot_be_made_is_made_by_no_rank_and_says_why(monkeypatch):
    """Rank 1 publishes an address its source cannot reach (here a name that does not resolve; on a cluster a
    wrong interface or a firewall): every rank is told at once, rank 1 too, which had stopped waiting for its source
    within a second or two, not the minute it would wait (peer heal then goes off, and the job goes on: a link made
    by one rank only would send to a buddy that never reads)."""
    from clusterddp.runtime import peerlink

    real = peerlink._own_address
    monkeypatch.setattr(peerlink, "_own_address", lambda master: "nowhere.invalid"
                        if threading.current_thread().name == "rank 1" else real(master))
    began = time.monotonic()
    zero, one = links()
    assert isinstance(zero, peerlink.LinkDown) and isinstance(one, peerlink.LinkDown), (zero, one)
    assert str(zero) == str(one) and str(one).startswith("rank 0's link to rank 1 (its buddy)"), str(one)
    assert time.monotonic() - began < 15


def test_a_node_whose_name_is_loopback_to_itself_publishes_its_interface(monkeypatch):
    """Debian's /etc/hosts maps a node's own name to 127.0.1.1: on the master's node the route to MASTER_ADDR is
    loopback, which its buddies cannot reach. The interface GLOO_SOCKET_IFNAME names (else one up, not loopback)
    is published instead; a master that is loopback by name (the local backend's emulated nodes) keeps loopback."""
    from clusterddp.runtime import peerlink

    interfaces = [name for _, name in socket.if_nameindex() if name != "lo"]
    if not interfaces:
        pytest.skip("this machine has no interface but loopback")
    monkeypatch.setattr(peerlink, "_route", lambda master: "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", interfaces[0])
    assert not peerlink._own_address("node1").startswith("127.")
    assert peerlink._own_address("127.0.0.1") == peerlink._own_address("localhost") == "127.0.0.1"
    monkeypatch.setattr(peerlink, "_route", lambda master: "10.1.2.3")
    assert peerlink._own_address("node1") == "10.1.2.3"


def test_a_payload_sent_again_travels_as_a_header_and_arrives_whole():
    sender, receiver = links()
    wire = []
    real = sender.out

    class Counting:
        def sendall(self, data):
            wire.append(len(data))
            real.sendall(data)

    sender.out = Counting()
    a, b = b"a" * 10000, b"b" * 9000
    for step, payload in enumerate([a, a, b, b, a], start=1):
        sender.send(step, payload)
        receiver.drain(wait_for=step, seconds=5)
        assert receiver.frames[step] == payload, step
    assert wire == [12 + 10000, 12, 12 + 9000, 12, 12 + 10000], wire
    assert set(receiver.frames) == {4, 5}  # the last two kept
    sender.out = real
    sender.close()
    receiver.drain(seconds=1)
    assert receiver.closed
    receiver.close()


def test_a_repeat_before_any_payload_is_not_ours_and_nothing_more_is_read():
    sender, receiver = links()
    sender.out.sendall(peerlink_frame(0xFFFFFFFF, 1))
    receiver.drain(wait_for=1, seconds=1)
    assert receiver.closed and receiver.frames == {}
    sender.close()
    receiver.close()


def peerlink_frame(size: int, step: int) -> bytes:
    import struct

    return struct.pack("<IQ", size, step)



# A GradScaler's steps: a finite step (its growth tracker counts), an overflow (its scale backs off, the tracker
# resets), and enough finite steps to grow the scale (growth_interval 3 below).
def _scaler_step(scaler, model, opt, overflow: bool) -> None:
    loss = model(torch.ones(1, 2)).sum() * (float("inf") if overflow else 1.0)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10))
def test_a_grad_scaler_s_kept_state_is_its_state_dict_then_and_reads_nothing_from_its_device(overflows):
    """Issue 55: peer heal copies a GradScaler's state at every step's end; its state_dict() reads the scale and the
    growth tracker with .item() (a GPU synchronisation a step). The copy is taken on the device and read when used:
    it must then be what state_dict() gave at the moment it was taken, whatever the steps after (they change the
    scaler in place), and taking it must call no .item()."""
    from clusterddp.runtime import peerstate

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)
    taken = []
    for overflow in overflows:
        _scaler_step(scaler, model, opt, overflow)
        reads: list = []
        item = torch.Tensor.item
        torch.Tensor.item = lambda self, reads=reads, item=item: reads.append(1) or item(self)  # type: ignore
        try:
            states = peerstate.snapshot({"scaler": scaler})
        finally:
            torch.Tensor.item = item  # type: ignore[method-assign]
        assert reads == [] and isinstance(states["scaler"], peerstate.ScalerState)
        taken.append((states, scaler.state_dict()))
    for states, then in taken:
        assert peerstate.plain(states) == {"scaler": then}
        assert peerstate.digest(states) == peerstate.digest({"scaler": then})
    last_states, last = taken[-1]
    assert peerstate.changed(last_states, {"scaler": last}) == []
    assert len(taken) < 2 or peerstate.changed(taken[0][0], last_states) == (
        [] if taken[0][1] == last else ["scaler"])


def test_a_scaler_before_its_first_step_or_disabled_or_of_its_own_is_read_by_its_state_dict():
    """Where there is nothing on the device to copy (before the first scale(), disabled) or the state_dict() is the
    script's own (a subclass's), the state is state_dict()'s, copied."""
    from clusterddp.runtime import peerstate

    class Mine(torch.amp.GradScaler):
        def state_dict(self):
            return dict(super().state_dict(), mine=True)

    fresh = torch.amp.GradScaler("cpu", init_scale=8.0)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    own = Mine("cpu", init_scale=8.0)
    model = torch.nn.Linear(2, 1)
    _scaler_step(own, model, torch.optim.SGD(model.parameters(), lr=0.1), False)
    states = peerstate.snapshot({"fresh": fresh, "disabled": disabled, "own": own})
    assert states == {"fresh": fresh.state_dict(), "disabled": {}, "own": own.state_dict()}
    assert states["own"]["mine"] is True and not any(isinstance(v, peerstate.ScalerState) for v in states.values())


def test_a_scaler_whose_reads_are_its_own_is_read_by_them():
    """A subclass that replaces how the scale is read (get_scale, the growth tracker's getter), or a state_dict set
    on the instance, is read by state_dict(): a copy of torch's fields might not be what it returns."""
    from clusterddp.runtime import peerstate

    class Scaled(torch.amp.GradScaler):
        def get_scale(self):
            return 2 * super().get_scale()

    model = torch.nn.Linear(2, 1)
    scaled, patched = Scaled("cpu", init_scale=8.0), torch.amp.GradScaler("cpu", init_scale=8.0)
    for scaler in (scaled, patched):
        _scaler_step(scaler, model, torch.optim.SGD(model.parameters(), lr=0.1), False)
    patched.state_dict = lambda: {"scale": -1.0}  # type: ignore[method-assign]
    states = peerstate.snapshot({"scaled": scaled, "patched": patched})
    assert states == {"scaled": scaled.state_dict(), "patched": {"scale": -1.0}}
    assert states["scaled"]["scale"] == 16.0
