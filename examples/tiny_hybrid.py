#!/usr/bin/env python3
"""A small hybrid engine on kvtier.Hybrid: a decoder in torch (CPU, float32,
random weights from a fixed seed) with three kinds of layers,

  full     causal attention over every earlier token
  window   attention over the last W tokens: a query at q sees [q - W, q]
  state    a gated linear recurrence S_t = a_t S_{t-1} + k_t v_t^T
           (a Mamba-2 / Gated DeltaNet-like state): the state after token
           t is all that continues from t

serving requests whose token ids come from a Mooncake trace, with
multi-turn follow-ups. kvtier decides from how many pages n every layer can
continue (its match rule); the engine resumes from there: the full layers'
K and V for [0, nP) from its L1 pages (the full groups' l1_ids), the window
layers' for [nP - W, nP) and the state at nP from the L1 slots the cache
names (Hybrid.slots), and computes the rest. For every request the logits
of its last token are compared with those of a full recompute without any
cache.

The engine keeps the window pages and checkpoints as a real one would: per
group and tier (L1, L2 and L3, the cache's modeled store), one tensor
indexed by slot, with each slot's header (the key of the piece in it). The
cache records the copies that make those tensors follow it (moves=True);
the engine runs them in order after every admit and release: a request's
computed window pages and states into their slots, pieces between the
tiers. The slot pools are small, so pieces go down to L2 and L3 and come
back (--write-policy: write_back or write_through, for L1 -> L2 and
L2 -> L3 both). The full groups' L1 holds the whole working set: their L2
and L3 in the hybrid cache are metadata, no bytes to load back. Before it
uses a hit's piece the engine checks the slot's header against the page
the hit needs (--no-guard skips that check).

    .venv/bin/python examples/tiny_hybrid.py            # the default scenario
    .venv/bin/python examples/tiny_hybrid.py --json     # one JSON object

Across processes (--l3 URL, a Redis server or a dir store that other
engine processes use too): the full layers' pages move as bytes through the
inner radix cache's data plane (L1 an engine tier over their K and V
tensors, L2 a host tier) and its store (put write_through, fetched by a
prefetch when a request arrives); the window pages and checkpoints go to a
store per group on the same URL (Hybrid.set_l3: the cache asks it what it
holds, the engine puts and gets them by key, through a one-page host tier
with the slot's header beside the bytes). A piece the store does not serve
is a piece the guard finds bad. Two processes on one Redis:

    .venv/bin/python examples/tiny_hybrid.py --l3 redis://127.0.0.1:6379 --turns first
    .venv/bin/python examples/tiny_hybrid.py --l3 redis://127.0.0.1:6379 --turns next

Copies out of order (--async-moves): the engine takes the moves and runs
about half of those outstanding at a time, in a random order, reporting
each (Hybrid.moves_done), as a transfer engine with several threads or
streams would; --fail-copies F makes that share of the copies fail. A
request uses its pieces once the cache says they all landed
(Hybrid.ready); one whose piece failed recomputes from the start. A
released request's computed pieces are kept while a move from them waits
for a slot (Hybrid.engine_waiting).

    .venv/bin/python examples/tiny_hybrid.py --async-moves --fail-copies 0.05

kvtier's data plane (--plane, Hybrid.attach_pieces): kvtier moves the
pieces itself, the engine only writes what a request computed into its L1
slot. Each group's L1 slots are an engine tier over the engine's slot
tensor, L2 a checksummed host tier, copied on a transfer engine per group;
with --l3 the pieces' store is the plane's too (put from L2, got straight
into the L1 tensor). No headers travel: the plane's checksums (L2's, the
store's) are the guard, and the logits the proof.

    .venv/bin/python examples/tiny_hybrid.py --plane
    .venv/bin/python examples/tiny_hybrid.py --plane --l3 redis://127.0.0.1:6379 --turns first

Plants that the logits check must catch: --plant checkpoint writes the
state after n - 1 pages as the checkpoint at n; --plant window zeroes the
L2 copy of a window page (bytes and header) just before a hit loads it back
(caught by the header check, or by the logits without it); --trust-full
resumes from the full groups' match m, not from n (the match rule
bypassed).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # an in-tree run finds the package without an install

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier import trace as ktrace  # noqa: E402

KINDS = ("full", "window", "state", "window", "full", "state")


class TinyHybridModel:
    """Pre-norm blocks (the layer, then a GELU MLP), sinusoidal positions;
    vocab ids are token ids modulo ``vocab``."""

    def __init__(self, kinds=KINDS, window=24, d_model=32, heads=2, vocab=512, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.kinds, self.W, self.d, self.h, self.dh, self.vocab = tuple(kinds), window, d_model, heads, \
            d_model // heads, vocab
        self.seed = seed

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        n = len(kinds)
        self.emb = torch.randn(vocab, d_model, generator=g)
        self.wq, self.wk, self.wv, self.wo = ([w(d_model, d_model) for _ in range(n)] for _ in range(4))
        self.wa = [w(d_model, heads) for _ in range(n)]  # the recurrence's decay gate, per head
        self.w1 = [w(d_model, 4 * d_model) for _ in range(n)]
        self.w2 = [w(4 * d_model, d_model) for _ in range(n)]
        self.out = w(d_model, vocab)

    def layers_of(self, kind):
        return [l for l, k in enumerate(self.kinds) if k == kind]

    def state_shape(self):
        return (self.h, self.dh, self.dh)

    def positions(self, start, n):
        pos = torch.arange(start, start + n, dtype=torch.float32)[:, None]
        i = torch.arange(0, self.d, 2, dtype=torch.float32)[None, :]
        ang = pos / torch.pow(10000.0, i / self.d)
        pe = torch.zeros(n, self.d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(ang), torch.cos(ang)
        return pe

    @staticmethod
    def norm(x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:])

    def attend(self, q, k, v, kpos, qpos, window):
        """Attention of queries at positions qpos over keys at kpos: causal,
        and within ``window`` tokens back when it is not None."""
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(self.dh)
        hide = kpos[None, :] > qpos[:, None]
        if window is not None:
            hide |= kpos[None, :] < qpos[:, None] - window
        s = s.masked_fill(hide[None], float("-inf"))
        return torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v).reshape(q.shape[0], self.d)

    def recur(self, l, hx, S, start, snap_at):
        """The state layer over new tokens from state S (after ``start``
        tokens): outputs, the last state and the states after each position
        in snap_at."""
        n = hx.shape[0]
        q = torch.nn.functional.normalize((hx @ self.wq[l]).view(n, self.h, self.dh), dim=-1)
        k = torch.nn.functional.normalize((hx @ self.wk[l]).view(n, self.h, self.dh), dim=-1)
        v = (hx @ self.wv[l]).view(n, self.h, self.dh)
        a = torch.sigmoid(hx @ self.wa[l])
        out, snaps = [], {}
        for t in range(n):
            S = a[t][:, None, None] * S + k[t][:, :, None] * v[t][:, None, :]
            out.append((q[t][:, None, :] @ S)[:, 0])
            if start + t + 1 in snap_at:
                snaps[start + t + 1] = S.clone()
        return torch.stack(out).reshape(n, self.d), S, snaps

    def forward(self, ids, start=0, past=None, snap_at=()):
        """Logits of the last token, and per layer what the new tokens leave:
        (K, V) [n, heads, head_dim] for attention layers, {position: state}
        for state layers (the positions in snap_at). ``past`` per layer:
        full (K, V) of [0, start); window (K, V) of [max(0, start - W), start);
        state, the state after ``start`` tokens. None: start is 0."""
        n = ids.shape[0]
        x = self.emb[ids] + self.positions(start, n)
        qpos = torch.arange(start, start + n)
        new = []
        for l, kind in enumerate(self.kinds):
            hx = self.norm(x)
            if kind == "state":
                S = past[l] if past else torch.zeros(self.state_shape())
                a, _, snaps = self.recur(l, hx, S, start, set(snap_at))
                new.append(snaps)
            else:
                q = (hx @ self.wq[l]).view(n, self.h, self.dh)
                k = (hx @ self.wk[l]).view(n, self.h, self.dh)
                v = (hx @ self.wv[l]).view(n, self.h, self.dh)
                new.append((k, v))
                pk, pv = past[l] if past else (k[:0], v[:0])
                kpos = torch.arange(start - pk.shape[0], start + n)
                a = self.attend(q, torch.cat([pk, k]), torch.cat([pv, v]), kpos, qpos,
                                self.W if kind == "window" else None)
            x = x + a @ self.wo[l]
            x = x + torch.nn.functional.gelu(self.norm(x) @ self.w1[l]) @ self.w2[l]
        return self.norm(x[-1]) @ self.out, new

    def groups(self):
        """The cache's layer groups: one per kind, bytes as float32 keeps them."""
        kv = 2 * self.d * 4
        out = [kvtier.LayerGroup("full", len(self.layers_of("full")), 0, len(self.layers_of("full")) * kv)]
        if self.layers_of("window"):
            out.append(kvtier.LayerGroup("window", len(self.layers_of("window")), self.W,
                                         len(self.layers_of("window")) * kv))
        if self.layers_of("state"):
            out.append(kvtier.LayerGroup("state", len(self.layers_of("state")), 0,
                                         len(self.layers_of("state")) * 4 * math.prod(self.state_shape())))
        return out


def kept_points(n, m, npages, every, ends=True, branches=True):
    """Where a request that ran from n pages over npages leaves checkpoints
    (hybrid.h): every ``every`` pages, its end, its branch point m."""
    return [c for c in range(n + 1, npages + 1)
            if (every and c % every == 0) or (ends and c == npages) or (branches and n < m and c == m)]


class HybridEngine:
    """The model over kvtier.Hybrid, keeping the bytes as a real engine does.

    Full layers: K and V tensors indexed by the full groups' L1 pages
    (``l1_ids``); the full groups' L1 is sized to hold the whole working set,
    since their L2 and L3 in the hybrid cache have no data plane (a full
    page served from there would be one the engine never filled). Shared
    (``l3``, :meth:`share`): those tensors are the inner cache's L1 tier,
    and pages come back from L2 and the store as bytes.

    Window and state layers: per group and tier (L1, L2, L3), one tensor
    indexed by slot (a window page: every window layer's K and V of P
    tokens; a checkpoint: every state layer's state), and beside it each
    slot's header, the key of the piece written there, which travels with
    the bytes. After every admit and release the engine runs the cache's
    moves in order; a hit's pieces are read from the L1 slots ``slots(g)``
    names. The guard checks each piece's header against the page hash the
    hit needs before using it (--no-guard trusts the slots); a piece that
    fails is not used (the hit is cut to what the checked pieces allow,
    kvtier.hybrid_longest) and its L1 slot is rewritten from what the
    request recomputed. Shared, L3 is the store (by key, no slots here): a
    piece it does not serve is loaded as an empty header, which the guard
    finds bad as any other."""

    def __init__(self, model, page_tokens=16, checkpoint_every=4, write_policy="write_back", window_slots=(6, 16, 40),
                 state_slots=(3, 8, 20), full_pages=4096, guard=True, trust_full=False, plant=None, l3=None,
                 async_moves=False, fail_copies=0.0, seed=0, plane=False):
        self.m, self.P = model, page_tokens
        self.groups = model.groups()
        kinds = [g.kind for g in self.groups]
        self.gw = kinds.index("window") if "window" in kinds else None
        self.gs = kinds.index("state") if "state" in kinds else None
        per_group = {self.gw: window_slots, self.gs: state_slots}
        slots = [{g: s[t] for g, s in per_group.items() if g is not None} for t in range(3)]
        self.full, self.win, self.st = (model.layers_of(k) for k in ("full", "window", "state"))
        shape = (full_pages, page_tokens, model.h, model.dh)
        self.k = {l: torch.zeros(shape) for l in self.full}
        self.v = {l: torch.zeros(shape) for l in self.full}
        self.shared = l3 is not None
        self.plane = plane
        # the tiers' bytes only make the tiers exist: the pages and slots are set outright
        if plane and not self.shared:  # kvtier moves the pieces between L1 and L2 (no modeled L3: no bytes there)
            self.cache = kvtier.Hybrid(self.groups, page_tokens=page_tokens, l1_bytes=1 << 20, l2_bytes=1 << 20,
                                       l1_pages=full_pages, l2_pages=full_pages, l1_slots=slots[0],
                                       l2_slots=slots[1], checkpoint_every=checkpoint_every,
                                       write_policy=write_policy, moves=True, async_moves=True)
        elif self.shared:  # L3 is the store: the full pages' through the inner cache, the pieces' through ours
            self.cache = kvtier.Hybrid(self.groups, page_tokens=page_tokens, l1_bytes=1 << 20, l2_bytes=1 << 20,
                                       l1_pages=full_pages, l2_pages=full_pages, l1_slots=slots[0],
                                       l2_slots=slots[1], checkpoint_every=checkpoint_every,
                                       write_policy=write_policy, l3_write_policy="write_through",
                                       prefetch_policy="wait_complete", prefetch_threshold=page_tokens, moves=True,
                                       async_moves=async_moves or plane)
        else:
            self.cache = kvtier.Hybrid(self.groups, page_tokens=page_tokens, l1_bytes=1 << 20, l2_bytes=1 << 20,
                                       l3_bytes=1 << 20, l1_pages=full_pages, l2_pages=full_pages,
                                       l3_pages=full_pages, l1_slots=slots[0], l2_slots=slots[1], l3_slots=slots[2],
                                       checkpoint_every=checkpoint_every, write_policy=write_policy,
                                       l3_write_policy=write_policy, moves=True, async_moves=async_moves)
        self.every = checkpoint_every
        piece = {self.gw: (len(self.win), 2, page_tokens, model.h, model.dh),
                 self.gs: (len(self.st), *model.state_shape())}
        tiers = 2 if self.shared or plane else 3  # a shared L3 is the store, by key: no slots of ours
        self.pool = {g: [torch.zeros(slots[t][g], *piece[g]) for t in range(tiers)] for g in piece if g is not None}
        self.header = {g: [np.zeros((slots[t][g], 2), np.uint64) for t in range(tiers)] for g in self.pool}
        self.l1 = self.l2 = self.xfer = self.store = None
        self.piece_store, self.staging = {}, {}
        self.plane_tiers, self.plane_stores, self.computing = {}, {}, None  # --plane: (xfer, l1, l2) and
        # (put, get) per group; the pieces of the request being released
        self.plane_failed = False
        # pieces to and from the shared store by group: put, loaded ("ok"), loaded and not served, loaded
        # that this process never put (another instance's)
        self.l3_puts = {g: 0 for g in self.pool}
        self.l3_puts_skipped = {g: 0 for g in self.pool}
        self.l3_gets = {g: 0 for g in self.pool}
        self.l3_get_misses = {g: 0 for g in self.pool}
        self.l3_foreign = {g: 0 for g in self.pool}
        self.put_keys = {g: set() for g in self.pool}
        try:
            if self.shared:
                self.share(l3, full_pages)
            elif plane:
                self.attach_plane()
        except BaseException:
            self.close()
            raise
        self.guard, self.trust_full, self.plant = guard, trust_full, plant
        self.planted = 0
        self.bad_copies = 0  # moves whose source slot did not hold the piece the move names
        # moves into L1 by group and source tier (0: the request, 2: L2, 3: L3), and the pieces of the hits
        # (and the hits with at least one such piece) by the tier each came from
        self.l1_moves = {g: [0, 0, 0, 0] for g in self.pool}
        self.pieces_from = {g: [0, 0, 0, 0] for g in self.pool}
        self.hits_from = {g: [0, 0, 0, 0] for g in self.pool}
        self.branch_points = set()  # checkpoints kept only because a request branched there
        # --async-moves: the moves taken and not reported, each with the request it came from; released
        # requests whose computed pieces a waiting move still needs; what happened
        self.async_moves, self.fail_copies, self.rng = async_moves, fail_copies, random.Random(seed)
        self.outstanding, self.kept = [], []
        self.copies = {"run": 0, "failed": 0, "waits": 0, "failed_hits": 0, "kept_most": 0}

    def identity(self):
        """The model's identity in the store's keys: two models never share an object."""
        m = self.m
        return f"tiny-hybrid-{''.join(k[0] for k in m.kinds)}-w{m.W}-d{m.d}-h{m.h}-v{m.vocab}-s{m.seed}"

    def share(self, url, full_pages):
        """Shares what this engine computes through the store at ``url`` (a
        Redis server other engine processes use too). The full layers' pages:
        the inner cache's data plane, L1 = an engine tier over the K and V
        tensors (a request's pages at its l1_ids), L2 = a host tier, and the
        store behind it (put write_through, fetched by prefetch). The window
        pages and checkpoints: a store per group (its own identity, so a
        window page and a checkpoint of one page hash are two objects), put
        and got through a one-page host tier that stages a piece's bytes and
        header; the cache asks it what it holds (set_l3)."""
        m, P = self.m, self.P
        piece = P * m.h * m.dh * 4  # one full layer's K (or V) of a page
        self.l1 = kvtier.Tier.from_tensors([self.k[l] for l in self.full], [self.v[l] for l in self.full],
                                           dtype=torch.float32)
        self.l2 = kvtier.Tier.host(full_pages, len(self.full), 2 * piece, checksum=True)
        self.xfer = kvtier.Transfer([self.l1, self.l2], threads=1)
        self.cache.attach(self.xfer, self.l1, self.l2)
        self.store = kvtier.Store(url, tier=self.l2, page_tokens=P, dtype_bytes=4, model=f"{self.identity()}/full")
        self.cache.attach_store(self.store)
        if self.plane:
            self.attach_plane(url)
            return
        for g, pools in self.pool.items():
            nbytes = pools[0][0].numel() * 4 + 16  # the piece, then its header (the key, hi and lo)
            self.staging[g] = kvtier.Tier.host(1, 1, nbytes)
            self.piece_store[g] = kvtier.Store(url, tier=self.staging[g], page_tokens=P, dtype_bytes=4,
                                               model=f"{self.identity()}/{g}-{self.groups[g].kind}")
        self.cache.set_l3(self.probe)

    def attach_plane(self, url=None):
        """--plane: kvtier runs the pieces' moves (Hybrid.attach_pieces). L1:
        an engine tier over the group's L1 slot tensor; L2: a checksummed host
        tier; with ``url``, a store per group under its own identity, over L2
        (puts) and over the L1 tensor (gets)."""
        stores = {}
        for g, pools in self.pool.items():
            l1 = kvtier.Tier.from_tensors([pools[0]], dtype=torch.float32)
            nbytes = pools[0][0].numel() * 4
            l2 = kvtier.Tier.host(pools[1].shape[0], 1, nbytes, checksum=True)
            self.plane_tiers[g] = (kvtier.Transfer([l1, l2], threads=2), l1, l2)
            if url:
                ident = dict(page_tokens=self.P, dtype_bytes=4, model=f"{self.identity()}/{g}-{self.groups[g].kind}-plane")
                stores[g] = (kvtier.Store(url, tier=l2, **ident), kvtier.Store(url, tier=l1, **ident))
        self.plane_stores = stores
        self.cache.attach_pieces(self.plane_tiers, self.write_piece, stores or None)

    def write_piece(self, mv):
        """--plane: the piece a move from the request names, into its L1 slot."""
        assert self.computing is not None, f"a move from a request that is not being released: {mv}"
        self.pool[mv.group][0][mv.dst_slot] = self.computing(mv.group, mv.src_slot)
        self.l1_moves[mv.group][0] += 1

    def probe(self, group, keys):
        """The cache's question: which of these pieces does the store hold."""
        res = self.piece_store[group].exists_sync([(lo, hi) for hi, lo in keys])
        return [r == "ok" for r in res.results]

    def put_piece(self, g, key, data, header):
        """A piece into the shared store: bytes and header through the staging page."""
        self.staging[g].write_page(0, data.contiguous().numpy().tobytes() + np.asarray(header, np.uint64).tobytes())
        res = self.piece_store[g].put_sync([((key[1], key[0]), 0)])
        self.l3_puts[g] += res.results[0] == "ok"
        self.put_keys[g].add(key)

    def get_piece(self, g, key):
        """A piece from the shared store: (bytes, header), or zeros and an
        empty header when the store does not serve it (gone, refused by its
        checks, unreachable): the guard then finds the piece bad."""
        res = self.piece_store[g].get_sync([((key[1], key[0]), 0)])
        shape = self.pool[g][0].shape[1:]
        if res.results[0] != "ok":
            self.l3_get_misses[g] += 1
            return torch.zeros(shape), np.zeros(2, np.uint64)
        self.l3_gets[g] += 1
        self.l3_foreign[g] += key not in self.put_keys[g]
        raw = self.staging[g].read_page(0)
        n = len(raw) - 16
        return torch.frombuffer(bytearray(raw[:n]), dtype=torch.float32).view(shape), np.frombuffer(raw[n:], np.uint64)

    def close(self):
        if self.shared and not self.cache.closed:
            self.cache.sync()  # the full pages' puts land before the store closes
        self.cache.close()
        planes = [s for pair in self.plane_stores.values() for s in pair] + \
            [t for trio in self.plane_tiers.values() for t in trio]  # a store before the tier it reads
        for o in (self.store, *self.piece_store.values(), *self.staging.values(), *planes, self.xfer, self.l2,
                  self.l1):
            if o is not None:
                o.close()

    def first_needed(self, n):
        return max(0, n * self.P - self.m.W) // self.P

    @staticmethod
    def key(h):
        """A page hash as kvtier.page_hashes gives it (lo, hi), as a header (hi, lo)."""
        return h[1], h[0]

    def run_moves(self, moves, hashes, computed=None):
        """Runs the cache's moves in their order: tier to tier, the bytes and
        the header together; from the engine, ``computed(group, index)``, the
        request's window page or the state after that many pages."""
        for mv in moves:
            g, dst = mv.group, mv.dst_tier - 1
            if mv.src_tier == kvtier.hybrid.ENGINE:
                assert computed is not None, f"an admission asked for the request's own piece: {mv}"
                page = mv.src_slot - (g == self.gs)
                if self.key(hashes[page]) != mv.key:
                    self.bad_copies += 1
                data, header = computed(g, mv.src_slot), self.key(hashes[page])  # what was written, not asked
            elif mv.src_tier == 3 and self.shared:  # a load from the shared store, by key
                data, header = self.get_piece(g, mv.key)
                if tuple(int(x) for x in header) != mv.key:
                    self.bad_copies += 1
            else:
                src = mv.src_tier - 1
                if tuple(int(x) for x in self.header[g][src][mv.src_slot]) != mv.key:
                    self.bad_copies += 1
                data, header = self.pool[g][src][mv.src_slot], self.header[g][src][mv.src_slot]
            if dst == 2 and self.shared:  # a put to the shared store, by key
                if tuple(int(x) for x in header) == mv.key:  # never one known bad: others would load it
                    self.put_piece(g, mv.key, data, header)
                else:
                    self.l3_puts_skipped[g] += 1
            else:
                self.pool[g][dst][mv.dst_slot] = data
                self.header[g][dst][mv.dst_slot] = header
            if dst == 0:
                self.l1_moves[g][mv.src_tier] += 1

    def take(self, hashes, computed=None):
        """--async-moves: the moves handed out join those outstanding, each
        with the request whose pieces it copies (a move from the engine may
        be a released request's, kept for it); returns them."""
        moves = self.cache.take_moves()
        mine = [(hashes, computed)] if computed else []
        for mv in moves:
            ctx = (hashes, computed)
            if mv.src_tier == kvtier.hybrid.ENGINE:  # the request that computed this piece (others share its key)
                page = mv.src_slot - (mv.group == self.gs)
                ctx = next(((hs, c) for hs, c in mine + [k[2:] for k in reversed(self.kept)]
                            if page < len(hs) and self.key(hs[page]) == mv.key and c.has(mv.group, mv.src_slot)),
                           None)
                assert ctx is not None, f"a move from a request the engine let go of: {mv}"
            self.outstanding.append((mv, ctx))
        return moves

    def progress(self, everything=False):
        """--async-moves: runs about half the outstanding moves (all with
        everything) in a random order and reports them; a share
        (--fail-copies) fails, leaving an empty slot, and a get the shared
        store does not serve fails too."""
        picked = [x for x in self.outstanding if everything or self.rng.random() < 0.5]
        self.rng.shuffle(picked)
        for x in picked:
            self.outstanding.remove(x)
        oks = []
        for mv, (hashes, computed) in picked:
            ok = self.rng.random() >= self.fail_copies
            if ok:
                self.run_moves([mv], hashes, computed)
                dst = mv.dst_tier - 1
                if not (dst == 2 and self.shared):  # a piece that did not come: its header says so
                    ok = tuple(int(x) for x in self.header[mv.group][dst][mv.dst_slot]) == mv.key
            elif not (mv.dst_tier == 3 and self.shared):
                self.pool[mv.group][mv.dst_tier - 1][mv.dst_slot] = 0
                self.header[mv.group][mv.dst_tier - 1][mv.dst_slot] = 0
            oks.append(ok)
        self.copies["run"] += len(oks)
        self.copies["failed"] += oks.count(False)
        self.cache.moves_done([mv for mv, _ in picked], oks)

    def drain(self):
        """--async-moves: runs every move, those waiting for a slot too."""
        while self.outstanding or self.cache.outstanding_moves() or self.cache.pending_moves():
            self.take([])
            self.progress(everything=True)

    def plant_lost_page(self, moves):
        """The planted fault: the L2 copy of a window page is lost (bytes and
        header zeroed) just before it is loaded back into L1."""
        for mv in moves:
            if mv.group == self.gw and mv.src_tier == 2 and mv.dst_tier == 1:
                self.pool[self.gw][1][mv.src_slot] = 0
                self.header[self.gw][1][mv.src_slot] = 0
                self.planted += 1
                return

    def hit_pieces(self, req, hashes):
        """{group: {page: L1 slot}} of the hit's pieces (a checkpoint by its
        page n - 1), and the pages whose slot header names another piece."""
        n, out, bad = req.hit_pages, {}, {}
        for g in self.pool:
            first = n - 1 if g == self.gs else self.first_needed(n)
            out[g] = {first + i: s for i, s in enumerate(req.slots(g))}
            bad[g] = {p for p, s in out[g].items()
                      if tuple(int(x) for x in self.header[g][0][s]) != self.key(hashes[p])}
        return out, bad

    def present(self, pieces, bad, n):
        """The checked pieces as kvtier.hybrid_longest takes them."""
        out = []
        for g, gr in enumerate(self.groups):
            if gr.kind == "window":
                out.append([p in pieces[g] and p not in bad[g] for p in range(n)])
            elif gr.kind == "state":
                out.append([True] + [p in pieces[g] and p not in bad[g] for p in range(n)])
            else:
                out.append(None)
        return out

    def past(self, req, pieces, use):
        """Each layer's past for continuing from ``use`` pages: the full
        layers' from the request's L1 pages, the window and state layers'
        from the L1 slots of the hit's pieces; a piece the hit does not
        include reads as zeros (only a resume past n, the rule bypassed,
        asks for one)."""
        P, m = self.P, self.m
        if use == 0:
            return None
        past = [None] * len(m.kinds)
        pages = torch.tensor(list(req.l1_ids[:use]), dtype=torch.int64)
        for l in self.full:
            past[l] = (self.k[l][pages].reshape(-1, m.h, m.dh), self.v[l][pages].reshape(-1, m.h, m.dh))
        if self.win:
            lo = self.first_needed(use)
            pool, have = self.pool[self.gw][0], pieces[self.gw]
            kv = torch.cat([pool[have[i]] if i in have else torch.zeros(pool.shape[1:]) for i in range(lo, use)],
                           dim=2)
            skip = max(0, use * P - m.W) - lo * P  # [nP - W, nP) exactly
            for j, l in enumerate(self.win):
                past[l] = (kv[j, 0, skip:], kv[j, 1, skip:])
        if self.st:
            have = pieces[self.gs]
            s = self.pool[self.gs][0][have[use - 1]] if use - 1 in have else \
                torch.zeros(len(self.st), *m.state_shape())
            for j, l in enumerate(self.st):
                past[l] = s[j]
        return past

    def serve(self, tokens, ns=0):
        """One request: (logits, what happened)."""
        P, m = self.P, self.m
        hashes = kvtier.page_hashes(tokens, P, ns)
        npages = len(hashes)
        if self.shared:  # the full pages another engine put: fetched into L2, loaded into L1 by admit
            req = self.cache.admit(tokens, ns=ns, prefetch=self.cache.prefetch(tokens, ns=ns))
        else:
            req = self.cache.admit(tokens, ns=ns)
        n, full_m = req.hit_pages, req.full_hit_pages
        assert self.shared or req.l2_hit_pages == req.l3_hit_pages == 0, "a full page came from a tier with no bytes"
        moves = [] if self.plane else self.take(hashes) if self.async_moves else self.cache.take_moves()
        if self.plant == "window" and not self.planted:
            self.plant_lost_page(moves)
        if self.plane:  # kvtier loads the hit's pieces; a piece that failed: recompute it all
            self.plane_failed = not self.cache.pieces_wait(req)
        elif self.async_moves:  # its loads, run with the other moves outstanding, until they all landed
            while self.cache.ready(req) is False:
                self.copies["waits"] += 1
                self.progress()
                moves += self.take(hashes)
        else:
            self.run_moves(moves, hashes)
        loaded = {}  # (group, L1 slot) -> the tier the admission loaded it from
        for mv in moves:
            if mv.dst_tier == 1:
                loaded[mv.group, mv.dst_slot] = mv.src_tier
        failed = self.plane_failed if self.plane else self.async_moves and self.cache.ready(req) is None
        self.copies["failed_hits"] += failed
        pieces, bad = ({g: {} for g in self.pool}, {g: set() for g in self.pool}) if failed else \
            self.hit_pieces(req, hashes)
        if self.plane:  # no headers travel: the plane's checksums are the guard
            bad = {g: set() for g in self.pool}
        use = 0 if failed else full_m if self.trust_full else n  # a piece that failed: recompute it all
        cut = 0
        if self.guard and any(bad.values()):
            new_use = kvtier.hybrid_longest(self.groups, P, use, self.present(pieces, bad, use))
            cut, use = use - new_use, new_use
        l3_pieces = {g: 0 for g in self.pool}  # pieces of the hit used that were loaded from L3
        if use and not cut:
            for g in self.pool:
                l3_pieces[g] = sum(loaded.get((g, s), 1) == 3 for s in pieces[g].values())
                tiers = {loaded.get((g, s), 1) for s in pieces[g].values()}
                for s in pieces[g].values():
                    self.pieces_from[g][loaded.get((g, s), 1)] += 1
                for t in tiers:
                    self.hits_from[g][t] += 1
        assert use * P < len(tokens), "a request ends inside a page: its last token is always computed"
        ids = torch.from_numpy(tokens.astype(np.int64) % m.vocab)
        points = kept_points(n, full_m, npages, self.every)
        if cut and self.gs is not None and n - 1 in bad[self.gs]:
            points.append(n)  # to rewrite the bad checkpoint
        shift = P if self.plant == "checkpoint" else 0  # the planted bug: the state one page early
        past = self.past(req, pieces, use)
        logits, new = m.forward(ids[use * P:], use * P, past, snap_at=[c * P - shift for c in points])
        base = use * P  # the position of new[...][0]
        for j, l in enumerate(self.st):  # the state it started from is the state at base
            new[l][base] = past[l] if past else torch.zeros(m.state_shape())
        if req.pages > full_m:  # the full layers' new pages: their KV goes to L1
            dst = torch.tensor(list(req.l1_ids[full_m:req.pages]), dtype=torch.int64)
            off = (full_m - use) * P
            cnt = req.pages - full_m
            for l in self.full:
                k, v = new[l]
                self.k[l][dst] = k[off: off + cnt * P].reshape(cnt, P, m.h, m.dh)
                self.v[l][dst] = v[off: off + cnt * P].reshape(cnt, P, m.h, m.dh)

        def computed(g, i):
            o = i * P - (shift if g == self.gs else 0) - base
            if o < 0:  # a piece it did not compute: only a resume past n skips one
                return torch.zeros(self.pool[g][0].shape[1:])
            if g == self.gs:
                self.planted += shift > 0
                return torch.stack([new[l][base + o] for l in self.st])
            return torch.stack([torch.stack([new[l][0][o:o + P], new[l][1][o:o + P]]) for l in self.win])

        def has(g, i):  # the piece is among what it computed: a window page past base, a state it kept
            o = i * P - (shift if g == self.gs else 0) - base
            return o >= 0 and (base + o in new[self.st[0]] if g == self.gs else o + P <= len(new[self.win[0]][0]))
        computed.has = has

        for g in bad:  # a piece that failed its check, recomputed: its L1 slot holds it again
            for p in bad[g]:
                if p >= use:
                    self.pool[g][0][pieces[g][p]] = computed(g, p + (g == self.gs))
                    self.header[g][0][pieces[g][p]] = self.key(hashes[p])
        for c in points:
            if self.st and c > n:
                if c != npages and c % self.every:
                    self.branch_points.add(hashes[c - 1])
                else:
                    self.branch_points.discard(hashes[c - 1])
        self.cache.release(req, tokens)
        if self.plane:  # what it computed goes in (write_piece), and every copy it starts lands
            self.computing = computed
            try:
                self.cache.pieces_sync()
            finally:
                self.computing = None
        elif self.async_moves:
            self.take(hashes, computed)
            if self.cache.engine_waiting(tokens, ns):  # its pieces stay until the moves from them are handed out
                self.kept.append((tokens, ns, hashes, computed))
                self.copies["kept_most"] = max(self.copies["kept_most"], len(self.kept))
            if self.rng.random() < 0.5:  # copies go on between requests: now all of them, now half
                self.drain()
            else:
                self.progress()
            self.take([])
            self.kept = [k for k in self.kept if self.cache.engine_waiting(k[0], k[1])]
        else:
            self.run_moves(self.cache.take_moves(), hashes, computed)
        return logits, {"n": n, "m": full_m, "use": use, "cut": cut, "short_by": req.short_by,
                        "at_branch": use > 0 and hashes[use - 1] in self.branch_points,
                        # full pages of the resume that came from L3 (they come after the L1 and L2 hits)
                        "full_l3": max(0, min(use, full_m) - req.l1_hit_pages - req.l2_hit_pages),
                        "full_l3_foreign": req.l3_foreign_pages, "l3_pieces": l3_pieces}


def prompts(trace, requests, block_tokens, max_blocks, page_tokens, seed, turns="all"):
    """Token sequences of three kinds:

      first turns   the trace's requests that share a first block with
                    another: their hash ids as blocks of block_tokens
                    tokens (a random number of them up to max_blocks, so
                    that requests sharing a prefix stop at different
                    points), then a question of a few tokens
      next turns    a first turn two requests later: its tokens, an
                    answer and a new question
      two questions an earlier first turn cut inside (a document, then two
                    different questions about it, one after the other):
                    the first branches off mid-page, the second from the
                    same point

    No sequence ends on a page boundary, so its last token is computed.
    ``turns``: "all" of them in that order; "first" the first turns alone;
    "next" the others alone (the same sequences: two engines serving
    "first" and "next" serve together what one serving "all" does)."""
    rng = random.Random(seed)
    reqs = ktrace.load(trace)
    first = {}
    for r in reqs:
        if r.hash_ids:
            first[r.hash_ids[0]] = first.get(r.hash_ids[0], 0) + 1
    reqs = [r for r in reqs if r.hash_ids and first[r.hash_ids[0]] > 1][:requests]

    def tail(t, lo, hi):
        k = rng.randrange(lo, hi)
        if (len(t) + k) % page_tokens == 0:
            k += 1
        return np.concatenate([t, np.array([rng.randrange(1 << 30) for _ in range(k)], np.int32)])

    firsts = [tail(ktrace.block_tokens(r.hash_ids[:rng.randrange(1, max_blocks + 1)], block_tokens), 1, page_tokens)
              for r in reqs]
    out = []  # (first turn?, tokens)
    for i, t in enumerate(firsts):
        out.append((True, t))
        if i >= 2:
            out.append((False, tail(firsts[i - 2], 2 * page_tokens, 4 * page_tokens)))
        if i >= 4 and i % 3 == 0 and len(firsts[i - 4]) > 2 * page_tokens:
            doc = firsts[i - 4][:rng.randrange(2 * page_tokens, len(firsts[i - 4]))]
            out += [(False, tail(doc, 2 * page_tokens, 4 * page_tokens)),
                    (False, tail(doc, 2 * page_tokens, 4 * page_tokens))]
    return [t for first, t in out if turns == "all" or first == (turns == "first")]


_REFERENCE = {}  # (model, tokens) -> the full recompute's logits: the runs of one process share them


def reference(model, tokens):
    key = (model.seed, model.kinds, model.W, model.d, model.h, model.vocab, tokens.tobytes())
    if key not in _REFERENCE:
        _REFERENCE[key], _ = model.forward(torch.from_numpy(tokens.astype(np.int64) % model.vocab))
    return _REFERENCE[key]


def run(args):
    torch.manual_seed(args.seed)
    model = TinyHybridModel(KINDS, args.window, args.d_model, args.heads, args.vocab, args.seed)
    policy = args.write_policy or ("write_through" if args.l3 else "write_back")
    eng = HybridEngine(model, args.page_tokens, args.checkpoint_every, policy, args.window_slots,
                       args.state_slots, args.full_pages, guard=not args.no_guard, trust_full=args.trust_full,
                       plant=args.plant, l3=args.l3, async_moves=args.async_moves, fail_copies=args.fail_copies,
                       seed=args.seed, plane=args.plane)
    res = {"requests": 0, "hits": 0, "short_hits": 0, "cut_hits": 0, "branch_hits": 0, "short_by": {}, "guard_cuts": 0,
           "computed_tokens": 0, "recompute_tokens": 0, "max_rel_err": 0.0, "mismatches": 0,
           "mismatch_resumed": 0, "planted": 0, "write_policy": policy}
    if args.l3:
        # hits that resumed from full pages out of L3 and pieces out of L3 in every group; their tokens;
        # the full pages' tokens resumed from L3
        res.update(l3_hits=0, l3_hit_tokens=0, l3_full_hit_tokens=0, l3_full_foreign_pages=0)
    try:
        for tokens in prompts(args.trace, args.requests, args.block_tokens, args.max_blocks, args.page_tokens,
                              args.seed, args.turns):
            logits, info = eng.serve(tokens)
            if args.l3:
                res["l3_full_hit_tokens"] += info["full_l3"] * args.page_tokens
                res["l3_full_foreign_pages"] += info["full_l3_foreign"]
                if info["full_l3"] and all(info["l3_pieces"].values()):
                    res["l3_hits"] += 1
                    res["l3_hit_tokens"] += info["use"] * args.page_tokens
            ref = reference(model, tokens)
            err = float((logits - ref).abs().max() / ref.abs().max())
            res["max_rel_err"] = max(res["max_rel_err"], err)
            if err > args.tolerance:
                res["mismatches"] += 1
                res["mismatch_resumed"] += info["use"] > 0
            res["requests"] += 1
            res["hits"] += info["n"] > 0
            res["short_hits"] += info["n"] < info["m"]
            res["cut_hits"] += 0 < info["n"] < info["m"]
            if info["n"] < info["m"]:
                res["short_by"][info["short_by"]] = res["short_by"].get(info["short_by"], 0) + 1
            res["guard_cuts"] += info["cut"] > 0
            res["branch_hits"] += info["at_branch"]
            res["computed_tokens"] += len(tokens) - info["use"] * args.page_tokens
            res["recompute_tokens"] += len(tokens)
        if args.async_moves:
            eng.drain()
            res["copies"] = eng.copies
        if args.plane:
            eng.cache.pieces_sync()
            res["plane"] = eng.cache.pieces_stats()
            res["plane"]["failed_hits"] = eng.copies["failed_hits"]  # a piece that did not come: recomputed
        eng.cache.check()
        res["planted"] = eng.planted
        res["bad_copies"] = eng.bad_copies
        tiers = ("engine", "l1", "l2", "l3")
        for name, counts in (("l1_moves_from", eng.l1_moves), ("hit_pieces_from", eng.pieces_from),
                             ("hits_from", eng.hits_from)):
            res[name] = {eng.groups[g].kind: {t: c[i] for i, t in enumerate(tiers) if c[i] or name != "l1_moves_from"
                                               and i} for g, c in counts.items()}
        res["cache"] = {k: v for k, v in eng.cache.stats().items() if v}
        if args.l3:
            eng.cache.sync()
            st = eng.cache.cache_stats()
            res["l3_full"] = {k: st[k] for k in ("l3_hit_tokens", "l3_foreign_hit_tokens", "l3_puts",
                                                 "l3_put_failures", "l3_misses")}
            res["l3_full"]["bad_objects"] = eng.store.stats("get")["bad_objects"]
            if not args.plane:  # with the plane, its counters (put, got, get_misses) say what the store did
                res["l3_pieces"] = {eng.groups[g].kind: {"put": eng.l3_puts[g], "put_skipped": eng.l3_puts_skipped[g],
                                                         "loaded": eng.l3_gets[g], "foreign": eng.l3_foreign[g],
                                                         "not_served": eng.l3_get_misses[g]} for g in eng.pool}
            res["probe_errors"] = eng.cache.probe_errors
    finally:
        eng.close()
    return res


def slots(text):
    """L1,L2,L3 slot counts."""
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        out = ()
    if len(out) != 3 or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected three counts >= 1, L1,L2,L3")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(HERE.parent / "data" / "mooncake_synthetic_trace.jsonl"))
    p.add_argument("--requests", type=int, default=40, help="first turns taken from the trace (40)")
    p.add_argument("--block-tokens", type=int, default=32, help="tokens a trace hash id stands for here (32)")
    p.add_argument("--max-blocks", type=int, default=8, help="hash ids of a request used at most (8)")
    p.add_argument("--page-tokens", type=int, default=16)
    p.add_argument("--window", type=int, default=24, help="W of the window layers (24)")
    p.add_argument("--checkpoint-every", type=int, default=4, help="a kept point every this many pages (4)")
    p.add_argument("--write-policy", choices=("write_through", "write_back"), default=None,
                   help="L1 -> L2 and L2 -> L3 (write_back; with --l3 write_through, and L2 -> L3 always"
                        " write_through)")
    p.add_argument("--l3", metavar="URL", default=None,
                   help="share through this store (redis://HOST:PORT, dir:PATH) with other engines: the full"
                        " layers' pages and the window pages and checkpoints (default: a modeled L3, no bytes"
                        " shared)")
    p.add_argument("--turns", choices=("all", "first", "next"), default="all",
                   help="serve all the prompts, only the first turns, or only the others (all)")
    p.add_argument("--window-slots", type=slots, default=(6, 16, 40),
                   help="window pages the L1, L2 and L3 slots hold (6,16,40)")
    p.add_argument("--state-slots", type=slots, default=(3, 8, 20), help="checkpoints per tier (3,8,20)")
    p.add_argument("--full-pages", type=int, default=4096,
                   help="full pages in L1 and L2 (4096): enough that none leaves L1 (without --l3 their L2 and"
                        " L3 hold no bytes)")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative logits difference allowed (1e-5)")
    p.add_argument("--no-guard", action="store_true", help="trust the cache's claim without checking the store")
    p.add_argument("--trust-full", action="store_true", help="resume from the full groups' match m (bypass the rule)")
    p.add_argument("--plant", choices=("checkpoint", "window"), help="a bug the logits check must catch")
    p.add_argument("--async-moves", action="store_true",
                   help="run the cache's moves out of order, about half of those outstanding at a time")
    p.add_argument("--fail-copies", type=float, default=0.0, metavar="F",
                   help="with --async-moves: the share of copies that fail (0)")
    p.add_argument("--plane", action="store_true",
                   help="kvtier moves the pieces (Hybrid.attach_pieces): the engine only writes what it computed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if not 0 <= a.fail_copies < 1 or (a.fail_copies and not a.async_moves):
        p.error("--fail-copies: a share in [0, 1), with --async-moves")
    if not 1 <= a.block_tokens <= 512:
        p.error("--block-tokens: must be in 1..512")
    if a.d_model % a.heads:
        p.error("--d-model must be a multiple of --heads")
    if a.plane and (a.async_moves or a.plant == "window"):
        p.error("--plane: kvtier runs the moves (not with --async-moves or --plant window, which run them here)")
    torch.set_num_threads(1)
    res = run(a)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v}")
    return 0 if res["mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
