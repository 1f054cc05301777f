"""kvtier.Hybrid, the binding of hybrid.h: the match rule against a
brute-force scan written from the header's text, the cache's answers
against a model of what requests leave behind (sets of token prefixes, no
hashing), and every bad argument refused with the error a Python caller
expects (the C side's own tests are tests/unit/hybrid)."""
import gc
import os
import random

import numpy as np
import pytest

import kvtier

P = 16
GROUPS = "full:2:256,window:24:2:256,state:2:4096"  # W = 24: n needs pages n-2, n-1


def new_seed():
    """A random seed, printed (KVTIER_TEST_SEED replays one)."""
    seed = int(os.environ.get("KVTIER_TEST_SEED", random.randrange(1 << 30)))
    print("seed", seed)
    return seed


# ---- the independent model -----------------------------------------------------


def needed_pages(window, n):
    """Window pages a continuation from n pages needs: those covering [nP - W, nP)."""
    return range(max(0, n * P - window) // P, n)


def brute_longest(groups, m, have):
    """The longest n <= m with every window page and the checkpoint it needs:
    each n tried from m down, every condition checked afresh."""
    for n in range(m, -1, -1):
        ok = True
        for g, gr in enumerate(groups):
            if gr.kind == "window":
                ok &= all(have(g, i) for i in needed_pages(gr.window, n))
            elif gr.kind == "state":
                ok &= n == 0 or have(g, n)
        if ok:
            return n
    return 0


class Model:
    """What the cache holds when nothing is evicted: the full pages of every
    admitted request, the window pages every released request computed, the
    checkpoints at each point it ran through (its end, its branch point,
    every ``every`` pages). A page is named by its namespace and tokens up
    to its end."""

    def __init__(self, groups, every):
        self.groups, self.every = groups, every
        self.full = set()
        self.pieces = [set() for _ in groups]
        self.users = {}  # full page: the requests admitted over it and not aborted
        self.held = {}  # request: its pages, while admitted (until released or aborted)
        self.keysof = {}  # request: its pages

    def keys(self, ns, tokens):
        return [self.key(ns, tokens, i) for i in range(len(tokens) // P)]

    @staticmethod
    def key(ns, tokens, i):
        return ns, tokens[:(i + 1) * P].tobytes()

    def admit(self, ns, tokens):
        npages = len(tokens) // P
        m = 0
        while m < npages and self.key(ns, tokens, m) in self.full:
            m += 1
        self.full.update(self.key(ns, tokens, i) for i in range(npages))
        for k in self.keys(ns, tokens):
            self.users.setdefault(k, set()).add(id(tokens))
        self.held[id(tokens)] = self.keysof[id(tokens)] = set(self.keys(ns, tokens))

        def have(g, i):  # window page i, or the checkpoint after i pages
            return self.key(ns, tokens, i if self.groups[g].kind == "window" else i - 1) in self.pieces[g]

        n = brute_longest(self.groups, m, have)
        why = "none"
        if n < m:
            windows_ok = all(have(g, i) for g, gr in enumerate(self.groups) if gr.kind == "window"
                             for i in needed_pages(gr.window, m))
            why = "state" if windows_ok else "window"
        return n, m, why

    def abort(self, ns, tokens, m):
        """The request's new pages leave, and with them the pages that
        requests admitted over them and released since left below them
        (computed over pages that hold no KV); unless another request
        admitted over them is held: then False, nothing changes."""
        keys = self.keys(ns, tokens)
        matched, new = set(keys[:m]), keys[m:]
        others = set().union(*(self.users[k] for k in new)) - {id(tokens)}
        if any(q in self.held for q in others):
            return False
        gone = set(new).union(*(self.keysof[q] - matched for q in others))  # (each passes through new[0])
        for k in matched:
            self.users[k].discard(id(tokens))
        for k in gone:
            self.users.pop(k, None)
        self.full.difference_update(gone)
        del self.held[id(tokens)]
        return True

    def release(self, ns, tokens, n, m):
        self.held.pop(id(tokens), None)
        npages = len(tokens) // P
        points = [c for c in range(n + 1, npages + 1)
                  if (self.every and c % self.every == 0) or c == npages or (n < m and c == m)]
        for g, gr in enumerate(self.groups):
            if gr.kind == "window":
                self.pieces[g].update(self.key(ns, tokens, i) for i in range(n, npages))
            elif gr.kind == "state":
                self.pieces[g].update(self.key(ns, tokens, c - 1) for c in points)


def requests(rng, count):
    """Token sequences that share prefixes: each continues an earlier one
    (cut anywhere, a page boundary or not; often one of the last few, which
    may still be running) or starts afresh."""
    done = []
    for _ in range(count):
        if done and rng.random() < 0.8:
            base = rng.choice(done[-3:] if rng.random() < 0.5 else done)
            base = base[:rng.randrange(len(base) + 1)]
        else:
            base = np.zeros(0, np.int32)
        t = np.concatenate([base, np.array([rng.randrange(1000) for _ in range(rng.randrange(1, 90))], np.int32)])
        done.append(t)
        yield t


# ---- the match rule alone ------------------------------------------------------------


def test_hybrid_longest_against_brute_force():
    seed = new_seed()
    rng = random.Random(seed)
    kinds = [kvtier.LayerGroup("full", 1, 0, 64), kvtier.LayerGroup("window", 1, 24, 64),
             kvtier.LayerGroup("window", 1, 40, 64), kvtier.LayerGroup("state", 1, 0, 512),
             kvtier.LayerGroup("window", 1, 1, 64)]
    for _ in range(3000):
        groups = [kinds[0]] + rng.sample(kinds[1:], rng.randrange(4))
        m = rng.randrange(12)
        dens = rng.random()
        present = [None if g.kind == "full" else [rng.random() < dens for _ in range(m + (g.kind == "state"))]
                   for g in groups]
        want = brute_longest(groups, m, lambda g, i: present[g][i])
        assert kvtier.hybrid_longest(groups, P, m, present) == want, (groups, m, present)


def test_hybrid_longest_the_headers_picture():
    """hybrid.h's example: P = 16, W = 32, m = 7; n = 3 would do for the
    window, but only the checkpoints at 1 and 4 exist: n = 0 (page 0 absent)."""
    groups = "full:1:64,window:32:1:64,state:1:512"
    window = [0, 1, 1, 0, 1, 1, 0]
    state = [0, 1, 0, 0, 1, 0, 0, 0]
    assert kvtier.hybrid_longest(groups, 16, 7, [None, window, state]) == 0
    assert kvtier.hybrid_longest(groups, 16, 7, [None, window, [0, 1, 0, 1, 0, 0, 0, 0]]) == 3
    assert kvtier.hybrid_longest(groups, 16, 0, [None, [], [0]]) == 0


# ---- the cache against the model ------------------------------------------------------


@pytest.mark.parametrize("abort_share", [0, 0.3])
def test_admit_and_release_against_the_model(abort_share):
    """With room for everything, every answer is the model's: n, m, why n < m,
    the pieces held per group, and the statistics summed. Requests whose
    forward pass failed are aborted: they leave nothing (refused, changing
    nothing, while a request admitted over their new pages was not aborted:
    then they are released)."""
    seed = new_seed()
    rng = random.Random(seed)
    every = 4
    room = 1 << 16  # more pages and slots than the requests below can fill
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=64 << 20, l1_pages=room, l1_slots={1: room, 2: room},
                       checkpoint_every=every) as h:
        groups = h.groups
        model = Model(groups, every)
        live, seen, sums = [], set(), {"hit": 0, "full": 0, "window": 0, "state": 0}
        aborted = refused = 0
        for i, t in enumerate(requests(rng, 400)):
            ns = 1 if i % 7 == 0 else 0
            n, m, why = model.admit(ns, t)
            req = h.admit(t, ns=ns)
            assert (req.hit_pages, req.full_hit_pages, req.short_by) == (n, m, why), (i, seed)
            assert req.hit_tier == (1 if n else 0) and req.pages == len(t) // P == len(req.l1_ids)
            assert len(set(req.l1_ids)) == len(req.l1_ids)
            seen.add(why if n < m else "n=m>0" if n else "0")
            sums["hit"] += n * P
            sums["full"] += m * P
            if why in ("window", "state"):
                sums[why] += (m - n) * P
            live.append((ns, t, req, n, m))
            while live and (len(live) > 3 or rng.random() < 0.4):  # up to four requests at once
                ns2, t2, r2, n2, m2 = live.pop(rng.randrange(len(live)))
                if abort_share and rng.random() < abort_share:
                    if model.abort(ns2, t2, m2):
                        r2.abort()
                        aborted += 1
                        continue
                    with pytest.raises(kvtier.Busy):
                        r2.abort()
                    refused += 1
                h.release(r2, t2)
                model.release(ns2, t2, n2, m2)
            if i % 50 == 0:
                h.check()
        for ns2, t2, r2, n2, m2 in live:
            r2.release()
            model.release(ns2, t2, n2, m2)
        h.check()
        assert {"window", "state", "n=m>0", "0"} <= seen  # each outcome was met
        st = h.stats()
        assert st["aborted"] == aborted
        if abort_share:
            assert aborted > 50 and refused > 0, (aborted, refused, seed)
        assert (st["hit_tokens"], st["full_hit_tokens"]) == (sums["hit"], sums["full"])
        assert (st["window_short_tokens"], st["state_short_tokens"]) == (sums["window"], sums["state"])
        assert st["l1_hit_tokens"] == sums["hit"] and st["room_short_tokens"] == 0 and st["requests"] == 400
        assert h.group_bytes(0)["slots"] == (len(model.full), 0, 0)
        for g in (1, 2):
            b = h.group_bytes(g)
            assert b["slots"] == (len(model.pieces[g]), 0, 0)
            assert b["bytes"][0] == len(model.pieces[g]) * (groups[g].bytes * (P if g == 1 else 1))
        assert st["cached_tokens"] == len(model.full) * P


def test_small_tiers_claim_only_what_was_left_behind():
    """With tiers too small to keep everything, the cache forgets (n below the
    model's) but never claims a piece no request left behind, and pieces come
    back from L2."""
    seed = new_seed()
    rng = random.Random(seed)
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=400 << 10, l2_bytes=2 << 20, checkpoint_every=3,
                       write_policy="write_through") as h:
        cfg = h.config
        assert cfg["l2_pages"] > 0 and all(s > 0 for s in cfg["l2_slots"][1:])
        model = Model(h.groups, 3)
        tiers, shorter = set(), 0
        for i, t in enumerate(requests(rng, 300)):
            n_model, m_model, _ = model.admit(0, t)
            req = h.admit(t)
            n, m = req.hit_pages, req.full_hit_pages
            assert n <= m <= m_model and n <= n_model
            # every piece n needs, and every full page below m, was left behind by some request
            assert all(model.key(0, t, i) in model.full for i in range(m))
            assert all(model.key(0, t, i) in model.pieces[1] for i in needed_pages(24, n))
            assert n == 0 or model.key(0, t, n - 1) in model.pieces[2]
            tiers.add(req.hit_tier)
            shorter += n < n_model
            h.release(req, t)
            model.release(0, t, n, m)
            for g in range(3):
                b = h.group_bytes(g)
                assert b["slots"][0] <= (cfg["l1_pages"] if g == 0 else cfg["l1_slots"][g])
            if i % 25 == 0:
                h.check()
        h.check()
        assert {1, 2} <= tiers and shorter > 0
        st = h.stats()
        assert st["l2_hit_tokens"] > 0 and st["pieces_loaded"] > 0 and st["l2_bytes"] > 0


def test_the_decision_digest_follows_the_pieces():
    """Two caches fed the same requests agree on the digest after each; one
    whose checkpoints differ agrees on its full pages' digest only; none is
    kept without decision_digest."""
    rng = random.Random(new_seed())
    opts = dict(page_tokens=P, l1_bytes=400 << 10, l2_bytes=2 << 20, write_policy="write_back")
    with kvtier.Hybrid(GROUPS, decision_digest=True, **opts) as a, \
            kvtier.Hybrid(GROUPS, decision_digest=True, **opts) as b, \
            kvtier.Hybrid(GROUPS, decision_digest=True, checkpoint_every=2, **opts) as c, \
            kvtier.Hybrid(GROUPS, **opts) as d:
        seen = set()
        for t in requests(rng, 120):
            for h in (a, b, c, d):
                h.release(h.admit(t), t)
            assert a.digest == b.digest and d.digest == 0
            seen.add(a.digest)
        assert len(seen) > 100
        assert a.cache_stats()["requests"] == 120 and a.stats() == d.stats()
        assert a.digest != c.digest


def test_room_in_l1_runs_out_while_pieces_are_pinned():
    """Two window slots in L1: a request pinning two window pages leaves no
    room for another's, whose hit falls to 0 (short_by "room")."""
    with kvtier.Hybrid("full:1:64,window:24:1:64", page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20,
                       l1_slots={1: 2}, checkpoint_every=0) as h:
        a = np.arange(64, dtype=np.int32)
        b = np.arange(1000, 1064, dtype=np.int32)
        for t in (a, b):  # each leaves pages 2, 3 (needed at its end) in L2
            h.release(h.admit(t), t)
        ra = h.admit(np.concatenate([a, [7]]).astype(np.int32))
        assert (ra.hit_pages, ra.short_by) == (4, "none")
        rb = h.admit(np.concatenate([b, [7]]).astype(np.int32))
        assert (rb.hit_pages, rb.full_hit_pages, rb.short_by) == (0, 4, "room")
        h.check()
        rb.release()
        ra.release()
        assert h.stats()["room_short_tokens"] == 4 * P
        h.check()


def test_a_hit_short_by_a_window_and_then_by_room_counts_both():
    """full_hit_tokens = hit + window_short + state_short + room_short: the
    tokens the rule lost (a window page missing) stay the rule's when L1's
    room then loses the rest (they were counted nowhere)."""
    with kvtier.Hybrid("full:1:64,window:64:1:64", page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 22,
                       l1_slots={1: 8}, l2_slots={1: 100}, checkpoint_every=5) as h:
        x, y = list(range(1000, 1000 + 10 * P)), list(range(5000, 5000 + 10 * P))
        for t in (x, y):
            h.release(h.admit(t))
        live = [h.admit(y), h.admit(y[:5 * P] + [7] * (5 * P))]  # pin all eight window slots
        b = h.admit(x[:9 * P] + [9] * P)  # m = 9, but x's spare page 5 (in no kept point's window) is gone: n = 5
        assert (b.hit_pages, b.full_hit_pages, b.short_by) == (0, 9, "room")
        st = h.stats()
        assert (st["window_short_tokens"], st["room_short_tokens"]) == (4 * P, 5 * P)
        assert st["full_hit_tokens"] == (st["hit_tokens"] + st["window_short_tokens"] + st["state_short_tokens"]
                                         + st["room_short_tokens"])
        h.check()
        for r in [b] + live:
            r.release()


def test_pieces_stored_count_only_the_new_ones():
    """window_pages_stored counts the pages a request added to L1, not the
    ones it found there (the engine was told to write 4 of 12)."""
    with kvtier.Hybrid("full:1:64,window:32:1:64,state:1:256", page_tokens=P, l1_bytes=1 << 22,
                       l1_slots={1: 200, 2: 20}, checkpoint_branches=False, moves=True) as h:
        x = list(range(1000, 1000 + 10 * P))
        h.release(h.admit(x))
        assert h.stats()["window_pages_stored"] == 10
        h.take_moves()
        b = h.admit(x[:8 * P] + [7] * (4 * P))  # no checkpoint at 8: n = 0, it recomputes all 12 pages
        assert (b.hit_pages, b.short_by) == (0, "state")
        h.release(b)
        writes = sum(1 for m in h.take_moves() if m.group == 1 and m.src_tier == 0)
        st = h.stats()
        assert writes == 4 and st["window_pages_stored"] == 10 + 4 and h.group_bytes(1)["slots"][0] == 14
        assert st["checkpoints_stored"] == 2


# (warm requests, probes): (root, priority) each; then each policy's hit pages for the probes
ORDER_CASES = (
    # A hit once, B, C: lru, fifo, priority, slru evict A's (the oldest); s2lru and lfu B's
    # (seen once, no hits); arc as s2lru until B misses pieces its seen-once ghost remembers
    (((1, 0), (1, 0), (2, 0), (3, 0)), ((2, 0), (3, 0), (1, 0)),
     dict(lru=(2, 2, 0), s2lru=(0, 0, 2), arc=(0, 2, 0), lfu=(0, 0, 2), fifo=(2, 2, 0), priority=(2, 2, 0),
          slru=(2, 2, 0))),
    # A at priority 5 (raised by its hit), B hit twice: priority alone evicts B's
    (((1, 0), (1, 5), (2, 0), (2, 0), (2, 0), (3, 0)), ((2, 0), (1, 0)),
     dict(lru=(2, 0), s2lru=(2, 0), arc=(2, 0), lfu=(2, 0), fifo=(2, 0), priority=(0, 2), slru=(2, 0))),
    # A hit twice, B once: lfu (fewer hits) and slru (A protected) evict B's
    (((1, 0), (1, 0), (1, 0), (2, 0), (2, 0), (3, 0)), ((2, 0), (1, 0)),
     dict(lru=(2, 0), s2lru=(2, 0), arc=(2, 0), lfu=(0, 2), fifo=(2, 0), priority=(2, 0), slru=(0, 2))),
    # A hit after B is stored: fifo alone evicts A's (stored first)
    (((1, 0), (2, 0), (1, 0), (3, 0)), ((1, 0), (2, 0)),
     dict(lru=(2, 0), s2lru=(2, 0), arc=(2, 0), lfu=(2, 0), fifo=(0, 0), priority=(2, 0), slru=(2, 0))),
)


@pytest.mark.parametrize("case", range(len(ORDER_CASES)))
def test_the_pieces_follow_the_caches_policy(case):
    """Four L1 window slots, requests of two pages whose window needs both:
    whether each probe hits says which pieces the policy kept (worked out
    from each policy's rule, as the C unit test's table is)."""
    def hit(h, root, priority):
        t = np.arange(root * 100, root * 100 + 8, dtype=np.int32)
        r = h.admit(t, priority=priority)
        h.release(r, t)
        return r.hit_pages

    warm, probes, wants = ORDER_CASES[case]
    assert sorted(wants) == sorted(kvtier.POLICIES)  # every policy
    for policy, want in wants.items():
        with kvtier.Hybrid("full:1:64,window:8:1:64", page_tokens=4, l1_bytes=1 << 20, l1_slots={1: 4},
                           policy=policy) as h:
            for root, prio in warm:
                hit(h, root, prio)
            assert tuple(hit(h, root, prio) for root, prio in probes) == want, policy
            h.check()


# ---- the bytes: the engine runs the moves -----------------------------------------------

MOVE_GROUPS = GROUPS + ",window:40:1:64"
NO_SLOT = (1 << 64) - 1  # a move to or from the outside L3: by key, no slot  # W = 40: n needs up to four pages


class SlotBytes:
    """An engine's bytes, reduced to what they must be: per window or state
    group and tier, a slot-indexed array holding the key (hi, lo) of the
    piece written there (0, 0: nothing yet)."""

    def __init__(self, groups, slots, outside=None):
        self.groups = groups
        self.slot = {g: [np.zeros((slots[t][g], 2), np.uint64) for t in range(3)]
                     for g, gr in enumerate(groups) if gr.kind != "full"}
        self.loads_from = {g: [0, 0, 0, 0] for g in self.slot}  # moves into L1 by source tier
        self.outside = outside  # an L3 outside the cache (set_l3): {(group, key): piece}, by key

    def run(self, moves, hashes):
        """Runs the moves in order, checking that each copy's source holds the
        piece the move names (a move run out of order would copy another
        piece's bytes) and that an engine move names the request's own piece."""
        for mv in moves:
            assert mv.group in self.slot and 1 <= mv.dst_tier <= 3 and 0 <= mv.src_tier <= 3, mv
            if mv.src_tier == kvtier.hybrid.ENGINE:
                page = mv.src_slot - (self.groups[mv.group].kind == "state")  # a point is the state after it
                assert 0 <= page < len(hashes), mv
                lo, hi = hashes[page]
                assert mv.key == (hi, lo), f"an engine move names another piece: {mv}"
                v = mv.key
            elif mv.src_tier == 3 and self.outside is not None:
                assert mv.src_slot == NO_SLOT, f"a load from the outside L3 is by key: {mv}"
                assert (mv.group, mv.key) in self.outside, f"a load of a piece never put: {mv}"
                v = self.outside[mv.group, mv.key]
            else:
                v = tuple(int(x) for x in self.slot[mv.group][mv.src_tier - 1][mv.src_slot])
                assert v == mv.key, f"L{mv.src_tier} slot {mv.src_slot} does not hold the piece moved from it: {mv}"
            if mv.dst_tier == 1:
                self.loads_from[mv.group][mv.src_tier] += 1
            if mv.dst_tier == 3 and self.outside is not None:
                assert mv.dst_slot == NO_SLOT, f"a put to the outside L3 is by key: {mv}"
                self.outside[mv.group, mv.key] = v
            else:
                self.slot[mv.group][mv.dst_tier - 1][mv.dst_slot] = v


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_the_moves_put_every_needed_piece_in_its_l1_slot(policy):
    """An engine that runs every move over slot arrays finds each piece of
    each hit in the L1 slot ``slots(g)`` names, pieces come back into L1
    from L2 and from L3, and no copy reads a slot that holds another piece."""
    seed = new_seed()
    rng = random.Random(seed)
    slots = ({1: 8, 2: 4, 3: 8}, {1: 16, 2: 8, 3: 16}, {1: 48, 2: 24, 3: 48})
    room = 1 << 14  # full pages never leave L1: only the pieces go through the tiers
    with kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l3_bytes=1 << 20,
                       l1_pages=room, l2_pages=room, l3_pages=room, l1_slots=slots[0], l2_slots=slots[1],
                       l3_slots=slots[2], checkpoint_every=3, write_policy=policy, l3_write_policy=policy,
                       moves=True) as h:
        groups = h.groups
        b = SlotBytes(groups, [[s.get(g, 0) for g in range(len(groups))] for s in slots])
        hits = 0
        for i, t in enumerate(requests(rng, 400)):
            hashes = kvtier.page_hashes(t, P)
            req = h.admit(t)
            b.run(h.take_moves(), hashes)
            assert h.pending_moves() == 0
            n = req.hit_pages
            hits += n > 0
            assert len(req.slots(0)) == 0
            for g, gr in enumerate(groups[1:], 1):
                want = ([n - 1] if n else []) if gr.kind == "state" else list(needed_pages(gr.window, n))
                got = req.slots(g)
                assert len(got) == len(want), (i, g, seed)
                for s, page in zip(got, want):
                    lo, hi = hashes[page]
                    assert tuple(int(x) for x in b.slot[g][0][s]) == (hi, lo), \
                        f"request {i} group {g}: page {page} is not in its L1 slot {s} (seed {seed})"
            h.release(req, t)
            b.run(h.take_moves(), hashes)
            if i % 50 == 0:
                h.check()
        h.check()
        assert hits > 20
        for g in b.slot:
            assert all(b.loads_from[g][t] > 0 for t in (2, 3)), (g, b.loads_from[g], seed)


def _slots_touched(mv):
    """The (group, tier, slot) a move reads and the one it writes (None: the
    request itself, or the outside L3 by key)."""
    read = (mv.group, mv.src_tier, mv.src_slot) if mv.src_tier != kvtier.hybrid.ENGINE and \
        mv.src_slot != NO_SLOT else None
    written = (mv.group, mv.dst_tier, mv.dst_slot) if mv.dst_slot != NO_SLOT else None
    return read, written


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_moves_reported_out_of_order(policy):
    """async_moves: the engine runs about half the moves it took at a time,
    in a random order, about one in seven failing (garbage left in the slot), and
    reports them. No move handed out touches a slot another outstanding move
    writes, every ready hit finds its pieces in its L1 slots, and a hit whose
    piece failed is told so (ready() None, slots IOFailure)."""
    seed = new_seed()
    rng = random.Random(seed)
    slots = ({1: 8, 2: 4, 3: 8}, {1: 16, 2: 8, 3: 16}, {1: 48, 2: 24, 3: 48})
    room = 1 << 14
    with kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l3_bytes=1 << 20,
                       l1_pages=room, l2_pages=room, l3_pages=room, l1_slots=slots[0], l2_slots=slots[1],
                       l3_slots=slots[2], checkpoint_every=3, write_policy=policy, l3_write_policy=policy,
                       moves=True, async_moves=True) as h:
        groups = h.groups
        b = SlotBytes(groups, [[s.get(g, 0) for g in range(len(groups))] for s in slots])
        out = []  # (move, the hashes of the request it came from)
        kept = []  # (tokens, hashes) of released requests the engine keeps: a move from them waits for a slot

        def take(hashes):
            for mv in h.take_moves():
                if mv.src_tier == kvtier.hybrid.ENGINE:  # the request's own, or one the engine kept
                    hashes = next((hs for hs in [hashes] + [hs for _, hs in kept]
                                   if any((hi, lo) == mv.key for lo, hi in hs)), None)
                    assert hashes is not None, f"{mv}: from a request the engine let go of (seed {seed})"
                read, written = _slots_touched(mv)
                for other, _ in out:
                    o_read, o_written = _slots_touched(other)
                    assert written is None or written not in (o_read, o_written), \
                        f"{mv} writes a slot {other} touches (seed {seed})"
                    assert read is None or read != o_written, f"{mv} reads a slot {other} writes (seed {seed})"
                out.append((mv, hashes))

        def run_some(everything=False):
            picked = [x for x in out if everything or rng.random() < 0.5]
            rng.shuffle(picked)
            for x in picked:
                out.remove(x)
            oks = []
            for mv, hashes in picked:
                good = rng.random() >= 0.15
                b.run([mv], hashes)
                if not good and mv.dst_slot != NO_SLOT:
                    b.slot[mv.group][mv.dst_tier - 1][mv.dst_slot] = (1, 1)  # garbage
                oks.append(good)
            h.moves_done([mv for mv, _ in picked], oks)

        counts = {"ready": 0, "waited": 0, "failed": 0, "kept": 0}
        for i, t in enumerate(requests(rng, 500)):
            hashes = kvtier.page_hashes(t, P)
            req = h.admit(t)
            take(hashes)
            while h.ready(req) is False:
                counts["waited"] += 1
                run_some()
                take(hashes)
            n = req.hit_pages
            if h.ready(req) is None:
                counts["failed"] += 1
                with pytest.raises(kvtier.IOFailure):
                    req.slots(1)
            else:
                counts["ready"] += n > 0
                for g, gr in enumerate(groups[1:], 1):
                    want = ([n - 1] if n else []) if gr.kind == "state" else list(needed_pages(gr.window, n))
                    for s, page in zip(req.slots(g), want):
                        lo, hi = hashes[page]
                        assert tuple(int(x) for x in b.slot[g][0][s]) == (hi, lo), \
                            f"request {i} group {g}: page {page} is not in its L1 slot {s} (seed {seed})"
            h.release(req, t)
            take(hashes)
            if h.engine_waiting(t):
                kept.append((t, hashes))
                counts["kept"] += 1
            run_some(everything=rng.random() < 0.5)  # the engine goes on copying between requests too
            take([])
            kept[:] = [(kt, hs) for kt, hs in kept if h.engine_waiting(kt)]
            if i % 25 == 0:
                h.check()
        while out or h.outstanding_moves() or h.pending_moves():
            take([])
            run_some(everything=True)
        h.check()
        st = h.stats()
        assert counts["ready"] > 10 and counts["waited"] > 10 and counts["failed"] > 0, (counts, seed)
        assert st["moves_failed"] > 0
        assert counts["kept"] > 0 or policy == "write_through", (counts, seed)  # a move waited past its release


def test_moves_done_refuses_bad_reports():
    with kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, moves=True,
                       async_moves=True) as h:
        t = list(range(3 * P))
        h.release(h.admit(t), t)
        moves = h.take_moves()
        assert moves and h.outstanding_moves() == len(moves) and h.pending_moves() == 0
        with pytest.raises(TypeError, match="HybridMove"):
            h.moves_done([tuple(moves[0])])
        with pytest.raises(ValueError, match="one per move"):
            h.moves_done(moves, [True])
        with pytest.raises(kvtier.InvalidArgument, match="not taken"):
            h.moves_done([moves[0], moves[0]])
        with pytest.raises(kvtier.InvalidArgument, match="not taken"):
            h.moves_done([moves[0]._replace(dst_slot=moves[0].dst_slot + 1000)])
        m = moves[0]  # ctypes would wrap a field out of range into another move's (group 2^32 + g as g)
        for bad in (m._replace(group=m.group + 2 ** 32), m._replace(src_slot=-1), m._replace(dst_slot=2 ** 64),
                    m._replace(key=(m.key[0] + 2 ** 64, m.key[1])), m._replace(key=m.key[0])):
            with pytest.raises((ValueError, TypeError)):
                h.moves_done([bad])
        with pytest.raises(ValueError, match="one per move"):
            h.moves_done(moves, "yes")
        assert h.outstanding_moves() == len(moves)  # nothing changed
        h.moves_done(moves, np.bool_(False))
        assert h.outstanding_moves() == 0 and h.stats()["moves_failed"] == len(moves)
        h.check()
        req = h.admit(t)  # what the failed copies would have left is not there
        assert req.hit_pages == 0 and h.ready(req) is True
        h.release(req, t)
        with pytest.raises(kvtier.InvalidArgument, match="not live"):
            h.ready(req)
        with pytest.raises(TypeError, match="Hybrid.ready req"):
            h.ready("a request")
        with pytest.raises(TypeError):
            h.engine_waiting("tokens")
        assert h.engine_waiting(t) > 0  # the release's moves from the engine, not taken yet
        h.take_moves()
        assert h.engine_waiting(t) == 0
    with pytest.raises(ValueError, match="needs moves=True"):
        kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, async_moves=True)
    with kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, moves=True) as h:
        with pytest.raises(kvtier.InvalidArgument, match="without async_moves"):
            h.moves_done([])


def test_a_move_run_out_of_order_is_seen():
    """The check above can fail: swapping a release's demotion with the store
    that reuses its slot (write_back) copies a piece that is no longer there."""
    with kvtier.Hybrid("full:1:64,window:16:1:64", page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20,
                       l1_pages=1 << 10, l1_slots={1: 2}, l2_slots={1: 8}, checkpoint_every=0,
                       write_policy="write_back", moves=True) as h:
        b = SlotBytes(h.groups, [[0, 2], [0, 8], [0, 0]])
        a = np.arange(40, dtype=np.int32)
        b.run(h.take_moves(), [])
        h.release(h.admit(a), a)
        b.run(h.take_moves(), kvtier.page_hashes(a, P))
        c = np.arange(1000, 1040, dtype=np.int32)
        h.release(h.admit(c), c)
        moves = h.take_moves()
        down = [i for i, mv in enumerate(moves) if mv.src_tier == 1 and mv.dst_tier == 2]
        assert down and down[0] < len(moves) - 1  # a's pages leave L1 before c's arrive in their slots
        swapped = moves[down[0] + 1:] + moves[:down[0] + 1]
        with pytest.raises(AssertionError, match="does not hold the piece"):
            b.run(swapped, kvtier.page_hashes(c, P))


# ---- an L3 outside the cache, and the full groups' data plane and store ----------------

OUTSIDE_SLOTS = ({1: 8, 2: 4, 3: 8}, {1: 16, 2: 8, 3: 16})


def outside_hybrid(policy="write_through"):
    """L1 and L2 slots so few that hits need pieces from the L3 outside."""
    room = 1 << 14
    return kvtier.Hybrid(MOVE_GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room,
                         l2_pages=room, l1_slots=OUTSIDE_SLOTS[0], l2_slots=OUTSIDE_SLOTS[1], checkpoint_every=3,
                         write_policy=policy, l3_write_policy=policy, moves=True)


def outside_bytes(h, outside):
    return SlotBytes(h.groups, [[s.get(g, 0) for g in range(len(h.groups))] for s in OUTSIDE_SLOTS + ({},)],
                     outside)


def serve(h, b, t):
    """One request, its moves run; every piece of its hit checked in its L1 slot."""
    hashes = kvtier.page_hashes(t, P)
    req = h.admit(t)
    b.run(h.take_moves(), hashes)
    n = req.hit_pages
    for g, gr in enumerate(h.groups[1:], 1):
        want = ([n - 1] if n else []) if gr.kind == "state" else list(needed_pages(gr.window, n))
        for s, page in zip(req.slots(g), want):
            lo, hi = hashes[page]
            assert tuple(int(x) for x in b.slot[g][0][s]) == (hi, lo), (g, page)
    h.release(req, t)
    b.run(h.take_moves(), hashes)
    return n


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_pieces_come_back_from_an_l3_outside_the_cache(policy):
    """set_l3: the cache asks the engine's store what it holds; the pieces
    it puts there (moves to tier 3 by key) are the ones later hits load
    back from it (moves from tier 3 by key), into their L1 slots."""
    seed = new_seed()
    outside, asked = {}, []

    def probe(group, keys):
        asked.append((group, len(keys)))
        return [(group, k) in outside for k in keys]

    with outside_hybrid(policy) as h:
        assert not h.has_l3
        h.set_l3(probe)
        assert h.has_l3
        b = outside_bytes(h, outside)
        hits = sum(serve(h, b, t) > 0 for t in requests(random.Random(seed), 300))
        h.check()
        assert hits > 20 and asked and h.probe_errors == 0
        assert {g for g, _ in outside} == set(b.slot)
        for g in b.slot:
            assert b.loads_from[g][3] > 0, (g, b.loads_from[g], seed)
        assert h.stats()["l3_hit_tokens"] > 0


def test_a_probe_that_fails_counts_as_absent():
    """A probe that raises, or answers the wrong number of flags, answers
    "none held" (nothing reaches C): no piece is loaded from the store, and
    the error is counted and kept."""
    outside = {}
    with outside_hybrid() as h:
        h.set_l3(lambda g, keys: [(g, k) in outside for k in keys])
        b = outside_bytes(h, outside)
        reqs = list(requests(random.Random(5), 150))
        for t in reqs:
            serve(h, b, t)
        from_l3 = sum(b.loads_from[g][3] for g in b.slot)
        assert from_l3 > 0

        def broken(g, keys):
            raise RuntimeError("the store is unreachable")

        # answers read by their truth would say "held": a store's results ("miss"), strings, lists
        for bad, err in ((broken, RuntimeError), (lambda g, keys: [True] * (len(keys) + 1), ValueError),
                         (lambda g, keys: 7, TypeError), (lambda g, keys: ["miss"] * len(keys), TypeError),
                         (lambda g, keys: ["False"] * len(keys), TypeError),
                         (lambda g, keys: [[False]] * len(keys), TypeError)):
            h.set_l3(bad)
            l3_tokens = h.stats()["l3_hit_tokens"]
            for t in reqs:
                serve(h, b, t)
            assert sum(b.loads_from[g][3] for g in b.slot) == from_l3
            assert h.stats()["l3_hit_tokens"] == l3_tokens
            assert h.probe_errors > 0 and isinstance(h.last_probe_error, err), h.last_probe_error
            h.probe_errors = 0
        h.set_l3(None)  # no L3 for the pieces: nothing is put or asked
        assert not h.has_l3
        for t in reqs[:20]:
            hashes = kvtier.page_hashes(t, P)
            r = h.admit(t)
            moves = h.take_moves()
            h.release(r, t)
            moves += h.take_moves()
            assert all(3 not in (mv.src_tier, mv.dst_tier) for mv in moves)
            b.run(moves, hashes)
        assert h.probe_errors == 0
        h.check()


class FullPlane:
    """The full groups' bytes: an L1 tier (arena) and a checksummed L2 tier
    on a transfer engine, a store over the L2 tier; closed in order."""

    def __init__(self, h, url, pages=64, layer_bytes=P * 64):
        self.l1 = kvtier.Tier.arena(pages, 1, layer_bytes)
        self.l2 = kvtier.Tier.host(pages, 1, layer_bytes, checksum=True)
        self.xfer = kvtier.Transfer([self.l1, self.l2])
        self.store = kvtier.Store(url, tier=self.l2, page_tokens=P, model="test-hybrid-full")
        h.attach(self.xfer, self.l1, self.l2)
        h.attach_store(self.store)

    def close(self):
        for o in (self.store, self.xfer, self.l2, self.l1):
            o.close()


def outside_bytes_of(h, outside):
    return SlotBytes(h.groups, [[0, 8], [0, 8], [0, 0]], outside)


def full_hybrid():
    return kvtier.Hybrid("full:1:64,window:24:1:64", page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20,
                         l1_pages=64, l2_pages=64, l1_slots={1: 8}, l2_slots={1: 8}, checkpoint_every=0,
                         write_policy="write_through", l3_write_policy="write_through",
                         prefetch_policy="wait_complete", prefetch_threshold=P, moves=True)


def test_two_caches_share_full_pages_and_pieces_through_stores(dir_store_url):
    """attach, attach_store, prefetch: what one cache wrote into its L1
    pages reaches another's L1 through the store (the full groups' pages,
    prefetched), and the window pieces through the engine's store outside
    (set_l3): the second continues from every page the first left."""
    outside = {}
    t = np.arange(72, dtype=np.int32)  # 4 pages and a half
    payload = [bytes([i + 1]) * (P * 64) for i in range(4)]
    caches = []
    for _ in range(2):
        h = full_hybrid()
        h.set_l3(lambda g, keys: [(g, k) in outside for k in keys])
        caches.append((h, FullPlane(h, dir_store_url), outside_bytes_of(h, outside)))
    try:
        (a, pa, ba), (b, pb, bb) = caches
        r = a.admit(t, prefetch=a.prefetch(t))  # nothing in the store yet: an empty prefetch
        assert (r.hit_pages, r.pages, r.new_pages) == (0, 4, 4)
        for i, page in enumerate(r.l1_ids):
            pa.l1.write_page(page, payload[i])
        ba.run(a.take_moves(), kvtier.page_hashes(t, P))
        a.release(r, t)
        ba.run(a.take_moves(), kvtier.page_hashes(t, P))
        a.sync()  # the backups and puts land
        assert len(outside) == 4
        pf = b.prefetch(t)
        assert pf.id != 0
        r = b.admit(t, prefetch=pf)
        assert pf.done and (r.full_hit_pages, r.l3_hit_pages, r.l3_foreign_pages) == (4, 4, 4)
        bb.run(b.take_moves(), kvtier.page_hashes(t, P))
        assert (r.hit_pages, r.hit_tier) == (4, 3)
        assert bb.loads_from[1][3] == 2  # window pages 2 and 3, from the store outside
        assert [pb.l1.read_page(p) for p in r.l1_ids] == payload
        b.release(r, t)
        bb.run(b.take_moves(), kvtier.page_hashes(t, P))
        st = b.cache_stats()
        assert st["l3_hit_tokens"] == st["l3_foreign_hit_tokens"] == 4 * P
        assert a.cache_stats()["l3_puts"] == 4
        with pytest.raises(kvtier.Busy):
            pb.store.close()  # the cache uses it: close the cache first
        a.check()
        b.check()
    finally:
        for h, plane, _ in caches:
            h.close()
            plane.close()


def test_a_request_that_raised_or_was_dropped_is_aborted(dir_store_url):
    """A request whose ``with`` block raised (its forward pass failed) is
    aborted: it leaves nothing, so the same prompt again hits nothing. One
    dropped while held is aborted at the cache's next call, once no request
    admitted over its new pages is held; a prefetch dropped is cancelled."""
    t = np.arange(80, dtype=np.int32)  # 5 pages
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=8 << 20, checkpoint_every=2) as h:
        with pytest.raises(RuntimeError, match="forward"):
            with h.admit(t) as r:
                raise RuntimeError("the forward pass failed")
        assert r.released
        h.admit(t)  # dropped at once, never released
        gc.collect()
        with h.admit(t) as r:
            assert (r.full_hit_pages, r.hit_pages, r.new_pages) == (0, 0, 5), "an aborted request's pages served"
        assert h.stats()["aborted"] == 2
        with h.admit(t) as r:
            assert (r.full_hit_pages, r.hit_pages) == (5, 5)
        u = np.arange(1000, 1064, dtype=np.int32)
        first = h.admit(u)
        second = h.admit(np.concatenate([u, u]))
        assert second.full_hit_pages == 4  # the first's new pages, not yet written
        del first
        gc.collect()
        h.check()
        assert h.stats()["aborted"] == 2, "let go while the second was admitted over its pages"
        second.abort()
        h.check()  # (a call: the first is let go now)
        assert h.stats()["aborted"] == 4
        assert h.group_bytes(0)["slots"][0] == 5  # t's pages alone
        with pytest.raises(kvtier.InvalidArgument, match="not live"):
            second.abort()
        first = h.admit(u)  # the same, the second released before the first is dropped: the abort takes the
        second = h.admit(np.concatenate([u, u]))  # pages the second left below the first's, computed over them
        second.release()
        del first
        gc.collect()
        h.check()
        assert h.stats()["aborted"] == 5
        assert h.group_bytes(0)["slots"][0] == 5, "t's pages alone: the second's went with the first's"
    caches = [full_hybrid() for _ in range(2)]
    planes = [FullPlane(h, dir_store_url) for h in caches]
    try:
        a, b = caches
        with a.admit(t):
            pass
        a.sync()
        p = b.prefetch(t)
        assert p.id and b.prefetches == 1
        del p
        gc.collect()
        assert b.prefetches == 0
        b.check()
    finally:
        for h, plane in zip(caches, planes):
            h.close()
            plane.close()


def test_the_l3_calls_refuse_bad_arguments(dir_store_url):
    t = np.arange(40, dtype=np.int32)
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l3_bytes=1 << 20) as h:
        with pytest.raises(kvtier.InvalidArgument, match="modeled L3"):
            h.set_l3(lambda g, keys: [False] * len(keys))  # the modeled L3 holds the pieces already
        with kvtier.Tier.host(64, 1, 64) as l2, kvtier.Store(dir_store_url, tier=l2, page_tokens=P, model="m") as st:
            with pytest.raises(kvtier.InvalidArgument):
                h.attach_store(st)  # l3_pages set too
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20) as h:
        with pytest.raises(kvtier.InvalidArgument, match="needs an L2"):
            h.set_l3(lambda g, keys: [False] * len(keys))
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20) as h:
        with pytest.raises(TypeError, match="callable"):
            h.set_l3("redis://")
        r = h.admit(t)
        with pytest.raises(kvtier.InvalidArgument, match="no request admitted"):
            h.set_l3(lambda g, keys: [False] * len(keys))
        r.release()
        h.set_l3(lambda g, keys: [False] * len(keys))
        pf = h.prefetch(t)  # no store: nothing to prefetch
        assert pf.id == 0 and pf.done
        h.admit(t, prefetch=pf).release()
        with pytest.raises(TypeError, match="HybridPrefetch"):
            h.admit(t, prefetch="soon")
        with pytest.raises(TypeError):
            h.prefetch(t.astype(np.int64))
        with pytest.raises(ValueError):
            h.prefetch(t, ns=-1)
        l1, l2 = kvtier.Tier.arena(8, 1, 64), kvtier.Tier.host(8, 1, 64)
        x = kvtier.Transfer([l1, l2])
        with pytest.raises(TypeError, match="xfer"):
            h.attach(None, l1, l2)
        with pytest.raises(TypeError, match="l2"):
            h.attach(x, l1, "l2")
        with pytest.raises(IndexError):
            h.attach(x, l1, l2, l1_index=5)
        with pytest.raises(kvtier.InvalidArgument):
            h.attach(x, l1, l2)  # 8 pages for the cache's many
        with pytest.raises(TypeError, match="Store"):
            h.attach_store("redis://127.0.0.1:1")
        x.close()
        l1.close()
        l2.close()
    with full_hybrid() as h, full_hybrid() as other:
        plane = FullPlane(h, dir_store_url)
        other_plane = FullPlane(other, dir_store_url)
        try:
            t = np.arange(72, dtype=np.int32)
            with pytest.raises(kvtier.InvalidArgument, match="not this cache's"):
                h.admit(t, prefetch=other.prefetch(t))
            r = other.admit(t)
            other_plane.l1.write_page(r.l1_ids[0], b"x" * other_plane.l1.page_bytes)
            r.release()
            other.sync()
            pf = h.prefetch(t)
            assert pf.id != 0  # other's pages are in the store
            with pytest.raises(kvtier.InvalidArgument, match="prefetch was started with"):
                h.admit(t + 1, prefetch=pf)
            pf.cancel()
            assert pf.done
            h.admit(t).release()
            with pytest.raises(kvtier.Busy):
                h.attach_store(plane.store)  # requests admitted already
        finally:
            h.close()
            other.close()
            plane.close()
            other_plane.close()
    with pytest.raises(kvtier.ClosedError):
        h.prefetch(t)


# ---- the binding's surface -----------------------------------------------------------


def test_layer_groups_and_presets():
    assert kvtier.layer_groups("full:10:8192,window:1024:52:8192") == [
        ("full", 10, 0, 10 * 8192), ("window", 52, 1024, 52 * 8192)]
    assert [g.kind for g in kvtier.layer_groups("gemma-3-like")] == ["full", "window"]
    assert [g.kind for g in kvtier.layer_groups("qwen3-next-like")] == ["full", "state"]
    for i in range(64):  # every preset: its layers in its groups; one without hybrid layers is one full group
        m = kvtier._clib.kvt_model_at(i)
        if not m:
            break
        m = m.contents
        groups = kvtier.layer_groups(m.name.decode())
        assert sum(g.layers for g in groups) == m.layers
        if len(groups) == 1:
            assert groups == [("full", m.layers, 0, m.bytes_per_token)]
    assert i >= 8
    with pytest.raises(kvtier.InvalidArgument, match="KVT_EINVAL.*group 1"):
        kvtier.layer_groups("full:1:64,window:0:1:64")
    with pytest.raises(kvtier.InvalidArgument, match="no full group"):
        kvtier.layer_groups("state:1:64")
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.layer_groups("no-such-model")
    with pytest.raises(kvtier.OutOfRange):
        kvtier.layer_groups(",".join(["full:1:64"] * 9))
    with pytest.raises(TypeError):
        kvtier.layer_groups(None)
    with pytest.raises(ValueError, match="NUL"):
        kvtier.layer_groups("full:1:64\0,state:1:1")


def test_config_overrides_reach_the_cache():
    with kvtier.Hybrid(GROUPS, page_tokens=8, l1_bytes=1 << 20, l2_bytes=2 << 20, l1_slots=[None, 5, 6],
                       l2_slots={2: 9}, checkpoint_every=7, checkpoint_ends=False, checkpoint_branches=False,
                       write_policy="write_back", policy="lru", l1_pages=33) as h:
        c = h.config
        assert c["l1_slots"] == [0, 5, 6] and c["l2_slots"][2] == 9 and c["l2_slots"][1] > 0
        assert (c["checkpoint_every"], c["checkpoint_ends"], c["checkpoint_branches"]) == (7, False, False)
        assert (c["write_policy"], c["policy"], c["l1_pages"], c["page_tokens"]) == ("write_back", "lru", 33, 8)
        assert h.page_tokens == 8 and "window:24" in repr(h)
        assert set(h.cache_stats()) >= {"requests", "l1_free"}


@pytest.mark.parametrize("state_share,window_weight", [(None, None), (0.5, 2.0), (0.1, None), (None, 16)])
def test_the_split_of_each_tiers_bytes(state_share, window_weight):
    """Each tier's bytes as hybrid.h splits them: the state group its share,
    the full and window groups the rest by bytes per token (the window
    group's weighed)."""
    ss = 0.25 if state_share is None else state_share
    ww = 0.125 if window_weight is None else window_weight
    fb, wb, sb = 512, 512, 8192  # GROUPS: bytes per token, per token, per checkpoint
    tiers = (3 << 20, 7 << 20)
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=tiers[0], l2_bytes=tiers[1], state_share=state_share,
                       window_weight=window_weight) as h:
        c = h.config
        for b, pages, slots in zip(tiers, (c["l1_pages"], c["l2_pages"]), (c["l1_slots"], c["l2_slots"])):
            token_w = fb + ww * wb
            want = (b * (1 - ss) * fb / token_w / (fb * P), b * (1 - ss) * ww * wb / token_w / (wb * P), b * ss / sb)
            got = (pages, slots[1], slots[2])
            assert all(abs(g - int(w)) <= 1 for g, w in zip(got, want)), (got, want)
        assert (c["checkpoint_every"], c["checkpoint_ends"], c["checkpoint_branches"]) == (0, True, True)


def test_the_default_weights_depend_on_an_l3():
    """With an L3 the default split weighs a window group as a full one in
    L1 and L2 and by a quarter in L3; a window_weight given applies to every
    tier, as before."""
    tiers = dict(l1_bytes=3 << 20, l2_bytes=7 << 20, l3_bytes=64 << 20)
    with kvtier.Hybrid(GROUPS, page_tokens=P, **tiers) as d, \
            kvtier.Hybrid(GROUPS, page_tokens=P, window_weight=1.0, l3_window_weight=0.25, **tiers) as e, \
            kvtier.Hybrid(GROUPS, page_tokens=P, state_share=0.25, **tiers) as s, \
            kvtier.Hybrid(GROUPS, page_tokens=P, window_weight=0.125, **tiers) as w, \
            kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=3 << 20, l2_bytes=7 << 20) as no_l3:
        assert d.config == e.config == s.config
        assert kvtier.hybrid.WINDOW_WEIGHT_OVER_L3 == 1.0 and kvtier.hybrid.L3_WINDOW_WEIGHT == 0.25
        assert w.config["l1_slots"][1] < d.config["l1_slots"][1]  # an eighth, in every tier
        assert w.config["l3_slots"][1] < d.config["l3_slots"][1]
        assert no_l3.config["l1_slots"] == w.config["l1_slots"]


def test_the_l3_weighs_the_window_groups_on_its_own():
    """l3_window_weight splits L3 alone: its slots are those of a whole split
    at that weight, L1's and L2's those of the default split."""
    tiers = dict(l1_bytes=3 << 20, l2_bytes=7 << 20, l3_bytes=64 << 20)
    with kvtier.Hybrid(GROUPS, page_tokens=P, **tiers) as base, \
            kvtier.Hybrid(GROUPS, page_tokens=P, window_weight=0.5, **tiers) as heavy, \
            kvtier.Hybrid(GROUPS, page_tokens=P, l3_window_weight=0.5, **tiers) as mixed:
        b, w, m = base.config, heavy.config, mixed.config
        assert (m["l1_slots"], m["l2_slots"], m["l1_pages"], m["l2_pages"]) == \
            (b["l1_slots"], b["l2_slots"], b["l1_pages"], b["l2_pages"])
        assert (m["l3_slots"], m["l3_pages"]) == (w["l3_slots"], w["l3_pages"])
        assert m["l3_slots"][1] > b["l3_slots"][1]
    with pytest.raises(ValueError, match="with l3_bytes"):
        kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=3 << 20, l3_window_weight=0.5)
    with pytest.raises(ValueError, match="l3_window_weight"):
        kvtier.Hybrid(GROUPS, page_tokens=P, l3_window_weight=0, **tiers)
    with pytest.raises(TypeError, match="l3_window_weight"):
        kvtier.Hybrid(GROUPS, page_tokens=P, l3_window_weight="x", **tiers)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="l1_bytes"):
        kvtier.Hybrid(GROUPS)
    with pytest.raises(ValueError, match="l1_bytes"):
        kvtier.Hybrid(GROUPS, l1_bytes=0)
    with pytest.raises(kvtier.InvalidArgument, match="KVT_EINVAL"):
        kvtier.Hybrid(GROUPS, l1_bytes=1000)  # too small for a page of each group
    with pytest.raises(kvtier.InvalidArgument, match="KVT_EINVAL"):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l1_slots={1: 0})
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l1_slots={0: 4})  # a full group has no slots
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l2_slots={1: 4})  # no L2
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l2_bytes=1 << 20, write_policy="write_through_selective")
    with pytest.raises(IndexError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l1_slots={3: 4})
    with pytest.raises(ValueError, match="entries"):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l1_slots=[1, 2])
    with pytest.raises(ValueError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, l1_slots={1: -1})
    with pytest.raises(TypeError, match="unknown option"):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, page_size=4)
    with pytest.raises(ValueError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, write_policy="sometimes")
    with pytest.raises(TypeError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, checkpoint_ends="yes")
    with pytest.raises(ValueError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, page_tokens=0)
    for share, weight in ((0, None), (1, None), (1.5, None), (None, 0), (None, 17), (None, float("nan"))):
        with pytest.raises(ValueError):
            kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, state_share=share, window_weight=weight)
    with pytest.raises(TypeError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, state_share="a quarter")
    with pytest.raises(kvtier.InvalidArgument):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 14, state_share=0.999)  # too little left for a full page
    with pytest.raises(ValueError, match="kind"):
        kvtier.Hybrid([("full", 1, 0, 64), ("sliding", 1, 8, 64)], l1_bytes=1 << 20)
    with pytest.raises(ValueError, match="full"):
        kvtier.Hybrid([("state", 1, 0, 64)], l1_bytes=1 << 20)
    with pytest.raises(ValueError, match="window"):
        kvtier.Hybrid([("full", 1, 0, 64), ("window", 1, 0, 64)], l1_bytes=1 << 20)
    with pytest.raises(TypeError):
        kvtier.Hybrid([("full", 1, 0)], l1_bytes=1 << 20)
    with pytest.raises(ValueError):
        kvtier.Hybrid([("full", 0, 0, 64)], l1_bytes=1 << 20)

    g = kvtier.layer_groups(GROUPS)
    with pytest.raises(ValueError, match="m \\+ 1"):
        kvtier.hybrid_longest(g, P, 3, [None, [1, 1, 1], [1, 1, 1]])  # a state group takes m + 1 flags
    with pytest.raises(ValueError, match="3 entries|entries"):
        kvtier.hybrid_longest(g, P, 3, [None, [1, 1, 1]])
    with pytest.raises(ValueError, match="None"):
        kvtier.hybrid_longest(g, P, 0, [[], [], [0]])
    with pytest.raises(TypeError):
        kvtier.hybrid_longest(g, P, 3, [None, "111", [1, 1, 1, 1]])
    with pytest.raises(TypeError):
        kvtier.hybrid_longest(g, P, 1, [None, [0.5], [1, 1]])
    with pytest.raises(ValueError):
        kvtier.hybrid_longest(g, 0, 0, [None, [], [0]])
    with pytest.raises(ValueError):
        kvtier.hybrid_longest(g, P, -1, [None, [], [0]])

    h = kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20)
    other = kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20)
    t = np.arange(40, dtype=np.int32)
    with pytest.raises(TypeError):
        h.admit(t.astype(np.int64))
    with pytest.raises(TypeError):
        h.admit(["a"])
    with pytest.raises(ValueError):
        h.admit(t, ns=-1)
    with pytest.raises(TypeError):
        h.admit(t, ns=1.5)
    with pytest.raises(ValueError):
        h.admit(t, priority=1 << 40)
    r = h.admit(t)
    with pytest.raises(kvtier.InvalidArgument, match="not live here"):
        other.release(r, t)
    with pytest.raises(kvtier.InvalidArgument, match="KVT_EINVAL.*tokens"):
        h.release(r, t[::-1].copy())  # other tokens: nothing changed, the request still live
    with pytest.raises(TypeError):
        h.release("request", t)
    h.release(r, list(t))
    assert r.released
    with pytest.raises(kvtier.InvalidArgument, match="not live"):
        h.release(r, t)
    with pytest.raises(IndexError):
        h.group_bytes(3)
    with pytest.raises(kvtier.InvalidArgument, match="moves=True"):
        h.take_moves()  # made without moves: nothing is recorded, and saying so beats an empty list
    r = h.admit(t)
    assert (len(r.slots(1)), len(h.slots(r, 2)), len(r.slots(0))) == (2, 1, 0)  # pages 0, 1; the point at 2
    with pytest.raises(IndexError):
        r.slots(3)
    with pytest.raises(TypeError):
        r.slots("1")
    with pytest.raises(TypeError):
        h.slots("request", 1)
    with pytest.raises(kvtier.InvalidArgument, match="not live"):
        other.slots(r, 1)
    r.release()
    with pytest.raises(kvtier.InvalidArgument, match="not live"):
        r.slots(1)  # its pins went back with it
    with pytest.raises(TypeError):
        kvtier.Hybrid(GROUPS, l1_bytes=1 << 20, moves="yes")
    with pytest.raises(TypeError):
        h.group_bytes("0")
    with h.admit(t) as r2:  # a with block releases it, with the tokens it was admitted with
        assert r2.hit_pages == 2
    assert r2.released
    live = h.admit(t)
    h.check()
    h.close()  # releases the live request
    assert live.released
    for call in (lambda: h.admit(t), h.stats, h.check, lambda: h.group_bytes(0)):
        with pytest.raises(kvtier.ClosedError):
            call()
    assert repr(h) == "<kvtier.Hybrid closed>"
    other.close()


# ---- kvtier's data plane for the pieces (attach_pieces) ------------------------------


def piece_content(g, key, size):
    """What a piece of group g holds: a function of its key (hi, lo) and group alone."""
    import hashlib
    d = hashlib.blake2b(f"{g}:{key[0]}:{key[1]}".encode(), digest_size=64).digest()
    return (d * (size // 64 + 1))[:size]


class Plane:
    """A Hybrid with kvtier's data plane: per window or state group an arena
    L1 and a checksummed host L2 of a piece a page on a Transfer of its own,
    optionally a dir store; the write callback writes each piece's content."""

    def __init__(self, h, slots, store=None, fail_every=0):
        self.h, self.tiers, self.stores, self.written, self.refused = h, {}, {}, 0, 0
        self.fail_every = fail_every
        for g, gr in enumerate(h.groups):
            if gr.kind == "full":
                continue
            size = kvtier.hybrid.piece_bytes(gr, P)
            l1, l2 = kvtier.Tier.arena(slots[0][g], 1, size), kvtier.Tier.host(slots[1][g], 1, size, checksum=True)
            self.tiers[g] = (kvtier.Transfer([l1, l2], threads=2), l1, l2)
            if store:
                ident = dict(model=f"plane-test/group-{g}", page_tokens=P)
                self.stores[g] = (kvtier.Store(store, tier=l2, **ident), kvtier.Store(store, tier=l1, **ident))
        h.attach_pieces(self.tiers, self.write, self.stores or None)

    def write(self, mv):
        assert mv.src_tier == kvtier.hybrid.ENGINE and mv.dst_tier == 1
        self.written += 1
        if self.fail_every and self.written % self.fail_every == 0:
            self.refused += 1
            raise RuntimeError("the engine could not write this piece")
        l1 = self.tiers[mv.group][1]
        l1.write_page(mv.dst_slot, piece_content(mv.group, mv.key, l1.page_bytes))

    def check_hit(self, req, tokens, what):
        """Every piece of req's hit holds its own content in its L1 slot."""
        hashes = kvtier.page_hashes(tokens, P)
        n = req.hit_pages
        for g, gr in enumerate(self.h.groups[1:], 1):
            want = ([n - 1] if n else []) if gr.kind == "state" else list(needed_pages(gr.window, n))
            got = self.h.slots(req, g)
            assert len(got) == len(want), what
            l1 = self.tiers[g][1]
            for s, page in zip(got, want):
                lo, hi = hashes[page]
                assert l1.read_page(s) == piece_content(g, (hi, lo), l1.page_bytes), \
                    f"{what}: group {g}'s piece for page {page} (L1 slot {s}) is not its own"
        return n > 0

    def close(self):
        for put, get in self.stores.values():  # a store's tier outlives it
            put.close(), get.close()
        for xfer, l1, l2 in self.tiers.values():
            for x in (xfer, l1, l2):
                x.close()


PLANE_SLOTS = ({1: 8, 2: 4}, {1: 16, 2: 8})


def run_plane(h, plane, rng, count, seed, settle=False):
    """count requests, each hit's pieces checked: (hits, failed). Copies
    stay in flight into the next admission, or with settle all land first
    (then the hits do not depend on how fast the copies run: a piece whose
    write has not landed is not there yet)."""
    hits = failed = 0
    for i, t in enumerate(requests(rng, count)):
        req = h.admit(t)
        if h.pieces_wait(req):
            hits += plane.check_hit(req, t, f"request {i} (seed {seed})")
        else:
            failed += 1
        h.release(req, t)
        if settle:
            h.pieces_sync()
        else:
            h.pieces_poll()
        if i % 50 == 0:
            h.check()
    h.pieces_sync()
    h.check()
    assert h.pieces_stats()["in_flight"] == 0
    return hits, failed


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_the_data_plane_puts_every_piece_of_every_hit_in_its_l1_slot(policy):
    """attach_pieces: kvtier runs the moves (copies between the tiers on
    each group's Transfer), the engine only writes what requests computed;
    every piece of every hit is its own, byte for byte, and pieces come back
    from L2."""
    seed = new_seed()
    rng = random.Random(seed)
    room = 1 << 14
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
                       l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], write_policy=policy, moves=True,
                       async_moves=True) as h:
        plane = Plane(h, PLANE_SLOTS)
        hits, failed = run_plane(h, plane, rng, 300, seed)
        assert hits > 0 and failed == 0, (hits, failed, seed)  # (3 to 62 of them, the busier the machine the fewer)
        hits, failed = run_plane(h, plane, rng, 300, seed, settle=True)
        st = h.pieces_stats()
        assert hits > 30 and failed == 0, (hits, failed, seed)
        assert st["written"] == plane.written > 0
        assert st["copied_up"] == h.stats()["pieces_loaded"] > 0, (st, seed)
        assert st["copy_failures"] == st["write_failures"] == 0
        with pytest.raises(kvtier.InvalidArgument, match="data plane already"):
            h.attach_pieces(plane.tiers, plane.write)
    plane.close()


def test_a_write_that_fails_costs_the_hit_never_the_bytes():
    """The engine's write raising (every fifth piece): the piece is a miss,
    kept in last_write_error; a hit that needed it is told so (pieces_wait
    False) and every hit served is right."""
    seed = new_seed()
    rng = random.Random(seed)
    room = 1 << 14
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
                       l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], moves=True, async_moves=True) as h:
        plane = Plane(h, PLANE_SLOTS, fail_every=5)
        hits, _ = run_plane(h, plane, rng, 300, seed, settle=True)
        st = h.pieces_stats()
        assert st["write_failures"] == plane.refused > 0
        assert isinstance(h.last_write_error, RuntimeError)
        assert hits > 10, seed
    plane.close()


def test_two_caches_share_pieces_through_a_store(tmp_path):
    """attach_pieces with stores: the second cache, cold, gets the first
    one's pieces from the dir store straight into L1, each one its own."""
    seed = new_seed()
    room = 1 << 14
    url = f"dir:{tmp_path}/l3"
    got = []
    for run in range(2):
        with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
                           l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], write_policy="write_through",
                           l3_write_policy="write_through", moves=True, async_moves=True) as h:
            plane = Plane(h, PLANE_SLOTS, store=url)
            assert h.has_l3
            run_plane(h, plane, random.Random(seed), 200, seed)
            got.append(h.pieces_stats()["got"])
        plane.close()
    assert got[1] > got[0], (got, seed)


def test_the_pieces_and_the_full_pages_never_share_a_store_identity(tmp_path):
    """Window page i and full page i have one chained hash: under one model
    identity (and geometry: a window group as wide as the full one) they
    were one object in L3, and a window hit was served a full page's bytes.
    Refused whichever comes second, the plane's stores or the cache's."""
    url = f"dir:{tmp_path}/l3"
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=64, l2_pages=64, l1_slots={1: 8},
              l2_slots={1: 8}, checkpoint_every=0, moves=True, async_moves=True)
    for full_model, clash in (("m", True), ("full", False)):
        for plane_first in (False, True):
            with kvtier.Hybrid("full:1:64,window:24:1:64", **kw) as h:
                size = kvtier.hybrid.piece_bytes(h.groups[1], P)
                assert size == P * 64  # a piece is as wide as a full page
                fl2 = kvtier.Tier.host(64, 1, size)
                a, b = kvtier.Tier.arena(8, 1, size), kvtier.Tier.host(8, 1, size, checksum=True)
                x = kvtier.Transfer([a, b])
                full = kvtier.Store(url, tier=fl2, page_tokens=P, model=full_model)
                put, get = (kvtier.Store(url, tier=t, page_tokens=P, model="m") for t in (b, a))
                steps = [lambda: h.attach_store(full), lambda: h.attach_pieces({1: (x, a, b)}, print, {1: (put, get)})]
                if plane_first:
                    steps.reverse()
                steps[0]()
                if clash:
                    with pytest.raises(kvtier.InvalidArgument, match="identity"):
                        steps[1]()
                else:
                    steps[1]()
            for o in (full, put, get, x, a, b, fl2):
                o.close()


def test_a_bad_object_in_the_pieces_store_is_removed(tmp_path):
    """An object that fails its checks stayed "present" to every probe, so
    every later hit through it failed (a recompute each, in every instance
    sharing the store) and none stored the piece again: it is removed at the
    failed get, and a later request is served again."""
    root = tmp_path / "l3"
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=1 << 14, l2_pages=1 << 14,
              l1_slots={1: 8}, l2_slots={1: 8}, write_policy="write_through", l3_write_policy="write_through",
              moves=True, async_moves=True)
    with kvtier.Hybrid("full:1:64,window:24:1:64", **kw) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], P)
        a, b = kvtier.Tier.arena(8, 1, size), kvtier.Tier.host(8, 1, size, checksum=True)
        x = kvtier.Transfer([a, b])
        put, get = (kvtier.Store(f"dir:{root}", tier=t, page_tokens=P, model="p", log=lambda m: None) for t in (b, a))

        def write(mv):
            a.write_page(mv.dst_slot, piece_content(1, mv.key, size))

        h.attach_pieces({1: (x, a, b)}, write, {1: (put, get)})

        def run(t):
            r = h.admit(t)
            ok = h.pieces_wait(r)
            out = (r.hit_pages, r.hit_tier, ok)
            h.release(r, t)
            h.pieces_sync()
            return out

        t = np.arange(80, dtype=np.int32)  # 5 pages
        run(t)
        objects = [f for f in root.glob("*/*") if f.is_file()]
        assert objects
        for f in objects:  # every piece's object damaged
            d = bytearray(f.read_bytes())
            d[0] ^= 1
            f.write_bytes(bytes(d))
        rng = np.random.default_rng(0)
        seen = []
        for _ in range(4):
            for _ in range(30):  # other requests push t's pieces out of L1 and L2 (its full pages stay)
                run(rng.integers(1000, 1 << 20, 64, dtype=np.int32))
            seen.append(run(t))
        assert seen[0] == (5, 3, False), seen  # from L3, and refused
        assert put.stats("remove")["hits"] >= 1
        assert any(ok for _, _, ok in seen[1:]), seen  # the old code: (5, 3, False) each time
    for o in (put, get, x, a, b):
        o.close()


def test_slots_wait_for_the_pieces_on_their_way():
    """Hybrid.slots answered while the hit's pieces were still being copied
    into L1: the slots held other pieces' bytes. TryAgain until ready."""
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=1 << 14, l2_pages=1 << 14,
              l1_slots={1: 4}, l2_slots={1: 16}, write_policy="write_through", moves=True, async_moves=True)
    with kvtier.Hybrid("full:1:64,window:24:1:64", **kw) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], P)
        a, b = kvtier.Tier.arena(4, 1, size), kvtier.Tier.host(16, 1, size, checksum=True)
        x = kvtier.Transfer([a, b])
        h.attach_pieces({1: (x, a, b)}, lambda mv: a.write_page(mv.dst_slot, piece_content(1, mv.key, size)))
        t0 = np.arange(64, dtype=np.int32)
        for t in [t0] + [np.arange(1000 * i, 1000 * i + 64, dtype=np.int32) for i in (1, 2, 3)]:
            h.release(h.admit(t), t)  # t0's pieces pushed out of L1 into L2
            h.pieces_sync()
        r = h.admit(t0)
        assert r.hit_pages == 4 and r.hit_tier == 2 and h.ready(r) is False
        with pytest.raises(kvtier.TryAgain):
            h.slots(r, 1)
        assert h.pieces_wait(r)
        hashes = kvtier.page_hashes(t0, P)
        for s, page in zip(h.slots(r, 1), needed_pages(24, 4)):
            lo, hi = hashes[page]
            assert a.read_page(s) == piece_content(1, (hi, lo), size)
        h.release(r, t0)
    for o in (x, a, b):
        o.close()


def test_attach_pieces_refuses_what_it_cannot_run():
    room = 1 << 14
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
              l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], moves=True)
    with kvtier.Hybrid(GROUPS, **kw) as h:  # moves in order: the engine runs them
        with pytest.raises(kvtier.InvalidArgument, match="async_moves"):
            Plane(h, PLANE_SLOTS)
        with pytest.raises(kvtier.InvalidArgument, match="no data plane"):
            h.pieces_sync()
    with kvtier.Hybrid(GROUPS, async_moves=True, **kw) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], P)
        l1, l2, small = kvtier.Tier.arena(8, 1, size), kvtier.Tier.host(16, 1, size), kvtier.Tier.host(2, 1, size)
        x, xs = kvtier.Transfer([l1, l2]), kvtier.Transfer([l1, small])
        with pytest.raises(TypeError, match="callable"):
            h.attach_pieces({1: (x, l1, l2)}, None)
        with pytest.raises(TypeError, match="map a group"):
            h.attach_pieces([(x, l1, l2)], print)
        with pytest.raises(TypeError, match=r"expected \(xfer, l1, l2\)"):
            h.attach_pieces({1: (x, l1)}, print)
        with pytest.raises(IndexError):
            h.attach_pieces({7: (x, l1, l2)}, print)
        with pytest.raises(kvtier.InvalidArgument):  # group 2 (state) has no tiers
            h.attach_pieces({1: (x, l1, l2)}, print)
        with pytest.raises(kvtier.InvalidArgument):  # an L2 smaller than the group's slots
            h.attach_pieces({1: (xs, l1, small), 2: (x, l1, l2)}, print)
        assert kvtier.hybrid.piece_bytes(h.groups[0], P) == 0
        for t in (x, xs, l1, l2, small):
            t.close()


def test_the_planes_transfers_stores_and_moves_are_its_alone(tmp_path):
    """While a data plane runs, nothing else may take its completions (a
    poll of its Transfer or Store hung its sync), submit to them (a foreign
    batch crashed its poll), or take, report or reroute the cache's moves
    (its sync then failed): each is refused with nothing changed, and the
    plane goes on serving every piece right. Closed, it gives them back."""
    seed = new_seed()
    room = 1 << 14
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
              l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], moves=True, async_moves=True)
    with kvtier.Hybrid(GROUPS, **kw) as h:
        plane = Plane(h, PLANE_SLOTS, store=f"dir:{tmp_path}/l3")
        x, _, _ = plane.tiers[1]
        put, get = plane.stores[1]
        for call in (lambda: x.submit(0, 1, [(0, 0)], user=10 ** 9), lambda: x.poll(0.01),
                     lambda: put.put([((1, 2), 0)], user=10 ** 9), lambda: get.poll(0.01),
                     lambda: get.run("get", [((1, 2), 0)])):
            with pytest.raises(kvtier.InvalidArgument, match="alone while it is open"):
                call()
        for call in (h.take_moves, lambda: h.moves_done([]), lambda: h.set_l3(None)):
            with pytest.raises(kvtier.InvalidArgument, match="data plane"):
                call()
        with kvtier.Hybrid(GROUPS, **kw) as other:
            with pytest.raises(kvtier.InvalidArgument, match="driven already"):
                other.attach_pieces(plane.tiers, plane.write)
        hits, failed = run_plane(h, plane, random.Random(seed), 150, seed)  # each hit's pieces checked
        assert hits > 0 and failed == 0, (hits, failed, seed)
    assert x.poll(0) == [] and get.poll(0) == []
    plane.close()


def test_a_call_into_the_cache_from_its_write_is_refused():
    seed = new_seed()
    room = 1 << 14
    calls = {}
    with kvtier.Hybrid(GROUPS, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
                       l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], moves=True, async_moves=True) as h:

        class Reentering(Plane):
            def write(self, mv):
                for name, call in (("close", h.close), ("sync", h.pieces_sync), ("stats", h.pieces_stats)):
                    try:
                        call()
                    except kvtier.InvalidArgument as e:
                        calls[name] = str(e)
                Plane.write(self, mv)

        plane = Reentering(h, PLANE_SLOTS)
        hits, failed = run_plane(h, plane, random.Random(seed), 150, seed)  # each hit's pieces checked
        assert hits > 0 and failed == 0, (hits, failed, seed)
        assert h.pieces_stats()["write_failures"] == 0
    assert set(calls) == {"close", "sync", "stats"} and all("inside its own callback" in m for m in calls.values())
    plane.close()


def test_tiers_two_groups_share_and_one_transfer_for_two_drivers_are_refused():
    room = 1 << 14
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
              moves=True, async_moves=True)
    twins = "full:2:256,window:24:2:256,window:24:2:256"
    slots = ({1: 8, 2: 8}, {1: 16, 2: 16})
    with kvtier.Hybrid(twins, l1_slots=slots[0], l2_slots=slots[1], **kw) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], P)
        a1, a2, b1, b2 = (kvtier.Tier.arena(16, 1, size) for _ in range(4))
        x = kvtier.Transfer([a1, a2, b1, b2])
        with pytest.raises(kvtier.InvalidArgument, match="no tier another group's"):
            h.attach_pieces({1: (x, a1, a2), 2: (x, a1, b2)}, print)
        with pytest.raises(kvtier.InvalidArgument, match="l1 not l2"):
            h.attach_pieces({1: (x, a1, a1), 2: (x, b1, b2)}, print)
        with pytest.raises(ValueError, match="full attention"):
            h.attach_pieces({0: (x, a1, a2), 1: (x, a1, a2), 2: (x, b1, b2)}, print)
        fl1, fl2 = kvtier.Tier.host(room, 1, h.groups[0].bytes * P), kvtier.Tier.host(room, 1, h.groups[0].bytes * P)
        y = kvtier.Transfer([fl1, fl2, a1, a2])
        h.attach(y, fl1, fl2)  # the full pages' copies on y: the cache polls it
        with pytest.raises(kvtier.InvalidArgument, match="driven already"):
            h.attach_pieces({1: (y, a1, a2), 2: (x, b1, b2)}, print)
        h.attach_pieces({1: (x, a1, a2), 2: (x, b1, b2)}, print)  # one Transfer for both groups: the plane's
    for o in (x, y, a1, a2, b1, b2, fl1, fl2):
        o.close()


def test_a_transfer_or_store_with_batches_on_it_is_refused(tmp_path):
    """The plane knows its completions by the batch and the ticket; batches
    someone else left on a Transfer or Store would be taken for its own (a
    copy into L1 reported landed before it ran, a hit's bytes stale): both
    attach_pieces and attach refuse such a Transfer (a Store likewise),
    nothing changed, and take it once its batches are polled."""
    room = 1 << 14
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
              l1_slots=PLANE_SLOTS[0], l2_slots=PLANE_SLOTS[1], moves=True, async_moves=True)
    with kvtier.Hybrid(GROUPS, **kw) as h:
        tiers, deps = {}, []
        for g in (1, 2):
            size = kvtier.hybrid.piece_bytes(h.groups[g], P)
            l1, l2 = kvtier.Tier.arena(PLANE_SLOTS[0][g], 1, size), kvtier.Tier.host(PLANE_SLOTS[1][g], 1, size)
            tiers[g] = (kvtier.Transfer([l1, l2]), l1, l2)
            deps += [tiers[g][0], l1, l2]
        x = tiers[1][0]
        x.submit(0, 1, [(0, 0)], user=0)  # the plane's first batch id
        with pytest.raises(kvtier.InvalidArgument, match="no batches on them"):
            h.attach_pieces(tiers, print)
        assert len(x.poll(10)) == 1 and x.pending == 0
        ident = dict(model="plane-test/pending", page_tokens=P)
        put = kvtier.Store(f"dir:{tmp_path}/l3", tier=tiers[1][2], **ident)
        get = kvtier.Store(f"dir:{tmp_path}/l3", tier=tiers[1][1], **ident)
        put2 = kvtier.Store(f"dir:{tmp_path}/l3", tier=tiers[2][2], model="plane-test/pending-2", page_tokens=P)
        get2 = kvtier.Store(f"dir:{tmp_path}/l3", tier=tiers[2][1], model="plane-test/pending-2", page_tokens=P)
        get.get([((1, 2), 0)], user=0)
        with pytest.raises(kvtier.InvalidArgument, match="no batches on them"):
            h.attach_pieces(tiers, print, {1: (put, get), 2: (put2, get2)})
        get.poll(10)
        h.attach_pieces(tiers, print, {1: (put, get), 2: (put2, get2)})
    for o in (put, get, put2, get2, *deps):
        o.close()
    l1, l2 = kvtier.Tier.host(8, 1, 64), kvtier.Tier.host(16, 1, 64)
    with kvtier.Transfer([l1, l2]) as x, kvtier.Cache(l1_pages=8, l2_pages=16, page_tokens=4) as c:
        x.submit(0, 1, [(0, 0)], user=0)
        with pytest.raises(kvtier.Busy, match="the Transfer has batches in flight"):
            c.attach(x, l1, l2)
        x.poll(10)
        c.attach(x, l1, l2)
    l1.close(), l2.close()


def test_put_and_get_on_two_urls_are_refused(tmp_path):
    """What the plane puts must be what it gets: stores on two URLs (each
    with the group's identity) would turn every L3 hit into a miss."""
    room = 1 << 14
    groups = "full:1:64,window:24:1:64"
    with kvtier.Hybrid(groups, page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
                       l1_slots={1: 4}, l2_slots={1: 8}, moves=True, async_moves=True) as h:
        size = kvtier.hybrid.piece_bytes(h.groups[1], P)
        l1, l2 = kvtier.Tier.arena(4, 1, size), kvtier.Tier.host(8, 1, size)
        x = kvtier.Transfer([l1, l2])
        ident = dict(model="plane-test/urls", page_tokens=P)
        put, get = kvtier.Store(f"dir:{tmp_path}/a", tier=l2, **ident), kvtier.Store(f"dir:{tmp_path}/b", tier=l1,
                                                                                       **ident)
        with pytest.raises(kvtier.InvalidArgument, match="both on one URL"):
            h.attach_pieces({1: (x, l1, l2)}, print, {1: (put, get)})
        get.close()
        get = kvtier.Store(f"dir:{tmp_path}/a", tier=l1, **ident)
        h.attach_pieces({1: (x, l1, l2)}, print, {1: (put, get)})
    for o in (put, get, x, l1, l2):
        o.close()


def test_a_tier_is_the_full_groups_or_a_groups_or_one_caches_never_two():
    """A slot written over a page, or two caches' moves into one tier: the
    full groups' tiers and the pieces' are apart (either attach first), and
    no tier is another open cache's."""
    room = 1 << 14
    groups = "full:1:64,window:24:1:64"
    kw = dict(page_tokens=P, l1_bytes=1 << 20, l2_bytes=1 << 20, l1_pages=room, l2_pages=room,
              l1_slots={1: 4}, l2_slots={1: 8}, moves=True, async_moves=True)
    page = 64 * P  # a full page and a window piece are the same size here: only the roles part them
    for first in ("full", "pieces"):
        with kvtier.Hybrid(groups, **kw) as h:
            a, b, c = kvtier.Tier.host(room, 1, page), kvtier.Tier.host(room, 1, page), kvtier.Tier.host(8, 1, page)
            x, y = kvtier.Transfer([a, b]), kvtier.Transfer([a, c])
            if first == "full":
                h.attach(x, a, b)
                with pytest.raises(kvtier.InvalidArgument, match="a tier of the full groups"):
                    h.attach_pieces({1: (y, a, c)}, print)
            else:
                h.attach_pieces({1: (y, a, c)}, print)
                with pytest.raises(kvtier.InvalidArgument, match="window or state group's tier"):
                    h.attach(x, a, b)
        for o in (x, y, a, b, c):
            o.close()
    with kvtier.Hybrid(groups, **kw) as h, kvtier.Hybrid(groups, **kw) as other, \
            kvtier.Cache(l1_pages=4, l2_pages=8, page_tokens=P) as c:
        a, b = kvtier.Tier.arena(4, 1, page), kvtier.Tier.host(8, 1, page)
        x, y, z = kvtier.Transfer([a, b]), kvtier.Transfer([a, b]), kvtier.Transfer([a, b])
        h.attach_pieces({1: (x, a, b)}, print)
        with pytest.raises(kvtier.InvalidArgument, match="another Hybrid copies into"):
            other.attach_pieces({1: (y, a, b)}, print)
        with pytest.raises(kvtier.InvalidArgument, match="another Hybrid copies into"):
            c.attach(z, a, b)
    with kvtier.Cache(l1_pages=4, l2_pages=8, page_tokens=P) as c, \
            kvtier.Cache(l1_pages=4, l2_pages=8, page_tokens=P) as d:
        c.attach(y, a, b)
        with pytest.raises(kvtier.InvalidArgument, match="another Cache copies into"):
            d.attach(z, a, b)
    for o in (x, y, z, a, b):
        o.close()

