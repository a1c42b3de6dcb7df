"""The simulated network: hosts, links that fail, TCP connections, and the selector that waits on them.

What the control plane relies on, and so what this models (and what the dev cluster showed):

* a link cut (a host cut off, a partition between groups of hosts, one way only) delivers
  nothing while it is down; TCP keeps what was sent and delivers it, in order, once the link
  heals (no connection breaks during a cut of minutes);
* ``connect`` to a host that does not answer (cut off, powered off) gets no answer: it times out;
  to a live host where nothing listens, a refusal (ECONNREFUSED) one round trip later;
* a frozen process's kernel still accepts connections on its listening sockets and buffers what
  arrives; nobody reads it;
* a process that dies on a live host has its sockets closed by its kernel: the peer reads EOF
  (a FIN) once it can hear that host; data that reaches a closed socket is answered by a reset;
* a host that dies says nothing: its connections fall silent.

Sockets offer exactly the calls :mod:`hpc_llm.job.wire`, the fleet and the agent make.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
from collections import deque
from typing import Any

from hpc_llm.sim.hub import Hub, Wait

#: a simulated process (hpc_llm.sim.world.Proc; not imported: the world imports this module)
Proc = Any

#: one-way latency of every link (seconds)
LATENCY_S = 0.0005
#: a SYN retransmits this often while the host does not answer
SYN_RETRY_S = 1.0

_fds = iter(range(1000, 1 << 30))
#: every socket-like object by its file descriptor number (the selector finds them so)
FDS: dict[int, Any] = {}


#: where every simulated node's slurmd listens (hpc_llm/sim/slurm.py says so in `scontrol show node`)
SLURMD_PORT = 6818


class Host:
    def __init__(self, name: str, addr: str) -> None:
        self.name = name
        self.addr = addr
        #: powered on (a killed node is not: no kernel answers for it)
        self.up = True
        self.listeners: dict[int, Listener] = {}
        self._ports = iter(range(40000, 65000))

    def port(self) -> int:
        port = next(self._ports)
        while port in self.listeners:
            port = next(self._ports)
        return port

    def __repr__(self) -> str:
        return self.name


class Net:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.hosts: dict[str, Host] = {}
        self._by_addr: dict[str, Host] = {}
        #: hosts cut off from every other
        self.cut: set[str] = set()
        #: (from, to): what ``from`` sends ``to`` is dropped
        self.blocked: set[tuple[str, str]] = set()
        #: connections with data held back by a link that is down
        self._held: list[Endpoint] = []

    def add_host(self, name: str) -> Host:
        host = Host(name, f"10.0.{len(self.hosts) // 250}.{len(self.hosts) % 250 + 1}")
        self.hosts[name] = host
        self._by_addr[host.addr] = host
        self._by_addr[name] = host
        return host

    def resolve(self, name: str) -> Host | None:
        if name in ("127.0.0.1", "localhost", "0.0.0.0"):
            return None
        return self._by_addr.get(name)

    def reaches(self, a: Host, b: Host) -> bool:
        """Whether what ``a`` sends reaches ``b`` now."""
        if not (a.up and b.up):
            return False
        if a is b:
            return True
        return a.name not in self.cut and b.name not in self.cut and (a.name, b.name) not in self.blocked

    def changed(self) -> None:
        """A link came back: what was held on it goes out now."""
        held, self._held = self._held, []
        for ep in held:
            ep.flush_held()

    # -- sockets
    def listener(self, proc: Proc, backlog: int) -> Listener:
        host = proc.host
        lst = Listener(self, proc, host, host.port(), backlog)
        host.listeners[lst.port] = lst
        proc.socks.add(lst)
        return lst

    def connect(self, proc: Proc, host: str, port: int, timeout_s: float) -> Endpoint:
        """A blocking connect from the current task of ``proc``."""
        hub = self.hub
        dst = self.resolve(host) if host not in ("127.0.0.1", "localhost") else proc.host
        if dst is None:
            raise OSError(errno.EHOSTUNREACH, f"no route to host {host}")
        deadline = hub.now + timeout_s
        src = proc.host
        while True:
            if self.reaches(src, dst) and self.reaches(dst, src):
                proc.world.pause(2 * LATENCY_S)
                if not (self.reaches(src, dst) and self.reaches(dst, src)):
                    continue
                lst = dst.listeners.get(port)
                if (lst is None or lst.closed) and port == SLURMD_PORT:
                    # the host's slurmd (no process of its own here): a host that is up accepts
                    # on its port, as its kernel does even with slurmd frozen (allocation.slurmd_answers)
                    ep = Endpoint(self, proc, proc.host, None)
                    proc.socks.add(ep)
                    return ep
                if lst is None or lst.closed:
                    raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
                return lst.enqueue(proc)
            left = deadline - hub.now
            if left <= 0:
                raise TimeoutError("timed out")
            proc.world.pause(min(SYN_RETRY_S, left))

    def connect_nowait(self, proc: Proc, host: str, port: int) -> tuple[Endpoint, int]:
        """A non-blocking connect: the socket turns writable once it is known how it went
        (its SO_ERROR then says)."""
        ep = Endpoint(self, proc, proc.host, None)
        ep.connecting = True
        proc.socks.add(ep)
        dst = self.resolve(host)
        if dst is None:
            ep.connecting = False
            return ep, errno.EHOSTUNREACH
        self.hub.at(self.hub.now + 2 * LATENCY_S, self._syn, ep, dst, port)
        return ep, errno.EINPROGRESS

    def _syn(self, ep: Endpoint, dst: Host, port: int) -> None:
        if ep.closed or not ep.connecting:
            return
        src = ep.host
        if self.reaches(src, dst) and self.reaches(dst, src):
            lst = dst.listeners.get(port)
            if lst is None or lst.closed:
                ep.error = errno.ECONNREFUSED
                ep.connecting = False
            else:
                server = lst.enqueue_endpoint(ep)
                ep.peer = server
                ep.connecting = False
            ep.notify()
        else:
            self.hub.at(self.hub.now + SYN_RETRY_S, self._syn, ep, dst, port)


class Sock:
    """What the selector needs of any of our socket-like objects."""

    closed = False

    def __init__(self) -> None:
        self.fd = next(_fds)
        self.waiters: list[Wait] = []
        FDS[self.fd] = self

    def fileno(self) -> int:
        return self.fd

    def ready(self) -> int:
        return 0

    def notify(self) -> None:
        waiters, self.waiters = self.waiters, []
        hub = None
        for w in waiters:
            if hub is None:
                hub = w.task.proc.world.hub
            hub.fire(w, True)

    def setsockopt(self, *args: Any) -> None:
        pass

    def setblocking(self, flag: bool) -> None:
        self.blocking = flag

    def settimeout(self, value: float | None) -> None:
        pass


class Listener(Sock):
    def __init__(self, net: Net, proc: Proc, host: Host, port: int, backlog: int) -> None:
        super().__init__()
        self.net, self.proc, self.host, self.port = net, proc, host, port
        self.backlog: deque[Endpoint] = deque()

    def getsockname(self) -> tuple[str, int]:
        return (self.host.addr, self.port)

    def enqueue(self, client_proc: Proc) -> Endpoint:
        client = Endpoint(self.net, client_proc, client_proc.host, None)
        client_proc.socks.add(client)
        self.enqueue_endpoint(client)
        return client

    def enqueue_endpoint(self, client: Endpoint) -> Endpoint:
        server = Endpoint(self.net, self.proc, self.host, client)
        client.peer = server
        self.backlog.append(server)
        self.notify()
        return server

    def accept(self) -> tuple[Endpoint, tuple[str, int]]:
        if self.closed:
            raise OSError(errno.EBADF, "closed")
        if not self.backlog:
            raise BlockingIOError(errno.EAGAIN, "no connection")
        ep = self.backlog.popleft()
        self.proc.socks.add(ep)
        peer = ep.peer
        return ep, ((peer.host.addr if peer else "?"), 0)

    def ready(self) -> int:
        return selectors.EVENT_READ if self.backlog else 0

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.host.listeners.get(self.port) is self:
            del self.host.listeners[self.port]
        while self.backlog:
            self.backlog.popleft().reset_peer()
        self.notify()


_FIN = object()
_RST = object()


class Endpoint(Sock):
    """One end of a TCP connection."""

    def __init__(self, net: Net, proc: Proc, host: Host, peer: Endpoint | None) -> None:
        super().__init__()
        self.net, self.proc, self.host, self.peer = net, proc, host, peer
        self.inbox = bytearray()
        self.eof = False
        self.reset = False
        self.connecting = False
        self.error = 0
        self.blocking = True
        #: what was sent while the link was down, in order
        self.held: deque[Any] = deque()

    # -- the application's side
    def getsockname(self) -> tuple[str, int]:
        return (self.host.addr, 0)

    def getsockopt(self, level: int, opt: int) -> int:
        err, self.error = self.error, 0
        return err

    def send(self, data: bytes | bytearray) -> int:
        if self.closed:
            raise OSError(errno.EBADF, "closed")
        if self.reset:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        self._transmit(bytes(data))
        return len(data)

    def sendall(self, data: bytes) -> None:
        self.send(data)

    def recv(self, n: int) -> bytes:
        while True:
            if self.closed:
                raise OSError(errno.EBADF, "closed")
            if self.inbox:
                out = bytes(self.inbox[:n])
                del self.inbox[:n]
                return out
            if self.reset:
                raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
            if self.eof:
                return b""
            if not self.blocking:
                raise BlockingIOError(errno.EAGAIN, "would block")
            world = self.proc.world
            w = world.hub.waiter()
            self.waiters.append(w)
            world.hub.suspend(w, None)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.proc.socks.discard(self)
        if self.peer is not None and self.host.up:
            self._transmit(_FIN)
        self.notify()

    def vanish(self) -> None:
        """Its host died: no FIN, nothing."""
        self.closed = True
        self.held.clear()

    def ready(self) -> int:
        mask = 0
        if self.inbox or self.eof or self.reset or self.closed:
            mask |= selectors.EVENT_READ
        if not self.connecting:
            mask |= selectors.EVENT_WRITE
        return mask

    # -- the kernel's side
    def _transmit(self, item: Any) -> None:
        if self.peer is None:
            return
        if self.held or not self.net.reaches(self.host, self.peer.host):
            self.held.append(item)
            if self not in self.net._held:
                self.net._held.append(self)
            return
        self.net.hub.at(self.net.hub.now + LATENCY_S, self.peer._arrive, item)

    def flush_held(self) -> None:
        if self.closed and not self.host.up:
            self.held.clear()
            return
        while self.held and self.peer is not None and self.net.reaches(self.host, self.peer.host):
            self.net.hub.at(self.net.hub.now + LATENCY_S, self.peer._arrive, self.held.popleft())
        if self.held and self not in self.net._held:
            self.net._held.append(self)

    def _arrive(self, item: Any) -> None:
        if not self.host.up:
            return
        if item is _RST:
            self.reset = True
        elif self.closed:
            if item is not _FIN and self.peer is not None:
                self.peer_reset()
            return
        elif item is _FIN:
            self.eof = True
        else:
            self.inbox += item
        self.notify()

    def peer_reset(self) -> None:
        """Data reached this closed socket: its kernel answers with a reset."""
        peer = self.peer
        if peer is not None and self.net.reaches(self.host, peer.host):
            self.net.hub.at(self.net.hub.now + LATENCY_S, peer._arrive, _RST)

    def reset_peer(self) -> None:
        self.closed = True
        self.peer_reset()


class SignalPipe(Sock):
    """What select waits on for a process's signals (:func:`hpc_llm.world.signal_wakeup`)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = 0

    def poke(self) -> None:
        self.pending += 1
        self.notify()

    def drain(self) -> None:
        self.pending = 0

    def ready(self) -> int:
        return selectors.EVENT_READ if self.pending else 0


class Selector(selectors.BaseSelector):
    """``selectors.DefaultSelector`` over our sockets: :meth:`select` blocks the calling task."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._objs: dict[int, Any] = {}

    def _fd(self, fileobj: Any) -> int:
        return fileobj if isinstance(fileobj, int) else fileobj.fileno()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = self._fd(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} is already registered")
        obj = FDS[fd]
        if getattr(obj, "closed", False) and not isinstance(obj, SignalPipe):
            raise ValueError("I/O operation on closed socket")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        self._objs[fd] = obj
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = self._fd(fileobj)
        self._objs.pop(fd, None)
        return self._keys.pop(fd)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = self._fd(fileobj)
        old = self._keys[fd]
        key = selectors.SelectorKey(old.fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def get_map(self) -> Any:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()
        self._objs.clear()

    def _ready(self) -> list[tuple[selectors.SelectorKey, int]]:
        out = []
        for fd, key in self._keys.items():
            mask = self._objs[fd].ready() & key.events
            if mask:
                out.append((key, mask))
        return out

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._ready()
        if ready or (timeout is not None and timeout <= 0):
            return ready
        world = self.proc.world
        hub = world.hub
        w = hub.waiter()
        for obj in self._objs.values():
            obj.waiters.append(w)
        for pipe in world.wakeups_of(self.proc):
            pipe.waiters.append(w)
        hub.suspend(w, timeout)
        for obj in (*self._objs.values(), *world.wakeups_of(self.proc)):
            with contextlib.suppress(ValueError):
                obj.waiters.remove(w)
        return self._ready()
