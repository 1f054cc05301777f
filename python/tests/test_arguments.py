"""Every argument bound for C is checked before it gets there: ctypes would
otherwise truncate an int (-1 in a uint32_t is 4294967295), cut a string at
its first NUL, or fail with an AttributeError from deep inside. A wrong type
raises TypeError, a value out of range or a NUL ValueError, an index out of
range IndexError, and the message names the argument."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import kvtier

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.fixture(scope="module")
def objs(tmp_path_factory):
    """A one-plane host tier, a transfer engine, a store and a cache to call."""
    d = tmp_path_factory.mktemp("args")
    t = kvtier.Tier.host(4, 1, 64)
    t2 = kvtier.Tier.host(4, 1, 64)
    x = kvtier.Transfer([t, t2])
    s = kvtier.Store(f"dir:{d}/l3", tier=t, model="m", page_tokens=16)
    c = kvtier.Cache(l1_pages=16, l2_pages=0, page_tokens=4)
    yield dict(t=t, x=x, s=s, c=c, url=f"dir:{d}/l3")
    for o in (c, s, x, t2, t):
        o.close()


class _EqualsAll:
    """Equal to everything: `in POLICIES` says yes to it."""
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def store(url, **kw):
    return kvtier.Store(url, model="m", page_tokens=16, layers=1, layer_bytes=64, **kw)


# (id, call, exception, message)
CASES = [
    # the cases
    ("store-url-none", lambda o: kvtier.Store(None), TypeError, r"Store url: expected a str"),
    ("store-url-bytes", lambda o: kvtier.Store(b"dir:/x"), TypeError, r"Store url: expected a str, not bytes"),
    ("transfer-not-tiers", lambda o: kvtier.Transfer([1, 2]), TypeError,
     r"Transfer tiers\[0\]: expected a kvtier.Tier, not int"),
    ("store-page-tokens-negative", lambda o: kvtier.Store(o["url"], model="m", page_tokens=-1, layers=1,
                                                          layer_bytes=64), ValueError,
     r"Store page_tokens: -1 is out of range \(expected 0..2\*\*32-1\)"),
    ("hash-negative", lambda o: o["s"].exists_sync([(-1, 0)]), ValueError, r"key 0: page hash lo: -1 is out of range"),
    ("hash-too-big", lambda o: o["s"].key((2 ** 200, 0)), ValueError, r"page hash lo: \d+ is out of range"),
    ("admit-priority", lambda o: o["c"].admit([1, 2, 3, 4], priority=2 ** 70), ValueError,
     r"Cache.admit priority: \d+ is out of range \(expected -2\*\*31..2\*\*31-1\)"),
    ("plane-addr-plane", lambda o: o["t"].plane_addr(5, 0, 0), IndexError, r"plane 5 is out of range"),
    ("write-page-int", lambda o: o["t"].write_page(0, 64), TypeError, r"write_page data: expected bytes-like .* not int"),
    ("write-page-str", lambda o: o["t"].write_page(0, "x" * 64), TypeError, r"write_page data: .* not str"),
    ("tokens-bytes", lambda o: o["c"].admit(b"abcd"), TypeError, r"tokens: expected int32 token ids .* not bytes"),
    ("tokens-set", lambda o: o["c"].admit({3, 1, 2}), TypeError, r"tokens: expected int32 token ids .* not set"),
    ("tokens-dict", lambda o: o["c"].admit({1: 2}), TypeError, r"tokens: expected int32 token ids .* not dict"),
    ("tokens-bytearray", lambda o: kvtier.page_hashes(bytearray(8), 1), TypeError, r"tokens: .* not bytearray"),
    ("store-url-nul", lambda o: kvtier.Store("dir:/x\x00/etc"), ValueError, r"Store url: .* holds a NUL"),
    ("poll-timeout-huge-int", lambda o: o["x"].poll(timeout=10 ** 400), ValueError,
     r"Transfer.poll timeout: 1000.* is out of range"),
    ("keyed-free-room-huge-int", lambda o: kvtier.KeyedCache(4, free_room=10 ** 400), ValueError,
     r"free_room: 1000.* is out of range"),
    ("cache-policy-bool", lambda o: kvtier.Cache(l1_pages=8, policy=True), TypeError,
     r"policy: expected a name \(.*\), not bool True"),
    ("keyed-policy-not-str", lambda o: kvtier.KeyedCache(4, policy=_EqualsAll()), ValueError, r"policy: .* \(expected one of"),
    # a tier's label: 63 bytes of UTF-8 (C cut a longer one, inside a character too: UnicodeDecodeError, a tier leaked)
    ("tier-name-long", lambda o: kvtier.Tier.host(4, 1, 64, name="é" * 32), ValueError,
     r"Tier.host name: 64 bytes of UTF-8 \(at most 63\)"),
    ("shm-name-no-slash", lambda o: kvtier.Tier.shm("kvtier-x", 4, 1, 64), ValueError,
     r"Tier.shm name: 'kvtier-x' \(expected \"/\" and a name of 1..59 bytes"),
    ("shm-name-inner-slash", lambda o: kvtier.Tier.shm("/a/b", 4, 1, 64), ValueError, r"Tier.shm name: '/a/b'"),
    ("shm-name-long", lambda o: kvtier.Tier.shm("/" + "x" * 60, 4, 1, 64), ValueError, r"Tier.shm name: '/x+'"),
    # the same classes of fault elsewhere
    ("cache-float", lambda o: kvtier.Cache(l1_pages=1.5), TypeError, r"Cache: l1_pages: expected an integer"),
    ("cache-bool-field", lambda o: kvtier.Cache(decision_digest="yes"), TypeError,
     r"Cache: decision_digest: expected True or False"),
    ("cache-u32-wrap", lambda o: kvtier.Cache(page_tokens=2 ** 32 + 16), ValueError,
     r"Cache: page_tokens: .*out of range"),
    ("cache-policy-nul", lambda o: kvtier.Cache(policy="lru\x00x"), ValueError, r"policy: unknown"),
    ("cache-policy-type", lambda o: kvtier.Cache(policy=None), TypeError, r"policy: expected a name"),
    ("admit-ns", lambda o: o["c"].admit([1, 2, 3, 4], ns=-1), ValueError, r"Cache.admit ns: -1 is out of range"),
    ("admit-prefetch-type", lambda o: o["c"].admit([1, 2, 3, 4], prefetch=3), TypeError,
     r"Cache.admit prefetch: expected a kvtier.Prefetch or None"),
    ("page-hashes-ns", lambda o: kvtier.page_hashes(list(range(16)), 4, ns=2 ** 32), ValueError,
     r"page_hashes ns: .*out of range"),
    ("page-hashes-page-tokens", lambda o: kvtier.page_hashes(list(range(16)), 0), ValueError,
     r"page_hashes page_tokens: 0 is out of range"),
    ("tier-pages-wrap", lambda o: kvtier.Tier.host(2 ** 64 + 4, 1, 64), ValueError, r"Tier.host pages: .*out of range"),
    # the library's own limits, named (it said only "invalid argument")
    ("tier-pages-32", lambda o: kvtier.Tier.host(2 ** 32, 1, 64), ValueError, r"Tier.host pages: .*\.\.2\*\*32-1\)"),
    ("tier-layer-bytes-0", lambda o: kvtier.Tier.host(4, 1, 0), ValueError, r"Tier.host layer_bytes: 0 is out of range"),
    ("tier-too-big", lambda o: kvtier.Tier.host(2 ** 31, 2 ** 10, 2 ** 22), ValueError, r"more than 2\*\*62 bytes"),
    ("tier-layers-float", lambda o: kvtier.Tier.host(4, 1.0, 64), TypeError, r"Tier.host layers: expected an integer"),
    ("tier-name-nul", lambda o: kvtier.Tier.host(4, 1, 64, name="a\x00b"), ValueError, r"Tier.host name: .* NUL"),
    ("tier-shm-name-type", lambda o: kvtier.Tier.shm(None, 4, 1, 64), TypeError, r"Tier.shm name: expected a str"),
    ("tier-flag", lambda o: kvtier.Tier.host(4, 1, 64, checksum="no"), TypeError, r"Tier.host checksum: expected True"),
    ("plane-addr-layer", lambda o: o["t"].plane_addr(0, 0, 1), IndexError, r"layer 1 is out of range"),
    ("read-page-negative", lambda o: o["t"].read_page(-1), IndexError, r"page -1 is out of range"),
    ("engine-plane-type", lambda o: kvtier.Tier.engine([(64, 64)], 1, 1), TypeError,
     r"planes\[0\]: expected a kvtier.Plane"),
    ("engine-piece-negative", lambda o: kvtier.Tier.engine([kvtier.tier.Plane(-64, 64, base=4096)], 1, 1), ValueError,
     r"plane 0 piece_bytes: -64 is out of range"),
    ("submit-index", lambda o: o["x"].submit(2, 0, [(0, 0)]), IndexError, r"Transfer.submit src 2 is out of range"),
    ("submit-page-type", lambda o: o["x"].submit(0, 1, [(0, "1")]), TypeError, r"copy 0 dst_page: expected an integer"),
    ("submit-page-wrap", lambda o: o["x"].submit(0, 1, [(0, 2 ** 32)]), ValueError, r"copy 0: pages .* out of range"),
    ("submit-user", lambda o: o["x"].submit(0, 1, [(0, 0)], user=-1), ValueError, r"Transfer.submit user: -1"),
    ("xfer-stats-one-tier", lambda o: o["x"].stats(1, 1), kvtier.InvalidArgument, r"both tier 1: a pair is two tiers"),
    ("transfer-threads", lambda o: kvtier.Transfer([o["t"]], threads=-1), ValueError, r"Transfer threads: -1"),
    ("transfer-tiers-type", lambda o: kvtier.Transfer(o["t"]), TypeError, r"Transfer tiers: expected a list"),
    ("xfer-poll-max", lambda o: o["x"].poll(max=0), ValueError, r"Transfer.poll max: 0 is out of range"),
    ("xfer-poll-timeout", lambda o: o["x"].poll(timeout="1"), TypeError, r"Transfer.poll timeout: expected a number"),
    ("store-tier-type", lambda o: kvtier.Store(o["url"], tier=o["x"]), TypeError,
     r"Store tier: expected a kvtier.Tier"),
    ("store-model-nul", lambda o: kvtier.Store(o["url"], model="m\x00x", page_tokens=16), ValueError,
     r"Store model: .* NUL"),
    ("store-tp", lambda o: store(o["url"], tp=(0, -1)), ValueError, r"Store tp size: -1 is out of range"),
    ("store-tp-type", lambda o: store(o["url"], tp=1), TypeError, r"Store tp: expected \(rank, size\)"),
    ("store-threads", lambda o: store(o["url"], threads=2 ** 32 + 2), ValueError, r"Store threads: .*out of range"),
    ("store-log", lambda o: store(o["url"], log="stderr"), TypeError, r"Store log: expected a callable"),
    ("store-page-wrap", lambda o: o["s"].put([((1, 2), 2 ** 32)]), ValueError, r"key 0: tier page .* out of range"),
    ("store-hash-type", lambda o: o["s"].exists(["abc"]), TypeError, r"key 0: page hash: expected \(lo, hi\)"),
    ("store-hash-float", lambda o: o["s"].key((1.5, 0)), TypeError, r"page hash lo: expected an integer"),
    ("store-keys-str", lambda o: o["s"].exists("abc"), TypeError, r"keys: expected a list"),
    ("store-user", lambda o: o["s"].exists([(1, 2)], user=2 ** 64), ValueError, r"Store.exists user: .*out of range"),
    ("store-poll-max", lambda o: o["s"].poll(max=-1), ValueError, r"Store.poll max: -1"),
    ("pd-receiver-pool", lambda o: kvtier.PdReceiver("pool", 1, 1), TypeError,
     r"PdReceiver pool: expected a kvtier.Tier"),
    ("pd-receiver-token", lambda o: kvtier.PdReceiver(o["t"], 1, -1), ValueError, r"PdReceiver token: -1"),
    ("pd-receiver-port", lambda o: kvtier.PdReceiver(o["t"], 1, 1, data_port=70000), ValueError,
     r"PdReceiver data_port: 70000 is out of range \(expected 0..2\*\*16-1\)"),
    ("pd-receiver-host-nul", lambda o: kvtier.PdReceiver(o["t"], 1, 1, host="127.0.0.1\x00x"), ValueError,
     r"PdReceiver host: .* NUL"),
    ("pd-sender-rank", lambda o: kvtier.PdSender(o["t"], -1, 1, 1, 1, 1), ValueError, r"PdSender rank: -1"),
    ("pd-transport-type", lambda o: kvtier.PdSender(o["t"], 0, 1, 1, 1, 1, transport=1), TypeError,
     r"transport: expected a str"),
    ("cp-name-nul", lambda o: kvtier.CpGroup("a\x00b", 0, 1, 8, 8), ValueError, r"CpGroup name: .* NUL"),
    ("cp-rank", lambda o: kvtier.CpGroup("kvtier-pytest-args", -1, 1, 8, 8), ValueError, r"CpGroup rank: -1"),
]


@pytest.mark.parametrize("call,exc,msg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_raises_naming_it(objs, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(objs)


def test_good_arguments_still_pass(objs):
    """The checks accept what they must: bools and numpy integers as integers,
    the full unsigned ranges, hashes as pairs and as bytes."""
    c, s, t = objs["c"], objs["s"], objs["t"]
    c.admit(np.arange(8, dtype=np.int32), ns=np.uint32(2 ** 32 - 1), priority=-2 ** 31).release()
    c.admit([1, 2, 3, 4], priority=True).release()
    assert s.key((2 ** 64 - 1, 0)) != s.key((0, 0))
    assert s.key(bytes(16)) == s.key((0, 0))
    assert t.plane_addr(0, np.int64(3), 0) == t.plane_addr(0, 0, 0) + 3 * 64
    with kvtier.Cache(l1_pages=np.int64(8), l2_pages=0, page_tokens=4, decision_digest=1) as c2:
        assert c2.config["decision_digest"] is True
    with kvtier.Cache(l1_pages=8, l2_pages=0, page_tokens=4, decision_digest=np.bool_(True)) as c2:
        assert c2.config["decision_digest"] is True  # numpy's bool (numpy.bool from numpy 2) is a bool
    with kvtier.Cache(l1_pages=8, policy=np.int64(1)) as c3, kvtier.Tier.host(2, 2, 64, layout=np.int8(1)) as t3:
        assert c3.config["policy"] == kvtier.POLICIES[1] and t3.geom.layout == 1
    with kvtier.Tier.host(2, 1, 64, name="é" * 31 + "x") as t4:  # 63 bytes: the longest label, whole
        assert t4.name == "é" * 31 + "x"


def test_a_library_that_is_not_libkvtier_is_an_import_error():
    """KVTIER_LIB naming another library: ImportError saying so, at import."""
    env = dict(os.environ, KVTIER_LIB="libc.so.6", PYTHONPATH=PKG)
    p = subprocess.run([sys.executable, "-c", "import kvtier"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and "libc.so.6" in last and "not libkvtier" in last, p.stderr


@pytest.mark.parametrize("args,msg", [(["--repeat", "0"], "--repeat: 0 (expected at least 1)"),
                                      (["--l1-pages", "-5"], "--l1-pages: -5 (expected at least 1)"),
                                      (["--limit", "-1"], "--limit: -1 (expected at least 0)"),
                                      (["--prefetch-policy", "wait_complete"], "--prefetch-policy: needs an L3"),
                                      (["--l2-pages", "0", "--l3-pages", "50"], "--l3-pages: needs an L2 tier")])
def test_the_trace_command_refuses_bad_arguments_as_usage_errors(args, msg, capsys):
    """python -m kvtier.trace: exit 2 naming the option, never a traceback."""
    from kvtier.trace import _main
    trace = os.path.join(os.path.dirname(__file__), "..", "..", "data", "mooncake_synthetic_trace.jsonl")
    with pytest.raises(SystemExit) as e:
        _main([trace, *args])
    assert e.value.code == 2 and msg in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a directory for a trace: exit 1, saying so
        _main([os.path.dirname(__file__)])
    assert e.value.code == 1 and "Is a directory" in capsys.readouterr().err


def test_cp_lane_helpers_refuse_a_page_outside_the_group():
    """lane_page of a page past the group's pages (or negative) gave another
    page's place; a zero rank count or lane size divided by zero."""
    from kvtier import cp
    assert [cp.lane_page(p, 2, 4) for p in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert [cp.lane_of(p, 3) for p in range(4)] == [0, 1, 2, 0]
    for args in ((8, 2, 4), (-1, 2, 4)):
        with pytest.raises(ValueError, match=r"lane_page page: -?\d+ is out of range \(expected 0\.\.7\)"):
            cp.lane_page(*args)
    with pytest.raises(ValueError, match="lane_page pages_per_rank"):
        cp.lane_page(3, 2, 0)
    with pytest.raises(ValueError, match="lane_of ranks"):
        cp.lane_of(3, 0)
    with pytest.raises(ValueError, match="lane_of page"):
        cp.lane_of(-1, 2)
    with pytest.raises(TypeError):
        cp.lane_page(1.0, 2, 4)


def test_a_cache_option_out_of_range_is_named_with_its_range():
    """Cache() and Hybrid() said only "a field is out of range", listing every
    option given: the library's check names the field and its range."""
    for opts, says in ((dict(l1_pages=64, l1_free_room=0.7), r"l1_free_room: 0 to 0\.5 \(given 0\.7\)"),
                       (dict(l1_pages=4, l1_lanes=5), r"l1_lanes: 1 to l1_pages \(given 5\)"),
                       (dict(l1_pages=64, l2_pages=0, l3_pages=8), r"l3_pages: a modeled L3 needs an L2"),
                       (dict(l1_pages=64, prefetch_timeout_s=1e6), r"prefetch_timeout_s: 0 to 86400")):
        with pytest.raises(kvtier.InvalidArgument, match=says):
            kvtier.Cache(**opts)
    with pytest.raises(kvtier.InvalidArgument, match=r"the cache's l1_free_room: 0 to 0\.5"):
        kvtier.Hybrid("full:2:256,window:24:2:256", page_tokens=16, l1_bytes=1 << 20, l1_free_room=0.9)


def test_a_refused_submit_or_attach_says_which_of_its_causes():
    """Transfer.submit and Cache.attach listed every cause the library has for
    KVT_EINVAL / KVT_EBUSY: the one that holds is named."""
    with kvtier.Tier.host(8, 1, 64) as t, kvtier.Tier.host(8, 1, 64) as u, kvtier.Tier.host(2, 1, 64) as v, \
            kvtier.Transfer([t, u, v]) as x:
        for args, says in (((0, 0, [(0, 1)]), "src and dst are both tier 0"), ((0, 1, []), "no copies"),
                           ((0, 1, [(0, 1), (8, 2)]), "copy 1: src page 8 of tier 0's 8 pages"),
                           ((0, 2, [(0, 1), (1, 2)]), "copy 1: dst page 2 of tier 2's 2 pages"),
                           ((0, 1, [(0, 1), (2, 1)]), "copy 1: dst page 1 a second time")):
            with pytest.raises(kvtier.InvalidArgument, match=re.escape(says)):
                x.submit(*args)
        with kvtier.Cache(l1_pages=4, l2_pages=4, page_tokens=4) as c:
            for args, says in (((x, t, u, 0, 0), "l1 and l2 are both the Transfer's tier 0"),
                               ((x, t, u, 1, 0), "l1_index 1 and l2_index 0 must name l1 and l2"),
                               ((x, t, v), "l1 has 8 pages of its 4, l2 2 of its 4")):
                with pytest.raises(kvtier.InvalidArgument, match=re.escape(says)):
                    c.attach(*args)
            c.attach(x, t, u)
            with pytest.raises(kvtier.Busy, match="attached already"):
                c.attach(x, t, u)
        for opts, says, exc in ((dict(l2_pages=0), "the cache has no L2", kvtier.InvalidArgument),
                                (dict(l2_pages=4, l3_pages=8), "a modeled L3 (l3_pages) holds no bytes",
                                 kvtier.InvalidArgument),
                                (dict(l2_pages=4), "requests were admitted already", kvtier.Busy)):
            with kvtier.Cache(l1_pages=4, page_tokens=4, **opts) as c:
                if exc is kvtier.Busy:
                    c.admit(list(range(8))).release()
                with pytest.raises(exc, match=re.escape(says)):
                    c.attach(x, t, u)
