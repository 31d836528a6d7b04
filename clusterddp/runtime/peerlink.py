"""Peer heal's wire (issue 55): each rank's random states go to its buddy on the next node at every step, over a
TCP connection of their own, so that a lost node's ranks' states outlive it. A send is one syscall of ~10 KB into
the kernel (no thread of ours, no collective); the receiver drains what arrived at its next step, and once more, for
up to 2 s, when it keeps its state after a loss (what a lost source sent before it died is still readable).

The connections are made once per attempt through the job's rendezvous store: each rank listens on a port of its
own, publishes it with a token drawn for this attempt, and its source connects and says that token first; a
connection that does not is closed unread. What arrives is data (peerheal.unpack_rng), never code."""
from __future__ import annotations

import os
import re
import socket
import struct
import time
from typing import Any, Callable, Dict, Optional

_FRAME = struct.Struct("<IQ")  # payload length, step
_LIMIT = 1 << 16
_READ = 1 << 16
_SAME = 0xFFFFFFFF  # a frame's length that says: the same payload as the last (of its kind)
_VALUES = 1 << 63   # a frame's step with this bit: it holds the rank's per_rank= values (JSON), not random states


def _own_address(master: str) -> str:
    """The address of this node that reaches the job's master (the interface its buddies reach it by). Where that
    is a loopback address and the master is not one by its name (a node whose /etc/hosts maps its own name to
    127.0.1.1, Debian's default, on the master's node): the interface GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME
    names, else the first one up that is not loopback."""
    found = _route(master)
    if not found.startswith("127.") or master == "localhost" or re.fullmatch(r"127(\.\d+){3}|::1", master):
        return found
    return _interface_address() or found


def _route(master: str) -> str:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, 9))  # (UDP: nothing is sent)
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def _interface_address() -> Optional[str]:
    import fcntl

    names = [name for _, name in socket.if_nameindex()]
    wanted = [w.strip() for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
              for w in os.environ.get(var, "").split(",") if w.strip() and not w.startswith("^")]
    ordered = [n for w in wanted for n in names if (n == w[1:] if w.startswith("=") else n.startswith(w))] + \
        [n for n in names if n != "lo"]  # (gloo's names are exact; NCCL's prefixes, or exact after "=")
    for name in ordered:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFFLAGS: up; SIOCGIFADDR: its IPv4 address
                request = struct.pack("256s", name[:15].encode())
                if not struct.unpack_from("H", fcntl.ioctl(s.fileno(), 0x8913, request), 16)[0] & 1:
                    continue
                got = fcntl.ioctl(s.fileno(), 0x8915, request)
            except OSError:
                continue
        address = socket.inet_ntoa(got[20:24])
        if not address.startswith("127."):
            return address
    return None


class LostPeer(RuntimeError):
    """The buddy's connection broke: a lost peer, as torch's distributed errors say of a collective."""


class _GaveUp(Exception):
    """Another rank's link failed: this one stops waiting for its source."""


class LinkDown(RuntimeError):
    """Some rank's link could not be made: no rank keeps (every rank is told, so that none sends to a buddy that
    does not read)."""


class Link:
    """This rank's connection to its buddy (sending) and from its source (receiving)."""

    def __init__(self, store: Any, prefix: str, rank: int, buddy: int, source: int, master: str, world: int,
                 timeout: float = 60.0) -> None:
        """Made on every rank at once (load_latest), or on none: LinkDown says why (a rank that could not reach its
        buddy tells the others through the store, and they stop waiting for it)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        out: Optional[socket.socket] = None
        inc: Optional[socket.socket] = None
        try:
            listener.bind(("0.0.0.0", 0))
            listener.listen(4)
            listener.settimeout(1.0)
            token = os.urandom(16).hex()
            store.set(f"{prefix}/{rank}", f"{_own_address(master)} {listener.getsockname()[1]} {token}")
            store.wait([f"{prefix}/{buddy}"])
            host, port, theirs = store.get(f"{prefix}/{buddy}").decode().split()
            out = socket.create_connection((host, int(port)), timeout=min(timeout, 30.0))
            out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            out.sendall(theirs.encode() + struct.pack("<I", rank))
            inc = self._accept(listener, token, source, timeout, lambda: store.check([f"{prefix}/{source}"]),
                               lambda: int(store.add(f"{prefix}/failed", 0)) > 0)
        except _GaveUp:
            pass
        except Exception as exc:  # (refused, unreachable, a name that does not resolve, timed out, the store's error)
            store.set(f"{prefix}/why", f"rank {rank}'s link to rank {buddy} (its buddy) or from rank {source} could "
                                       f"not be made ({type(exc).__name__}: {exc})")
            store.add(f"{prefix}/failed", 1)
            if not store.check([f"{prefix}/{rank}"]):  # (its source waits for it: a word it cannot use ends the wait)
                store.set(f"{prefix}/{rank}", "-")
        finally:
            listener.close()
        if int(store.add(f"{prefix}/in", 1)) == world:
            store.set(f"{prefix}/all", "")
        store.wait([f"{prefix}/all"])
        if int(store.add(f"{prefix}/failed", 0)) or out is None or inc is None:
            for conn in (out, inc):
                if conn is not None:
                    conn.close()
            raise LinkDown(store.get(f"{prefix}/why").decode())
        self.out, self.inc = out, inc
        self.pending = b""
        self.frames: Dict[int, bytes] = {}  # the source's random states by step (the last two)
        self.values: Dict[int, bytes] = {}  # its per_rank= values by step (the last two), where the script has them
        self.sent: Dict[int, bytes] = {}    # the last payload sent, and received, by kind (0 or _VALUES)
        self.last: Dict[int, bytes] = {}
        self.closed = False

    @staticmethod
    def _accept(listener: socket.socket, token: str, source: int, timeout: float, arrived: Callable[[], bool],
                failed: Callable[[], bool]) -> socket.socket:
        """The source's connection, at most ``timeout`` seconds after the source published its address (a rank that
        loads its checkpoint slowly is waited for); early where another rank's link failed."""
        expected = token.encode() + struct.pack("<I", source)
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:  # (each second: another rank's link failed, or the time is up)
                if failed():
                    raise _GaveUp() from None
                if not arrived():
                    deadline = time.monotonic() + timeout
                elif time.monotonic() > deadline:
                    raise
                continue
            conn.settimeout(10)
            got = b""
            try:
                while len(got) < len(expected):
                    chunk = conn.recv(len(expected) - len(got))
                    if not chunk:
                        break
                    got += chunk
            except OSError:
                pass
            if got == expected:
                conn.setblocking(False)
                return conn
            conn.close()  # not our source: unread

    def send(self, step: int, payload: bytes, values: bool = False) -> None:
        """The payload of ``step`` (random states, or with ``values`` the per_rank= values); one the same as the last
        of its kind goes as a header alone (random states that no draw changed: most steps without dropout)."""
        kind = _VALUES if values else 0
        if payload == self.sent.get(kind):
            self.out.sendall(_FRAME.pack(_SAME, step | kind))
            return
        self.out.sendall(_FRAME.pack(len(payload), step | kind) + payload)
        self.sent[kind] = payload

    def drain(self, wait_for: Optional[int] = None, seconds: float = 0.0, values: bool = False) -> None:
        """Read what arrived (without waiting, or until the frame of step ``wait_for``, of random states or with
        ``values`` of per_rank= values, is in, the source has closed, or ``seconds`` passed)."""
        deadline = time.monotonic() + seconds
        while not self.closed:
            try:
                chunk = self.inc.recv(_READ)
            except BlockingIOError:
                if wait_for is None or wait_for in (self.values if values else self.frames) or \
                        time.monotonic() > deadline:
                    return
                time.sleep(0.005)
                continue
            except OSError:
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            self.pending += chunk
            self._frames()
            if wait_for is None and len(chunk) < _READ:  # all there was (the rest, if any, is read next step):
                return                                     # one syscall a step, no exception raised

    def _frames(self) -> None:
        while len(self.pending) >= _FRAME.size:
            size, step = _FRAME.unpack_from(self.pending)
            kind, step = step & _VALUES, step & ~_VALUES
            if size == _SAME and kind in self.last:
                payload, size = self.last[kind], 0
            elif size > _LIMIT:
                self.closed = True  # not our frames: nothing more is read
                return
            elif len(self.pending) < _FRAME.size + size:
                return
            else:
                payload = self.last[kind] = self.pending[_FRAME.size:_FRAME.size + size]
            held = self.values if kind else self.frames
            kept = {step: payload, **{k: v for k, v in held.items() if k == step - 1}}
            if kind:
                self.values = kept
            else:
                self.frames = kept
            self.pending = self.pending[_FRAME.size + size:]

    def close(self) -> None:
        for sock in (self.out, self.inc):
            try:
                sock.close()
            except OSError:
                pass


_LOST_PEER = re.compile(r"Connection (closed|reset) by peer|Broken pipe|gloo|NCCL|c10d|[Ss]ocket|timed out")
_CONNECTION_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe|remote process exited|"
                              r"[Ss]ocket (closed|error)")


def lost_peer(exc: BaseException) -> bool:
    """The exception ending this rank is a lost peer's (what a survivor of a lost node meets)."""
    return _failure(exc, "DistError", _LOST_PEER)


def connection_lost(exc: BaseException) -> bool:
    """Narrower than lost_peer: a collective's connection to another rank went (what ends a lost node's survivors),
    not a data loader's timeout or a collective's misuse."""
    return _failure(exc, "DistNetworkError", _CONNECTION_LOST)


def _failure(exc: BaseException, torch_kind: str, said: "re.Pattern[str]") -> bool:
    """exc is torch.distributed's ``torch_kind`` (where this torch has it) or ours, or a RuntimeError saying so."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, torch_kind, None), LostPeer) if k is not None)
    return isinstance(exc, kinds) or (isinstance(exc, RuntimeError) and bool(said.search(str(exc)[:2000])))
