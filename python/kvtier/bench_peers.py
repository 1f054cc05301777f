"""kvtier beside the other SGLang HiCache storage backends, through SGLang's
own storage interface: ``python -m kvtier.bench_peers [--repeat N] [--smoke]``.

Every backend gets the same host pool (SGLang's MHATokenToKVPoolHost,
page_first, unpinned host memory), the same pages (random bytes) and the
calls SGLang's HiCacheController makes for them: its zero-copy page
functions (``batch_set_v1`` / ``batch_get_v1``) for the backends that have
them, its generic page functions (``get_data_page`` + ``batch_set``,
``batch_get`` + ``set_from_flat_data_page``) for ``HiCacheFile``, which has
no v1 calls; and ``batch_exists``. The backends:

  kvtier-dir      kvtier.sglang.KvtierStorage over a dir: store
  hicache-file    SGLang's HiCacheFile, in the same parent directory
  kvtier-redis    KvtierStorage over a redis-server the benchmark starts
  kvtier-cluster  KvtierStorage over a 3-master Redis Cluster it starts
  mooncake-remote SGLang's MooncakeStore over Mooncake Store (the CPU wheel
                  mooncake-transfer-engine-non-cuda): its mooncake_master,
                  HTTP metadata server and a mooncake_client holding the
                  store's memory started here; SGLang's client contributes
                  no memory, so pages cross loopback TCP to that process
  mooncake        the same with SGLang's client holding the memory itself
                  (SGLang's default: each rank mounts a segment): a page
                  stored by this process is copied within it

Each cell (page size x pages per batch) writes fresh keys (``--budget``
MiB, at least ``--min-iters`` batches), reads them back into other pages of
the pool, checks every byte, then empties the store. Cells and backends
alternate, ``--repeat`` times; the JSON gives, per row, the median and the
range over the repeats of GB/s and of the p50/p99 batch latency, and the
ratios of kvtier's medians to each like-for-like peer's (above 1: kvtier is
ahead) with the range of the two sides' ratios repeat by repeat ("clear":
false where that range holds 1). Every key's bytes are its own (fresh
random pages before each batch), checked by digest after the get. Neither
directory store syncs its files: sets measure writes into the page cache and
gets read files written moments before (both sides alike); only kvtier
checks a checksum on every object. A cell starts on an empty store (kvtier's
directory store makes its fan-out folders at its open, outside the timer). The
JSON records the work directory's filesystem, the load average at the start
and SGLang's SGLANG_HICACHE* settings (HiCacheFile reads them over its
config). With an odd --repeat the backends' order (swapped every repeat)
runs one way once more. Servers listen on 127.0.0.1 on free ports and are stopped at the
end, also on failure. Run it against a release build
(``KVTIER_LIB=build-rel/libkvtier.so``): a debug build checks every page."""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

# Mooncake reads these when its client starts: TCP on loopback (no RDMA
# device here), and its glog at warnings and above
os.environ.setdefault("MC_FORCE_TCP", "true")
os.environ.setdefault("GLOG_minloglevel", "1")

KIB = 1024
MIB = 1024 * KIB
PAGE_TOKENS = 16
LAYERS = 8
HEAD_DIM = 128  # fp16: a page is 2 (K, V) x 16 tokens x 8 layers x heads x 128 x 2 bytes = heads x 64 KiB
BACKENDS = ("kvtier-dir", "hicache-file", "kvtier-redis", "kvtier-cluster", "mooncake-remote", "mooncake")
# kvtier's backend -> the peers it is measured against like for like: a local
# directory; a store in other processes reached over loopback TCP. In-process
# Mooncake (the pages copied within SGLang's own process) is reported beside.
LIKE = {"kvtier-dir": ("hicache-file",), "kvtier-redis": ("mooncake-remote",),
        "kvtier-cluster": ("mooncake-remote",)}
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


# ---- servers: started on free loopback ports, always stopped ------------------------


def _die_with_parent() -> None:
    os.setpgid(0, 0)  # a stop takes the server's children too
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _free_port(bus: bool = False) -> int:
    """A free 127.0.0.1 port (bus: and port + 10000 free too, Redis Cluster's bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    pass
    raise RuntimeError("no free port pair on 127.0.0.1")


class _Proc:
    """A server process: its own process group, killed with this one, logged to a file."""

    def __init__(self, argv: Sequence[str], log: str, env: Optional[dict] = None) -> None:
        self.argv, self.log = list(argv), log
        with open(log, "wb") as f:
            self.p = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent, env=env)

    def wait_port(self, port: int, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.p.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{os.path.basename(self.argv[0])} did not listen on 127.0.0.1:{port}: "
                           f"{self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-1500:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()


def _resp(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """One Redis command in RESP; the first bytes of the reply."""
    msg = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(msg)
        return s.recv(65536)


class Redis:
    """redis-server nodes on 127.0.0.1 (persisting nothing): one standalone, or
    ``masters`` cluster nodes joined by redis-cli --cluster create."""

    def __init__(self, workdir: str, masters: int = 0) -> None:
        self.procs: List[_Proc] = []
        self.ports: List[int] = []
        try:
            for i in range(max(1, masters)):
                port = _free_port(bus=masters > 0)
                d = os.path.join(workdir, f"redis-{'c' if masters else 's'}{i}")
                os.makedirs(d)
                argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", d, "--daemonize", "no", "--protected-mode", "no"]
                if masters:
                    argv += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(d, "nodes.conf"),
                             "--cluster-node-timeout", "2000"]
                proc = _Proc(argv, os.path.join(d, "redis.log"))
                self.procs.append(proc)
                proc.wait_port(port)
                self.ports.append(port)
            if masters:
                out = subprocess.run([REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
                                      "--cluster-replicas", "0", "--cluster-yes"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
                if out.returncode:
                    raise RuntimeError(f"redis-cli --cluster create: {out.stdout.decode()[-1500:]}")
                end = time.monotonic() + 20
                while not all(b"cluster_state:ok" in _resp(p, "CLUSTER", "INFO") for p in self.ports):
                    if time.monotonic() > end:
                        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        self.url = (f"redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) if masters
                    else f"redis://127.0.0.1:{self.ports[0]}")

    def flush(self) -> None:
        for p in self.ports:
            if not _resp(p, "FLUSHALL").startswith(b"+OK"):
                raise RuntimeError(f"FLUSHALL on 127.0.0.1:{p} failed")

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


class Mooncake:
    """Mooncake Store's master and HTTP metadata server on 127.0.0.1, and with
    segment_bytes a mooncake_client process holding that much of the store."""

    def __init__(self, workdir: str, segment_bytes: int = 0) -> None:
        import mooncake
        self.procs: List[_Proc] = []
        workdir = tempfile.mkdtemp(prefix="mooncake-", dir=workdir)
        try:
            self.meta_port, self.rpc_port, self.metrics_port = _free_port(), _free_port(), _free_port()
            meta = _Proc([sys.executable, "-c", "from mooncake.http_metadata_server import main; main()",
                          "--host", "127.0.0.1", "--port", str(self.meta_port), "--log-level", "WARNING"],
                         os.path.join(workdir, "mooncake-metadata.log"))
            self.procs.append(meta)
            master = _Proc([os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master"),
                            f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
                            f"--metrics_port={self.metrics_port}", "--metrics_host=127.0.0.1",
                            "--enable_metric_reporting=false", "--logtostderr"],
                           os.path.join(workdir, "mooncake-master.log"))
            self.procs.append(master)
            meta.wait_port(self.meta_port)
            master.wait_port(self.rpc_port)
            if segment_bytes:
                port = _free_port()
                client = _Proc([os.path.join(os.path.dirname(mooncake.__file__), "mooncake_client"),
                                "--host=127.0.0.1", f"--port={port}", f"--global_segment_size={segment_bytes}",
                                f"--master_server_address=127.0.0.1:{self.rpc_port}",
                                f"--metadata_server=http://127.0.0.1:{self.meta_port}/metadata", "--protocol=tcp",
                                "--logtostderr"], os.path.join(workdir, "mooncake-client.log"))
                self.procs.append(client)
                client.wait_port(port)
                self._wait_mounted(segment_bytes)
        except BaseException:
            self.stop()
            raise

    def _wait_mounted(self, segment_bytes: int, timeout: float = 20.0) -> None:
        """Until the master counts the client's segment (its metrics page)."""
        import requests
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                text = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=1).text
                for line in text.splitlines():
                    if line.startswith("segment_total_capacity_bytes{") and float(line.split()[-1]) >= segment_bytes:
                        return
            time.sleep(0.05)
        raise RuntimeError(f"mooncake_client's segment did not mount: {self.procs[-1].tail()}")

    def extra_config(self, segment_bytes: int) -> dict:
        return {"master_server_address": f"127.0.0.1:{self.rpc_port}",
                "metadata_server": f"http://127.0.0.1:{self.meta_port}/metadata",
                "global_segment_size": segment_bytes, "protocol": "tcp", "device_name": "",
                "local_hostname": "127.0.0.1", "master_metrics_port": self.metrics_port}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


# ---- SGLang's side: the host pool, the storage config, the controller's calls ------------


def make_pool(page_bytes: int, pages: int):
    """SGLang's MHA host pool (page_first, unpinned) of at least `pages` pages
    of page_bytes, over a CPU device pool of the same geometry."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    heads, rem = divmod(page_bytes, 2 * PAGE_TOKENS * LAYERS * HEAD_DIM * 2)
    if rem or heads < 1:
        raise ValueError(f"page of {page_bytes} bytes: expected a multiple of 64 KiB")
    dev = MHATokenToKVPool(pages * PAGE_TOKENS, PAGE_TOKENS, torch.float16, heads, HEAD_DIM, LAYERS, "cpu", False,
                           start_layer=0, end_layer=LAYERS - 1)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 1.0, 0, PAGE_TOKENS, "page_first",
                                pin_memory=False, device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                end_layer=dev.end_layer)
    del dev  # only the host pool's memory is read and written
    if host.page_num < pages or sum(host.get_page_buffer_meta(torch.arange(PAGE_TOKENS))[1]) != page_bytes:
        raise RuntimeError(f"SGLang's host pool: {host.page_num} pages, expected {pages} of {page_bytes} bytes")
    return host


def storage_config(extra: dict):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="kvtier-bench-peers", extra_config=extra)


class Backend:
    """One backend on one pool, driven through the controller's page functions.
    reset() empties the store: open() again on a fresh directory, or the
    store's own flush."""

    def __init__(self, name: str, pool: Any, zero_copy: bool, open_storage: Callable[[], Any],
                 empty: Optional[Callable[[Any], None]] = None) -> None:
        from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation
        self.name, self.pool, self.open_storage, self.empty = name, pool, open_storage, empty
        self.storage = open_storage()
        # the controller's own methods, with the few attributes they read
        self.ctl = SimpleNamespace(storage_backend=self.storage, storage_host_pool=pool, page_size=pool.page_size)
        op = PrefetchOperation("bench", [])
        c = HiCacheController
        if zero_copy:
            self.set = lambda keys, idx: c._page_set_zero_copy(self.ctl, keys, idx)
            self.get = lambda keys, idx: c._page_get_zero_copy(self.ctl, op, keys, idx)
        else:
            self.set = lambda keys, idx: c._generic_page_set(self.ctl, keys, idx)
            self.get = lambda keys, idx: c._generic_page_get(self.ctl, op, keys, idx)

    def reset(self) -> None:
        if self.empty is not None:
            self.empty(self.storage)
            return
        self.close()
        self.storage = self.ctl.storage_backend = self.open_storage()

    def close(self) -> None:
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()
        if self.name.startswith("mooncake"):  # its client leaves the store before the master stops
            self.storage.store.close()


class Peers:
    """The servers, and backends over a pool."""

    def __init__(self, names: Sequence[str], workdir: str, segment_bytes: int) -> None:
        self.names, self.workdir, self.segment_bytes = list(names), workdir, segment_bytes
        self.stack = contextlib.ExitStack()
        self.redis = self.cluster = self.mooncake = self.mooncake_remote = None
        self.n = 0
        try:
            if "kvtier-redis" in names:
                self.redis = Redis(workdir)
                self.stack.callback(self.redis.stop)
            if "kvtier-cluster" in names:
                self.cluster = Redis(workdir, masters=3)
                self.stack.callback(self.cluster.stop)
            if "mooncake" in names:
                self.mooncake = Mooncake(workdir)
                self.stack.callback(self.mooncake.stop)
            if "mooncake-remote" in names:  # a master of its own: no page of it lands in this process
                self.mooncake_remote = Mooncake(workdir, segment_bytes)
                self.stack.callback(self.mooncake_remote.stop)
        except BaseException:
            self.stack.close()
            raise

    def close(self) -> None:
        self.stack.close()

    def _fresh_dir(self, name: str, old: List[str]) -> str:
        """A new directory for a file store (the previous one removed)."""
        if old:
            shutil.rmtree(old.pop(), ignore_errors=True)
        self.n += 1
        old.append(os.path.join(self.workdir, f"{name}-{self.n}"))
        return old[0]

    def open(self, name: str, pool: Any) -> Backend:
        d: List[str] = []
        if name.startswith("kvtier-"):
            from .sglang import KvtierStorage

            def kvtier(url: str) -> Any:
                st = KvtierStorage(storage_config({"l3": url, "interface_v1": 1}))
                st.register_mem_pool_host(pool)
                if not st.zero_copy:
                    st.close()
                    raise RuntimeError(f"{name}: the pool goes through staging ({st.staging_reason})")
                return st
            if name == "kvtier-dir":
                return Backend(name, pool, True, lambda: kvtier("dir:" + self._fresh_dir(name, d)))
            srv = self.redis if name == "kvtier-redis" else self.cluster
            return Backend(name, pool, True, lambda: kvtier(srv.url), lambda st: srv.flush())
        if name == "hicache-file":
            from sglang.srt.mem_cache.hicache_storage import HiCacheFile

            def hicache_file() -> Any:
                st = HiCacheFile(storage_config({"file_storage_path": self._fresh_dir(name, d)}))
                st.register_mem_pool_host(pool)
                return st
            return Backend(name, pool, False, hicache_file)
        if name in ("mooncake", "mooncake-remote"):
            from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
            mc, seg = (self.mooncake, self.segment_bytes) if name == "mooncake" else (self.mooncake_remote, 0)

            def mooncake() -> Any:
                st = MooncakeStore(storage_config(mc.extra_config(seg)), pool)
                st.register_mem_pool_host(pool)
                return st
            def empty(st: Any) -> None:
                # forced: a read leases its objects for 10 s, and SGLang's clear() (remove_all) spares them
                if st.store.remove_all(True) < 0:
                    raise RuntimeError(f"{name}: remove_all failed")
            return Backend(name, pool, True, mooncake, empty)
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")


# ---- measuring ----------------------------------------------------------------------


def _keys(tag: str, n: int) -> List[str]:
    """SGLang-like keys: the hex SHA-256 of a chain."""
    out, h = [], hashlib.sha256(tag.encode()).hexdigest()
    for _ in range(n):
        h = hashlib.sha256(h.encode()).hexdigest()
        out.append(h)
    return out


def _fs_type(path: str) -> str:
    """The type of the filesystem path is on (the longest mount point over
    it in /proc/mounts), or "unknown"."""
    best, kind = "", "unknown"
    path = os.path.realpath(path)
    with contextlib.suppress(OSError):
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    return kind


def _note(msg: str) -> None:
    print(f"bench_peers: {msg}", file=sys.stderr, flush=True)


def _pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (with few samples, p99 is the largest)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def _summary(xs: Sequence[float]) -> Dict[str, Any]:
    return {"median": statistics.median(xs), "range": [min(xs), max(xs)]}


def run_cell(be: Backend, page_bytes: int, batch: int, iters: int, tag: str) -> Dict[str, Any]:
    """Writes iters batches of fresh keys from pages [0, batch), each batch's
    pages filled with new random bytes first, so that every key's object is
    its own; reads each batch back into pages [batch, 2 batch) and checks
    every page against its key's digest (outside the clock: a page served
    for any other key is caught); then empties the store."""
    import torch
    ps = be.pool.page_size
    kv = be.pool.kv_buffer
    src = torch.arange(batch * ps, dtype=torch.int64)
    dst = torch.arange(batch * ps, 2 * batch * ps, dtype=torch.int64)
    rnd = list(kv[:, :batch * ps].shape)
    rnd[-1] *= kv.element_size()

    def digests(first: int) -> List[bytes]:  # of the batch's pages from page `first` on, as bytes
        pages = kv[:, first * ps:(first + batch) * ps].contiguous().view(torch.uint8)
        return [hashlib.blake2b(pages[:, j * ps:(j + 1) * ps].contiguous().numpy().tobytes(), digest_size=16).digest()
                for j in range(batch)]
    chains = [_keys(f"{tag}/{i}", batch) for i in range(iters)]
    clock = time.perf_counter
    set_s, get_s, want = [], [], []
    os.sync()  # no backend pays for the writeback of the one before (the file stores share a disk)
    for keys in chains:
        kv[:, :batch * ps] = torch.randint(0, 256, rnd, dtype=torch.uint8).view(kv.dtype)
        want.append(digests(0))
        t0 = clock()
        ok = be.set(keys, src)
        set_s.append(clock() - t0)
        if not ok:
            raise RuntimeError(f"{be.name}: a set of {batch} pages of {page_bytes} bytes failed")
    for i, keys in enumerate(chains):
        kv[:, batch * ps:2 * batch * ps].zero_()
        t0 = clock()
        n = be.get(keys, dst)
        get_s.append(clock() - t0)
        if n != batch:
            raise RuntimeError(f"{be.name}: a get served {n} of {batch} pages of {page_bytes} bytes")
        if digests(batch) != want[i]:  # bytes compared as bytes: random fp16 holds NaNs
            raise RuntimeError(f"{be.name}: batch {i}: pages read back differ from the pages written")
    be.reset()
    nbytes = batch * page_bytes
    out = {}
    for op, ts in (("batch_set_v1", set_s), ("batch_get_v1", get_s)):
        out[op] = {"gbps": nbytes * len(ts) / sum(ts) / 1e9, "p50_ms": _pct(ts, 50) * 1e3,
                   "p99_ms": _pct(ts, 99) * 1e3, "batches": len(ts)}
    return out


def run_exists(be: Backend, iters: int, tag: str) -> Dict[str, Any]:
    """batch_exists on a 128-key chain: all stored, the first half, none."""
    import torch
    n = 128
    if be.pool.page_num < n:
        raise RuntimeError("the exists test needs a pool of 128 pages")
    keys = _keys(f"{tag}/stored", n)
    if not be.set(keys, torch.arange(0, n * be.pool.page_size, dtype=torch.int64)):
        raise RuntimeError(f"{be.name}: storing the exists chain failed")
    absent = _keys(f"{tag}/absent", n)
    chains = {"all": (keys, n), "half": (keys[:n // 2] + absent[:n // 2], n // 2), "none": (absent, 0)}
    out = {}
    clock = time.perf_counter
    for what, (chain, want) in chains.items():
        ts = []
        for _ in range(iters):
            t0 = clock()
            got = be.storage.batch_exists(chain)
            ts.append(clock() - t0)
            if got != want:
                raise RuntimeError(f"{be.name}: batch_exists ({what}) = {got}, expected {want}")
        out[what] = {"p50_us": _pct(ts, 50) * 1e6, "p99_us": _pct(ts, 99) * 1e6, "calls": iters}
    be.reset()
    return out


def _size(s: str) -> int:
    s = s.strip().upper()
    for suf, mul in (("KIB", KIB), ("MIB", MIB), ("K", KIB), ("M", MIB)):
        if s.endswith(suf):
            return int(s[:-len(suf)]) * mul
    return int(s)


def _label(b: int) -> str:
    return f"{b // MIB}MiB" if b % MIB == 0 else f"{b // KIB}KiB"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def table(out: Dict[str, Any]) -> str:
    """The JSON as Markdown: per row, each backend's median GB/s [range] and
    p50 / p99 ms; then batch_exists; then the GB/s ratios [range]."""
    names = out["backends"]
    by = {(r["backend"], r["op"], r["page"], r["batch"]): r for r in out["rows"]}
    keys = sorted({(r["op"], r["page"], r["batch"]) for r in out["rows"]},
                  key=lambda k: (k[0] != "batch_set_v1", _size(k[1]), k[2]))
    lines = ["| op | page | batch | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for op, page, b in keys:
        cells = []
        for n in names:
            r = by.get((n, op, page, b))
            cells.append("" if r is None else
                         f"{_fmt(r['gbps']['median'])} GB/s [{_fmt(r['gbps']['range'][0])}-"
                         f"{_fmt(r['gbps']['range'][1])}]; {_fmt(r['p50_ms']['median'])} / "
                         f"{_fmt(r['p99_ms']['median'])} ms")
        lines.append(f"| {op} | {page} | {b} | " + " | ".join(cells) + " |")
    ex = out["batch_exists_128"]
    lines += ["", "| batch_exists, 128 keys | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for what in ("all", "half", "none"):
        lines.append(f"| {what} | " + " | ".join(
            "" if n not in ex else f"{_fmt(ex[n][what]['p50_us']['median'])} / {_fmt(ex[n][what]['p99_us']['median'])} us"
            for n in names) + " |")
    lines += ["", "| kvtier vs peer | op | page | batch | GB/s ratio [range over repeats] |", "|---|---|---|---|---|"]
    for q in out["ratios"]:
        if "gbps_ratio" in q:
            g = q["gbps_ratio"]
            lines.append(f"| {q['kvtier']} / {q['peer']} | {q['op']} | {q['page']} | {q['batch']} | "
                         f"{g['median']:.2f} [{g['range'][0]:.2f}-{g['range'][1]:.2f}]"
                         f"{'' if g['clear'] else ', no clear difference'} |")
    return "\n".join(lines)


def _paired(num: Sequence[float], den: Sequence[float]) -> Dict[str, Any]:
    """The ratio of two sides' medians, and the range of their ratios repeat
    by repeat (the two sides ran side by side in each): a range holding 1,
    or of one repeat, is no clear difference."""
    each = [x / y for x, y in zip(num, den)]
    return {"median": statistics.median(num) / statistics.median(den), "range": [min(each), max(each)],
            "clear": len(each) > 1 and not min(each) <= 1.0 <= max(each)}


def aggregate(samples: Dict[tuple, List[Dict[str, Any]]], exists: Dict[str, List[Dict[str, Any]]]):
    """The JSON's rows (each backend, op, page and batch: median and range
    over the repeats), batch_exists_128 and ratios (kvtier over its
    like-for-like peer, from the cells of the same repeats): samples maps
    (backend, page bytes, batch) to run_cell's result per repeat, exists a
    backend to run_exists's per repeat."""
    rows, cells_of = [], {}
    for (name, pb, b), cells in samples.items():
        for op in ("batch_set_v1", "batch_get_v1"):
            cells_of[(name, op, _label(pb), b)] = [c[op] for c in cells]
            rows.append({"backend": name, "op": op, "page": _label(pb), "batch": b,
                         "batches_per_repeat": cells[0][op]["batches"],
                         "gbps": _summary([c[op]["gbps"] for c in cells]),
                         "p50_ms": _summary([c[op]["p50_ms"] for c in cells]),
                         "p99_ms": _summary([c[op]["p99_ms"] for c in cells])})
    ratios = []
    for (name, op, page, b), mine in cells_of.items():
        for peer in LIKE.get(name, ()):
            theirs = cells_of.get((peer, op, page, b))
            if theirs is not None:
                ratios.append({"kvtier": name, "peer": peer, "op": op, "page": page, "batch": b,
                               "gbps_ratio": _paired([c["gbps"] for c in mine], [c["gbps"] for c in theirs]),
                               "p50_speedup": _paired([c["p50_ms"] for c in theirs], [c["p50_ms"] for c in mine]),
                               "p99_speedup": _paired([c["p99_ms"] for c in theirs], [c["p99_ms"] for c in mine])})
    ex = {name: {what: {"p50_us": _summary([c[what]["p50_us"] for c in cs]),
                        "p99_us": _summary([c[what]["p99_us"] for c in cs])} for what in ("all", "half", "none")}
          for name, cs in exists.items()}
    for name, peers_of in LIKE.items():
        for peer in peers_of:
            if name in exists and peer in exists:
                for what in ("all", "half", "none"):
                    ratios.append({"kvtier": name, "peer": peer, "op": "batch_exists", "chain": what, "keys": 128,
                                   "p50_speedup": _paired([c[what]["p50_us"] for c in exists[peer]],
                                                          [c[what]["p50_us"] for c in exists[name]]),
                                   "p99_speedup": _paired([c[what]["p99_us"] for c in exists[peer]],
                                                          [c[what]["p99_us"] for c in exists[name]])})
    return rows, ex, ratios


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvtier.bench_peers", description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", default="64K,256K,1M", help="page sizes (multiples of 64K)")
    p.add_argument("--batches", default="1,16,128", help="pages per call")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget", type=int, default=128, help="MiB written per cell and backend (at least --min-iters "
                   "batches)")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=400)
    p.add_argument("--exists-iters", type=int, default=200)
    p.add_argument("--dir", default=None, help="where the dir stores and HiCacheFile write (a fresh directory "
                   "under it; default: the temporary directory)")
    p.add_argument("--smoke", action="store_true", help="a quick check of every backend: 64K pages, batches of 1 "
                   "and 16, 2 batches a cell, one repeat")
    p.add_argument("--table", metavar="JSON", help="print a saved run's JSON as Markdown tables, and nothing else")
    a = p.parse_args(argv)
    if a.table:
        with open(a.table) as f:
            print(table(json.load(f)))
        return 0
    if a.smoke:
        a.pages, a.batches, a.repeat, a.min_iters, a.max_iters, a.exists_iters = "64K", "1,16", 1, 2, 2, 3
    pages = [_size(x) for x in a.pages.split(",")]
    batches = [int(x) for x in a.batches.split(",")]
    names = [x.strip() for x in a.backends.split(",") if x.strip()]
    for n in names:
        if n not in BACKENDS:
            p.error(f"unknown backend {n!r} (choose from {', '.join(BACKENDS)})")
    if a.repeat < 1 or a.min_iters < 1 or a.max_iters < a.min_iters or min(batches) < 1 or a.exists_iters < 1:
        p.error("--repeat, --min-iters, --exists-iters and the batches must be at least 1 (max-iters >= min-iters)")

    import torch
    from . import _lib
    from ._sglang_cpu import torchvision_for_sglang
    torchvision_for_sglang()
    torch.manual_seed(0)
    iters = {(pb, b): max(a.min_iters, min(a.max_iters, (a.budget * MIB) // (pb * b))) for pb in pages for b in batches}
    most = max(pb * b * n for (pb, b), n in iters.items())
    # Mooncake's segment: a cell's keys, or the exists chain, twice over (it evicts from 90 % full)
    segment = 2 * max(most, 128 * pages[0]) + 128 * MIB
    work = tempfile.mkdtemp(prefix="kvtier-bench-peers-", dir=a.dir)
    setting = {"workdir_fs": _fs_type(work), "load_average_at_start": os.getloadavg()[0],
               # SGLang's HiCacheFile reads these over its config (another directory, a metadata cache)
               "sglang_env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG_HICACHE")}}
    samples: Dict[tuple, List[dict]] = {}
    exists: Dict[str, List[dict]] = {}
    t_start = time.monotonic()
    peers = None
    try:
        peers = Peers(names, work, segment)
        _note(f"servers up ({time.monotonic() - t_start:.1f} s)")
        for pb in pages:
            pool = make_pool(pb, 2 * max(max(batches), 128 if pb == pages[0] else 0))
            flat = pool.kv_buffer.view(-1).view(torch.uint8)
            flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8))
            opened = []
            for n in names:
                t0 = time.monotonic()
                opened.append(peers.open(n, pool))
                _note(f"{n} opened on {_label(pb)} pages ({time.monotonic() - t0:.2f} s)")
            try:
                for r in range(a.repeat):
                    order = opened if r % 2 == 0 else opened[::-1]  # neither side always goes first
                    for b in batches:
                        for be in order:
                            t0 = time.monotonic()
                            cell = run_cell(be, pb, b, iters[(pb, b)], f"{be.name}/{pb}/{b}/{r}")
                            _note(f"{be.name} {_label(pb)} x {b} repeat {r}: {time.monotonic() - t0:.2f} s")
                            samples.setdefault((be.name, pb, b), []).append(cell)
                    if pb == pages[0]:
                        for be in order:
                            exists.setdefault(be.name, []).append(run_exists(be, a.exists_iters, f"{be.name}/x/{r}"))
            finally:
                t0 = time.monotonic()
                for be in opened:
                    be.close()
                _note(f"backends closed ({time.monotonic() - t0:.2f} s)")
            del pool, flat
    finally:
        if peers is not None:
            peers.close()
        shutil.rmtree(work, ignore_errors=True)

    rows, ex, ratios = aggregate(samples, exists)
    versions = {}
    for mod, dist in (("sglang", "sglang"), ("mooncake", "mooncake-transfer-engine-non-cuda"), ("torch", "torch")):
        with contextlib.suppress(Exception):
            from importlib.metadata import version
            versions[mod] = version(dist)
    out = {"bench": "sglang_storage_peers", "machine": platform.machine(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "kvtier_lib": _lib.LIBRARY,
           "versions": versions, "pool": {"class": "MHATokenToKVPoolHost", "layout": "page_first",
                                          "page_tokens": PAGE_TOKENS, "layers": LAYERS, "head_dim": HEAD_DIM,
                                          "dtype": "float16", "pin_memory": False},
           "backends": names, "repeat": a.repeat, "budget_mib": a.budget, "smoke": a.smoke, **setting,
           "wall_s": round(time.monotonic() - t_start, 1),
           "rows": rows, "batch_exists_128": ex, "ratios": ratios}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
