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
layers' for [nP - W, nP) and the state at nP from its own store, and
computes the rest. For every request the logits of its last token are
compared with those of a full recompute without any cache.

The engine keeps the window pages and checkpoints itself, by the chained
hash of their page (kvtier.page_hashes): the hybrid cache names the pieces
only inside (hybrid.h), so the store mirrors what the cache keeps (what a
request leaves behind, hybrid.h) and never evicts; the cache's answer is a
claim the store can check (--no-guard skips that check). The cache has an
L1 only: it moves no bytes, so a load-back from L2 would hand the engine an
L1 page it never filled.

    .venv/bin/python examples/tiny_hybrid.py            # the default scenario
    .venv/bin/python examples/tiny_hybrid.py --json     # one JSON object

Plants that the logits check must catch: --plant checkpoint stores the
state after n - 1 pages as the checkpoint at n; --plant window drops a
window page from the store that the cache still claims (caught by the
store's check, or by the logits without it); --trust-full resumes from the
full groups' match m, not from n (the match rule bypassed).
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
            out.append(torch.einsum("hd,hde->he", q[t], S))
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
    """The model over kvtier.Hybrid. Full layers: K and V tensors indexed by
    the full groups' L1 pages. Window layers: a page's K and V (every window
    layer's) by the chained hash of the page. State layers: a checkpoint
    (every state layer's state) by the chained hash of the page before it."""

    def __init__(self, model, page_tokens=16, l1_bytes=1 << 20, checkpoint_every=4, window_weight=1.0, guard=True,
                 trust_full=False, plant=None):
        self.m, self.P = model, page_tokens
        self.groups = model.groups()
        self.cache = kvtier.Hybrid(self.groups, page_tokens=page_tokens, l1_bytes=l1_bytes,
                                   window_weight=window_weight, checkpoint_every=checkpoint_every)
        self.every = checkpoint_every
        self.full, self.win, self.st = (model.layers_of(k) for k in ("full", "window", "state"))
        shape = (self.cache.config["l1_pages"], page_tokens, model.h, model.dh)
        self.k = {l: torch.zeros(shape) for l in self.full}
        self.v = {l: torch.zeros(shape) for l in self.full}
        self.window_pages = {}  # hash -> [window layers, 2, P, heads, head_dim]
        self.checkpoints = {}   # hash of page c - 1 -> [state layers, *state_shape]
        self.guard, self.trust_full, self.plant = guard, trust_full, plant
        self.planted = 0
        self.branch_points = set()  # checkpoints kept only because a request branched there

    def close(self):
        self.cache.close()

    def first_needed(self, n):
        return max(0, n * self.P - self.m.W) // self.P

    def has(self, hashes, n):
        """The store holds what continuing from n pages needs."""
        ok = all(hashes[i] in self.window_pages for i in range(self.first_needed(n), n)) if self.win else True
        return ok and (n == 0 or not self.st or hashes[n - 1] in self.checkpoints)

    def present(self, hashes, n):
        """The store's presence as kvtier.hybrid_longest takes it."""
        out = []
        for gr in self.groups:
            if gr.kind == "window":
                out.append([h in self.window_pages for h in hashes[:n]])
            elif gr.kind == "state":
                out.append([True] + [h in self.checkpoints for h in hashes[:n]])
            else:
                out.append(None)
        return out

    def past(self, req, hashes, use):
        """Each layer's past for continuing from ``use`` pages, from the
        engine's stores; a piece the store lacks reads as zeros (an empty
        slot), which is what an engine that trusts a wrong claim computes with."""
        P, m = self.P, self.m
        if use == 0:
            return None
        past = [None] * len(m.kinds)
        pages = torch.tensor(list(req.l1_ids[:use]), dtype=torch.int64)
        for l in self.full:
            past[l] = (self.k[l][pages].reshape(-1, m.h, m.dh), self.v[l][pages].reshape(-1, m.h, m.dh))
        if self.win:
            lo = self.first_needed(use)
            empty = torch.zeros(len(self.win), 2, P, m.h, m.dh)
            kv = torch.cat([self.window_pages.get(hashes[i], empty) for i in range(lo, use)], dim=2)
            skip = max(0, use * P - m.W) - lo * P  # [nP - W, nP) exactly
            for j, l in enumerate(self.win):
                past[l] = (kv[j, 0, skip:], kv[j, 1, skip:])
        if self.st:
            s = self.checkpoints.get(hashes[use - 1], torch.zeros(len(self.st), *m.state_shape()))
            for j, l in enumerate(self.st):
                past[l] = s[j]
        return past

    def serve(self, tokens, ns=0):
        """One request: (logits, what happened)."""
        P, m = self.P, self.m
        req = self.cache.admit(tokens, ns=ns)
        n, full_m = req.hit_pages, req.full_hit_pages
        hashes = kvtier.page_hashes(tokens, P, ns)
        npages = len(hashes)
        if self.plant == "window" and not self.planted and self.win and n > 0:
            self.window_pages.pop(hashes[n - 1], None)  # the store loses a page the cache still claims
            self.planted += 1
        use = full_m if self.trust_full else n
        cut = 0
        if self.guard and not self.has(hashes, use):
            new_use = kvtier.hybrid_longest(self.groups, P, use, self.present(hashes, use))
            cut, use = use - new_use, new_use
        assert use * P < len(tokens), "a request ends inside a page: its last token is always computed"
        ids = torch.from_numpy(tokens.astype(np.int64) % m.vocab)
        points = kept_points(n, full_m, npages, self.every)
        shift = P if self.plant == "checkpoint" else 0  # the planted bug: the state one page early
        logits, new = m.forward(ids[use * P:], use * P, self.past(req, hashes, use),
                                snap_at=[c * P - shift for c in points])
        base = use * P  # the position of new[...][0]
        if req.pages > full_m:  # the full layers' new pages: their KV goes to L1
            dst = torch.tensor(list(req.l1_ids[full_m:req.pages]), dtype=torch.int64)
            off = (full_m - use) * P
            cnt = req.pages - full_m
            for l in self.full:
                k, v = new[l]
                self.k[l][dst] = k[off: off + cnt * P].reshape(cnt, P, m.h, m.dh)
                self.v[l][dst] = v[off: off + cnt * P].reshape(cnt, P, m.h, m.dh)
        if self.win:  # every window page it computed: those the cache keeps, [n, npages), and any below n
            for i in range(use, npages):
                o = i * P - base
                self.window_pages[hashes[i]] = torch.stack(
                    [torch.stack([new[l][0][o:o + P], new[l][1][o:o + P]]) for l in self.win])
        if self.st:
            for c in points:
                if c * P - shift > base:
                    self.checkpoints[hashes[c - 1]] = torch.stack([new[l][c * P - shift] for l in self.st])
                    if c != npages and c % self.every:
                        self.branch_points.add(hashes[c - 1])
                    else:
                        self.branch_points.discard(hashes[c - 1])
                    self.planted += shift > 0
        self.cache.release(req, tokens)
        return logits, {"n": n, "m": full_m, "use": use, "cut": cut, "short_by": req.short_by,
                        "at_branch": use > 0 and hashes[use - 1] in self.branch_points}


def prompts(trace, requests, block_tokens, max_blocks, page_tokens, seed):
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

    No sequence ends on a page boundary, so its last token is computed."""
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
    out = []
    for i, t in enumerate(firsts):
        out.append(t)
        if i >= 2:
            out.append(tail(firsts[i - 2], 2 * page_tokens, 4 * page_tokens))
        if i >= 4 and i % 3 == 0 and len(firsts[i - 4]) > 2 * page_tokens:
            doc = firsts[i - 4][:rng.randrange(2 * page_tokens, len(firsts[i - 4]))]
            out += [tail(doc, 2 * page_tokens, 4 * page_tokens), tail(doc, 2 * page_tokens, 4 * page_tokens)]
    return out


def run(args):
    torch.manual_seed(args.seed)
    model = TinyHybridModel(KINDS, args.window, args.d_model, args.heads, args.vocab, args.seed)
    eng = HybridEngine(model, args.page_tokens, args.l1_kib << 10, args.checkpoint_every, args.window_weight,
                       guard=not args.no_guard, trust_full=args.trust_full, plant=args.plant)
    res = {"requests": 0, "hits": 0, "short_hits": 0, "cut_hits": 0, "branch_hits": 0, "short_by": {}, "guard_cuts": 0,
           "computed_tokens": 0, "recompute_tokens": 0, "max_rel_err": 0.0, "mismatches": 0,
           "mismatch_resumed": 0, "planted": 0}
    try:
        for tokens in prompts(args.trace, args.requests, args.block_tokens, args.max_blocks, args.page_tokens,
                              args.seed):
            logits, info = eng.serve(tokens)
            ref, _ = model.forward(torch.from_numpy(tokens.astype(np.int64) % model.vocab))
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
        eng.cache.check()
        res["planted"] = eng.planted
        res["cache"] = {k: v for k, v in eng.cache.stats().items() if v}
    finally:
        eng.close()
    return res


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
    p.add_argument("--l1-kib", type=int, default=1024, help="the hybrid cache's L1 bytes, KiB (1024)")
    p.add_argument("--window-weight", type=float, default=1.0,
                   help="a window group's bytes per token weighed so in L1's split (1; kvt_hybrid_config_split)")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative logits difference allowed (1e-5)")
    p.add_argument("--no-guard", action="store_true", help="trust the cache's claim without checking the store")
    p.add_argument("--trust-full", action="store_true", help="resume from the full groups' match m (bypass the rule)")
    p.add_argument("--plant", choices=("checkpoint", "window"), help="a bug the logits check must catch")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if not 1 <= a.block_tokens <= 512:
        p.error("--block-tokens: must be in 1..512")
    if a.d_model % a.heads:
        p.error("--d-model must be a multiple of --heads")
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
