"""kvtier.KeyedCache, the binding of keyed.h: its answers against a plain
dictionary model on a short scripted life, and every bad argument refused
with the error a Python caller expects (the C side's own model test is
tests/unit/keyed)."""
import pytest

from kvtier.keyed import KeyedCache, key_of_bytes
import kvtier


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
    c.close()
    with pytest.raises(kvtier.ClosedError):
        c.lookup(a)


@pytest.mark.parametrize("call,exc", [
    (lambda c: c.lookup("ab"), TypeError),
    (lambda c: c.lookup((-1, 0)), ValueError),
    (lambda c: c.lookup((2 ** 64, 0)), ValueError),
    (lambda c: c.lookup((1.5, 0)), TypeError),
    (lambda c: c.prepare_store([(1, 1)], []), ValueError),
    (lambda c: c.prepare_store([(1, 1)], [-1]), ValueError),
    (lambda c: c.touch([(1, 2, 3)], [1]), TypeError),
    (lambda c: c.pin([(7, 7)]), kvtier.NotFound),
    (lambda c: c.unpin([(7, 7)]), kvtier.InvalidArgument),
])
def test_bad_arguments_are_refused(call, exc):
    with KeyedCache(4) as c:
        with pytest.raises(exc):
            call(c)
        c.check()


@pytest.mark.parametrize("kw", [{"pages": 0}, {"pages": 2 ** 32}, {"pages": 4, "free_room": 1.0},
                                {"pages": 4, "free_room": -0.1}, {"pages": 4, "free_room": float("nan")}])
def test_bad_configs_are_refused(kw):
    with pytest.raises(ValueError):
        KeyedCache(**kw)


def test_key_of_bytes_refuses_a_key_without_its_group():
    with pytest.raises(ValueError):
        key_of_bytes(b"ab")


def test_free_room_must_be_a_number():
    with pytest.raises(TypeError, match="free_room"):
        KeyedCache(4, free_room="0.5")
