"""Fixtures the binding's tests share: real stores on loopback only.

``redis_server``   a standalone /usr/bin/redis-server on a free 127.0.0.1 port,
                   one per session: "redis://127.0.0.1:PORT"
``redis_factory``  a callable starting more servers (a test that kills one),
                   all stopped when the test ends
``dir_store_url``  "dir:/dev/shm/kvtier-pytest-XXXX", removed after the test

Servers persist nothing (save "", appendonly no), work in a temporary
directory, die with the test process (PR_SET_PDEATHSIG) and are stopped at
the end, also when a test fails. Only a missing redis-server skips.

Every test ends within KVTIER_TEST_TIMEOUT seconds (300 unless set), as
libuv's runner bounds each test: a test that hangs fails with a TimeoutError,
and one stuck inside C dumps every thread's stack and ends the run, rather
than holding CI until its own limit."""
from __future__ import annotations

import ctypes
import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the kvtier package

REDIS_SERVER = "/usr/bin/redis-server"
TEST_TIMEOUT = float(os.environ.get("KVTIER_TEST_TIMEOUT", "300"))


_STDERR = os.fdopen(os.dup(2), "w")  # the terminal's, before pytest captures it: the last resort writes here


def _timed_out(signum, frame):
    raise TimeoutError(f"the test ran over {TEST_TIMEOUT:g} s (KVTIER_TEST_TIMEOUT)")


@pytest.fixture(autouse=True)
def _default_timeout():
    # Python code or a wait: the test fails with a TimeoutError where it stands. Stuck in C
    # (the alarm's handler cannot run): 30 s later every thread's stack is dumped and the run ends.
    old = signal.signal(signal.SIGALRM, _timed_out)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    faulthandler.dump_traceback_later(TEST_TIMEOUT + 30, exit=True, file=_STDERR)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port: int, *args: bytes, timeout: float = 2.0) -> bytes:
    """One command in RESP to 127.0.0.1:port; the raw reply's first line(s)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(parts))
        return s.recv(65536)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class RedisServer:
    """A redis-server process on 127.0.0.1, started and answering as itself."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvtier-redis-")
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        try:
            for _ in range(5):  # another process may take the free port first
                if self._start(_free_port()):
                    return
            raise RuntimeError(f"redis-server did not start; its log: {self.log()[-2000:]}")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""

    def _start(self, port: int) -> bool:
        self.port = port
        args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--logfile", "redis.log", "--daemonize", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                # this server, not another process's that took the port first (then ours exits)
                info = redis_command(port, b"INFO", b"server", timeout=0.5)
                if b"process_id:%d\r\n" % self.proc.pid in info:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        self._kill()
        return False

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Stops the server and removes its directory (idempotent)."""
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: bytes) -> bytes:
        return redis_command(self.port, *args)


def _need_redis() -> None:
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip(f"{REDIS_SERVER} is not installed (apt-get install redis-server)")


@pytest.fixture(scope="session")
def redis_server_handle():
    """The session's RedisServer (for tests that talk to it directly)."""
    _need_redis()
    srv = RedisServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def redis_server(redis_server_handle) -> str:
    """"redis://127.0.0.1:PORT" of the session's standalone Redis server."""
    return redis_server_handle.url


@pytest.fixture
def redis_factory() -> Callable[[], RedisServer]:
    """Starts extra servers for one test (stopped, even on failure, after it)."""
    _need_redis()
    started: List[RedisServer] = []

    def start() -> RedisServer:
        srv = RedisServer()
        started.append(srv)
        return srv

    try:
        yield start
    finally:
        for srv in started:
            srv.stop()


@pytest.fixture
def dir_store_url() -> str:
    """A dir store URL under /dev/shm (or the temporary directory), removed after."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="kvtier-pytest-", dir=base)
    try:
        yield f"dir:{path}"
    finally:
        shutil.rmtree(path, ignore_errors=True)
