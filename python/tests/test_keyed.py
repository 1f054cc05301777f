"""kvtier.KeyedCache, the binding of keyed.h: its answers against a plain
dictionary model on a short scripted life, and every bad argument refused
with the error a Python caller expects (the C side's own model test is
tests/unit/keyed)."""
import array
import os
import re
import subprocess
import sys
import sysconfig

import pytest

from kvtier.keyed import KeyedCache, key_of_bytes, pack_keys, unpack_keys
import kvtier
import kvtier.keyed


@pytest.fixture(autouse=True, params=["extension", "ctypes"])
def calls(request, monkeypatch):
    """Every test here twice: the hot calls through the extension module
    kvtier._keyed_calls, and through ctypes (kvtier.keyed._Ctypes, what a
    Python without the module runs)."""
    if request.param == "ctypes":
        monkeypatch.setattr(kvtier.keyed, "_calls", kvtier.keyed._Ctypes)
    elif kvtier.keyed.CALLS != "extension":
        pytest.skip("kvtier._keyed_calls is not built for this Python")
    return request.param


def test_the_extension_makes_the_calls_where_this_python_has_its_headers(calls):
    """scripts/install-python builds kvtier._keyed_calls wherever Python.h is
    found (CI's machines have it): a build that quietly fell back to ctypes
    fails here, not in a benchmark."""
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python headers: the package makes its calls through ctypes")
    if os.environ.get("KVTIER_KEYED_CALLS") == "ctypes":
        pytest.skip("KVTIER_KEYED_CALLS=ctypes")
    assert kvtier.keyed.CALLS == "extension"


def test_the_environment_chooses_ctypes_and_refuses_another_value(calls):
    if calls == "ctypes":
        pytest.skip("one run is enough")
    code = "import kvtier.keyed as k; print(k.CALLS)"
    env = dict(os.environ, KVTIER_KEYED_CALLS="ctypes")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ctypes"
    env["KVTIER_KEYED_CALLS"] = "fast"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "KVTIER_KEYED_CALLS='fast' (expected ctypes, or unset)" in out.stderr


def test_the_extension_refuses_what_it_is_handed_wrong(calls):
    """The module's own checks (its caller, kvtier.keyed, checks nothing
    before it): wrong counts, types and lengths raise, never crash."""
    if calls == "ctypes":
        pytest.skip("the extension's own")
    m = kvtier.keyed._calls
    with KeyedCache(4) as c, c._use as h:
        k = bytes(16)
        for call, exc, msg in [
            (lambda: m.prepare(h, k, None), TypeError, "prepare: 5 arguments, not 3"),
            (lambda: m.prepare("h", k, None, b"", 0), TypeError, "expected an address"),
            (lambda: m.prepare(0, k, None, b"", 0), ValueError, "a NULL address"),
            (lambda: m.prepare(h, k, None, b"", -1), OverflowError, ""),
            (lambda: m.prepare(h, k, None, b"", 2 ** 62), ValueError, "room"),
            (lambda: m.prepare(h, k, bytes(9), b"", 0), ValueError, "scores: 9 bytes for 1 keys"),
            (lambda: m.prepare(h, k, [1], b"", 0), TypeError, "scores: expected packed scores (bytes), not list"),
            (lambda: m.prepare(h, k, bytes(8), bytes(3), 0), ValueError, "protect: 3 bytes is not a whole number"),
            (lambda: m.pin(h, memoryview(k)), TypeError, "keys: expected packed keys (bytes), not memoryview"),
            (lambda: m.complete(h, k, _Bad()), ZeroDivisionError, ""),
            (lambda: m.touch(h, k, bytes(16)), ValueError, "scores: 16 bytes for 1 keys"),
            (lambda: m.arc_finish(h, k, bytes(2)), ValueError, "flags: expected 1 bytes"),
            (lambda: m.arc_finish(h, k, "x"), ValueError, "flags: expected 1 bytes"),
            (lambda: m.unpin(h), TypeError, "unpin: 2 arguments, not 1"),
            (lambda: m.bind((1, 2)), TypeError, "bind: expected a tuple of 8 addresses"),
        ]:
            with pytest.raises(exc, match=re.escape(msg) if msg else None):
                call()
        assert c.stats()["keys"] == 0
    with KeyedCache(4) as c:  # and the calls still go where they went (a refused bind binds nothing)
        assert c.prepare_store([(1, 1)], [1]) == ([0], [])
        c.check()


class _Bad:
    def __bool__(self):
        raise ZeroDivisionError


def test_a_keys_life_against_a_plain_model():
    c = KeyedCache(3, events=True)
    a, b, d, e = (1, 1), (1, 2), (2, 0), (3, 0)
    pages, evicted = c.prepare_store([a, b, a], [10, 20, 30])
    assert pages[2] is None and sorted(pages[:2]) == [0, 1] and evicted == []  # a repeat gets no page
    assert [c.lookup(k) for k in (a, b, d)] == ["pending", "pending", "miss"]
    assert c.prepare_store([d], [5], protect=[a, b]) == ([2], [])
    c.complete_store([a, b, d])
    assert c.pin([a]) == [c.page(a)]
    # full: e needs one page; a is pinned, b protected, so d (score 5) goes
    pages, evicted = c.prepare_store([e], [40], protect=[b])
    assert evicted == [d] and pages == [c.page(e)] and c.lookup(d) == "miss"
    assert c.prepare_store([(9, 9)], [1], protect=[b, e]) is None  # a pinned, b and e protected: no room
    c.unpin([a])
    c.complete_store([e], ok=False)
    assert c.lookup(e) == "miss"
    ev = c.take_events()
    assert [(k, r) for k, r, _ in ev] == [(a, False), (b, False), (d, False), (d, True), (e, True)]
    st = c.stats()
    assert (st["keys"], st["pending"], st["store_refusals"], st["evictions"]) == (2, 0, 1, 1)
    c.check()
    c.pin([a])  # remove: b (ready) goes; a (pinned) and d (absent) stay as they are
    assert c.remove([a, b, d, b]) == 1 and c.lookup(b) == "miss" and c.lookup(a) == "hit"
    assert [(k, r, why) for k, r, why in c.take_events()] == [(b, True, "removed")]
    assert c.stats()["removed"] == 1 and c.stats()["free_pages"] == 2
    c.unpin([a])
    c.check()
    c.close()
    with pytest.raises(kvtier.ClosedError):
        c.lookup(a)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda c: c.lookup("ab"), TypeError, "key"),
    (lambda c: c.lookup((-1, 0)), ValueError, "out of range"),
    (lambda c: c.lookup((2 ** 64, 0)), ValueError, "out of range"),
    (lambda c: c.lookup((1.5, 0)), TypeError, "hi: expected an integer, not float"),
    (lambda c: c.prepare_store([(1, 1)], []), ValueError, "scores: 0 scores for 1 keys"),
    (lambda c: c.prepare_store([(1, 1)], [-1]), ValueError, r"scores\[0\]: -1 is out of range"),
    (lambda c: c.prepare_store([(1, 1)], [1.5]), TypeError, r"scores\[0\]: expected an integer, not float"),
    (lambda c: c.prepare_store([(1, 1), (2, 2)], [1, float("nan")]), TypeError, r"scores\[1\]: expected an integer"),
    (lambda c: c.prepare_store([(1, 1)], 5), TypeError, "scores: expected a list of integers, not int"),
    (lambda c: c.touch([(1, 1)], ["3"]), TypeError, r"scores\[0\]: expected an integer, not str"),
    (lambda c: c.touch([(1, 2, 3)], [1]), TypeError, r"keys\[0\]: expected a key"),
    (lambda c: c.pin([(7, 7)]), kvtier.NotFound, None),
    (lambda c: c.unpin([(7, 7)]), kvtier.InvalidArgument, None),
    (lambda c: c.complete_store([(7, 7)], ok="no"), TypeError, "ok: expected True or False"),  # "no" is true
    (lambda c: c.complete_store([(7, 7)], ok=None), TypeError, "ok: expected True or False"),
])
def test_bad_arguments_are_refused(call, exc, msg):
    with KeyedCache(4) as c:
        with pytest.raises(exc, match=msg):
            call(c)
        c.check()
        assert c.stats()["keys"] == 0


def test_keys_may_come_from_any_iterable():
    with KeyedCache(4) as c:
        pages, evicted = c.prepare_store(((i, i) for i in range(2)), [1, 2])
        assert sorted(pages) == [0, 1] and evicted == []
        c.touch(iter([(0, 0)]), [5])
        c.check()


@pytest.mark.parametrize("kw", [{"pages": 0}, {"pages": 2 ** 32}, {"pages": 4, "free_room": 1.0},
                                {"pages": 4, "free_room": -0.1}, {"pages": 4, "free_room": float("nan")},
                                {"pages": 4, "events": "no"}, {"pages": 4, "policy": "lru"},
                                {"pages": 4, "policy": "arc", "free_room": 0.1},
                                {"pages": 2 ** 32 - 1, "policy": "arc"}])
def test_bad_configs_are_refused(kw):
    with pytest.raises((ValueError, TypeError)):
        KeyedCache(**kw)


def test_key_of_bytes_refuses_a_key_without_its_group():
    with pytest.raises(ValueError):
        key_of_bytes(b"ab")


def test_free_room_must_be_a_number():
    with pytest.raises(TypeError, match="free_room"):
        KeyedCache(4, free_room="0.5")


def test_packed_calls_give_the_answers_of_the_tuple_calls():
    """The packed forms (what kvtier.vllm uses) against the tuple forms on a twin cache."""
    import random
    rng = random.Random(7)
    keys = [(rng.getrandbits(64), rng.getrandbits(64)) for _ in range(40)]
    assert unpack_keys(pack_keys(keys)) == keys
    a, b = KeyedCache(16, events=True), KeyedCache(16, events=True)
    for i in range(0, 40, 8):
        batch, scores = keys[i:i + 8], [rng.getrandbits(64) for _ in range(8)]
        protect = keys[max(0, i - 4):i]
        pa = a.prepare_store(batch, scores, protect)
        pb = b.prepare_store_packed(pack_keys(batch), array.array("Q", scores).tobytes(), pack_keys(protect))
        assert pa == (pb[0], unpack_keys(b"".join(pb[1])))
        half = batch[:4]
        a.complete_store(half)
        b.complete_store_packed(pack_keys(half))
        a.complete_store(batch[4:], ok=False)
        b.complete_store_packed(pack_keys(batch[4:]), ok=False)
        assert a.pin(half[:2]) == b.pin_packed(pack_keys(half[:2]))
        a.unpin(half[:1])
        b.unpin_packed(pack_keys(half[:1]))
        new = [rng.getrandbits(64) for _ in range(4)]
        a.touch(half, new)
        b.touch_packed(pack_keys(half), array.array("Q", new).tobytes())
    assert a.take_events() == b.take_events() and a.stats() == b.stats()
    a.check(), b.check()


@pytest.mark.parametrize("call,exc", [
    (lambda c: c.pin_packed(bytes(15)), ValueError),
    (lambda c: c.pin_packed([(1, 1)]), TypeError),
    (lambda c: c.unpin_packed(bytearray(16)), TypeError),
    (lambda c: c.touch_packed(bytes(32), bytes(8)), ValueError),
    (lambda c: c.prepare_store_packed(bytes(16), bytes(7)), ValueError),
    (lambda c: c.prepare_store_packed(bytes(16), bytes(8), bytes(17)), ValueError),
    (lambda c: c.complete_store_packed("0123456789abcdef"), TypeError),
    (lambda c: c.touch_packed(bytes(16), [7]), TypeError),
])
def test_bad_packed_arguments_are_refused_and_change_nothing(call, exc):
    with KeyedCache(4) as c:
        c.prepare_store([(1, 1)], [1])
        before = c.stats()
        with pytest.raises(exc):
            call(c)
        assert c.stats() == before
        c.check()


def test_a_store_that_evicts_more_than_the_first_buffer_holds_gets_every_key():
    """prepare_store makes room for a few evicted keys first and for the
    whole free-room target only when the cache needs it (KVT_ERANGE, nothing
    changed, then again): a store that evicts its deficit and 2,048 keys of
    free room gets them all, smallest scores first, as one that evicts one."""
    pages = 4096
    c = KeyedCache(pages, free_room=0.5)
    keys = [(7, i) for i in range(pages)]
    got, evicted = c.prepare_store(keys, list(range(pages, 0, -1)))  # the last key the smallest score
    assert evicted == [] and None not in got
    c.complete_store(keys)
    got, evicted = c.prepare_store([(8, 0)], [10 ** 6])
    assert len(evicted) == 1 + 2048 and sorted(evicted) == sorted(keys[-2049:])
    assert c.stats()["keys"] == pages - 2049 + 1
    c.check()
    got, evicted = c.prepare_store([(8, 1)], [10 ** 6])  # free pages now: nothing evicted
    assert evicted == [] and got[0] is not None
    c.check()


def test_arc_orders_as_vllms_arc_policy_and_its_hooks_refuse_what_they_cannot_do():
    """policy="arc" (keyed.h): a few steps whose victims vLLM's ARC gives
    (the equivalence with vLLM's own policy: test_vllm.py); the hooks on a
    cache of scores, and bad flags, refused with nothing changed."""
    scores = KeyedCache(4)
    for call in (lambda: scores.arc_touch([(1, 1)]), lambda: scores.arc_missed([(1, 1)]),
                 lambda: scores.arc_finish([(1, 1)], [1])):
        with pytest.raises(kvtier.InvalidArgument, match="policy 'arc'"):
            call()
    c = KeyedCache(2, policy="arc")
    a, b, d, e = (1, 1), (2, 2), (3, 3), (4, 4)

    class Lying(bytes):  # a length that is not its bytes': C would read past them
        def __len__(self):
            return 4096
    with pytest.raises(ValueError, match="flags"):
        c.arc_finish_packed(pack_keys([a] * 4096), Lying(b"\x00"))
    c.prepare_store_packed(pack_keys([a, b]), b"")
    c.complete_store([a, b])
    c.arc_finish([a, b], [2, 0])  # a used again: T2; b stays in T1
    with pytest.raises(ValueError, match="flags"):
        c.arc_finish([a, b], [3, 0])
    with pytest.raises(kvtier.InvalidArgument):
        c.arc_finish_packed(pack_keys([a]), bytes([3]))
    _, evicted = c.prepare_store_packed(pack_keys([d]), b"")
    assert unpack_keys(b"".join(evicted)) == [b]  # T1 holds 1 >= int(target 0): T1's b goes
    c.complete_store([d])
    c.arc_missed([b])  # b in B1: the target moves to 1, so T1 (d alone) holds at least 1 ...
    _, evicted = c.prepare_store_packed(pack_keys([e]), b"")
    assert unpack_keys(b"".join(evicted)) == [d]  # ... and goes first
    c.complete_store([e])
    c.arc_missed([d, b])  # both in B1, which holds 2 against B2's 0: 1 each
    _, evicted = c.prepare_store([b], None)  # T1 holds 1 < 3: T2's a goes (no scores under ARC)
    assert evicted == [a]
    c.check()
