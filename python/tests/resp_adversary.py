"""A RESP2 server that answers wrongly on purpose, for the tests of what
kvtier's redis:// and redis-cluster:// stores do facing a broken or hostile
server (test_store_adversary.py). A real Redis is used wherever the
behaviour is Redis's own (conftest.py); it cannot trickle a reply, announce
a 10 GB value or answer GET with an integer, which is what this is for.

    srv = Adversary(hook)        # 127.0.0.1, a free port; srv.port, srv.url
    hook(conn, cmd) -> bytes     # sent as the reply
                   | DEFAULT     # the plain behaviour: a dict-backed SET, GET,
                                 # EXISTS, DEL, EVAL (the exists script), PING,
                                 # AUTH, ASKING, CLUSTER SHARDS (srv.shards_reply)
                   | NOREPLY     # nothing (a silent node)
    conn.send(data, chunk=1, delay=0.05)   # a reply a byte at a time

Every connection is served on its own daemon thread; close() shuts them all.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

DEFAULT = object()
NOREPLY = object()


def bulk(b: Optional[bytes]) -> bytes:
    if b is None:
        return b"$-1\r\n"
    return b"$%d\r\n%s\r\n" % (len(b), b)


def array(items: Sequence[Any]) -> bytes:
    """An array reply: ints as integers, lists as arrays, str/bytes as bulk strings."""
    out = b"*%d\r\n" % len(items)
    for it in items:
        if isinstance(it, int):
            out += b":%d\r\n" % it
        elif isinstance(it, (list, tuple)):
            out += array(it)
        else:
            out += bulk(it.encode() if isinstance(it, str) else it)
    return out


def shards(nodes: Sequence[tuple]) -> bytes:
    """A CLUSTER SHARDS reply: nodes are (slot bounds [a, b, ...], host, port, role, health)."""
    return array([["slots", list(slots), "nodes",
                   [["id", "x" * 40, "port", port, "ip", host, "endpoint", host, "role", role,
                     "replication-offset", 0, "health", health]]]
                  for slots, host, port, role, health in nodes])


class Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def send(self, data: bytes, chunk: Optional[int] = None, delay: float = 0.0) -> None:
        if chunk is None:
            self.sock.sendall(data)
            return
        for i in range(0, len(data), chunk):
            self.sock.sendall(data[i:i + chunk])
            time.sleep(delay)


class Adversary:
    def __init__(self, hook: Optional[Callable[[Conn, List[bytes]], Any]] = None) -> None:
        self.hook = hook or (lambda c, cmd: DEFAULT)
        self.data: Dict[bytes, bytes] = {}
        self.cmds: List[List[bytes]] = []  # every command seen
        self.connections = 0
        self.shards_reply: Optional[bytes] = None
        self._lock = threading.Lock()
        self._socks: List[socket.socket] = []
        self._ls = socket.socket()
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(128)
        self.port = self._ls.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self._ls.accept()
            except OSError:
                return
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._socks.append(s)
            threading.Thread(target=self._serve, args=(Conn(s),), daemon=True).start()

    @staticmethod
    def _command(c: Conn) -> Optional[List[bytes]]:
        """One command off c.buf (an array of bulk strings), None until it is whole."""
        b = c.buf
        i = b.find(b"\r\n")
        if i < 0:
            return None
        n, pos, out = int(b[1:i]), i + 2, []
        for _ in range(n):
            j = b.find(b"\r\n", pos)
            if j < 0:
                return None
            ln = int(b[pos + 1:j])
            if len(b) < j + 4 + ln:
                return None
            out.append(b[j + 2:j + 2 + ln])
            pos = j + 4 + ln
        c.buf = b[pos:]
        return out

    def _serve(self, c: Conn) -> None:
        try:
            while True:
                cmd = self._command(c)
                if cmd is None:
                    got = c.sock.recv(1 << 20)
                    if not got:
                        return
                    c.buf += got
                    continue
                with self._lock:
                    self.cmds.append(cmd)
                r = self.hook(c, cmd)
                if r is DEFAULT:
                    r = self.default(cmd)
                if r is not NOREPLY and r is not None:
                    c.send(r)
        except (OSError, ValueError):
            pass
        finally:
            c.sock.close()

    def default(self, cmd: List[bytes]) -> bytes:
        name = cmd[0].upper()
        if name == b"PING":
            return b"+PONG\r\n"
        if name in (b"AUTH", b"ASKING"):
            return b"+OK\r\n"
        if name == b"SET":
            self.data[cmd[1]] = cmd[2]
            return b"+OK\r\n"
        if name == b"GET":
            return bulk(self.data.get(cmd[1]))
        if name == b"EXISTS":
            return b":%d\r\n" % sum(k in self.data for k in cmd[1:])
        if name == b"DEL":
            return b":%d\r\n" % sum(self.data.pop(k, None) is not None for k in cmd[1:])
        if name == b"EVAL":  # the exists script: the leading keys present
            keys = cmd[3 + int(cmd[2]):]
            return b":%d\r\n" % next((i for i, k in enumerate(keys) if k not in self.data), len(keys))
        if name == b"CLUSTER":
            return self.shards_reply or shards([([0, 16383], "127.0.0.1", self.port, "master", "online")])
        return b"-ERR unknown command '%s'\r\n" % name

    def seen(self, name: bytes) -> int:
        with self._lock:
            return sum(c[0].upper() == name for c in self.cmds)

    def close(self) -> None:
        self._ls.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
