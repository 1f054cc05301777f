#!/usr/bin/env python3
"""A small real engine on kvtier: a decoder-only transformer in torch (CPU,
float32, random weights from a fixed seed) with paged attention over
per-layer K and V tensors that are kvtier's L1 tier, an L2 host tier behind
them and an L3 store behind that. It serves requests whose token ids come
from a Mooncake trace; kvtier decides what is reused (an L1 hit), loaded back
(from L2) or fetched (from L3), and the engine computes only the rest. For
every request the logits of its last token are compared with those of a full
recompute without any cache.

    .venv/bin/python examples/tiny_engine.py                 # the default scenario, all three tiers
    .venv/bin/python examples/tiny_engine.py --json          # one JSON object
    .venv/bin/python examples/tiny_engine.py --l3 redis://127.0.0.1:6379 --rounds 1

The default scenario serves the first --requests requests of the trace
--rounds times over an L1 and an L2 too small to keep them all, so later
rounds find their prefixes in L1, in L2 and in L3; between rounds it
corrupts (--corrupt) every valid page in L2 and one object in L3 on purpose:
they are refused by their checksums and recomputed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import socket
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # an in-tree run finds the package without an install

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier import trace as ktrace  # noqa: E402


class TinyModel:
    """Pre-norm decoder blocks: attention with learned-free sinusoidal
    positions, a GELU MLP; vocab ids are token ids modulo ``vocab``."""

    def __init__(self, layers=2, d_model=64, heads=4, vocab=1024, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.layers, self.d, self.h, self.dh, self.vocab = layers, d_model, heads, d_model // heads, vocab

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        self.emb = torch.randn(vocab, d_model, generator=g)
        self.wq = [w(d_model, d_model) for _ in range(layers)]
        self.wk = [w(d_model, d_model) for _ in range(layers)]
        self.wv = [w(d_model, d_model) for _ in range(layers)]
        self.wo = [w(d_model, d_model) for _ in range(layers)]
        self.w1 = [w(d_model, 4 * d_model) for _ in range(layers)]
        self.w2 = [w(4 * d_model, d_model) for _ in range(layers)]
        self.out = w(d_model, vocab)

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

    def forward(self, ids, past=None):
        """Logits of the last token and each layer's (K, V) of the new tokens
        [n, heads, head_dim], given the K and V of the ``past`` prefix (a list
        of (K, V) per layer, or None)."""
        start = past[0][0].shape[0] if past else 0
        n = ids.shape[0]
        x = self.emb[ids] + self.positions(start, n)
        kv = []
        # causal: new token i (position start + i) sees positions <= start + i
        mask = torch.arange(start + n)[None, :] > (start + torch.arange(n))[:, None]
        for l in range(self.layers):
            hx = self.norm(x)
            q = (hx @ self.wq[l]).view(n, self.h, self.dh)
            k = (hx @ self.wk[l]).view(n, self.h, self.dh)
            v = (hx @ self.wv[l]).view(n, self.h, self.dh)
            kv.append((k, v))
            ka = torch.cat([past[l][0], k]) if past else k
            va = torch.cat([past[l][1], v]) if past else v
            s = torch.einsum("ihd,jhd->hij", q, ka) / math.sqrt(self.dh)
            s = s.masked_fill(mask[None], float("-inf"))
            a = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), va).reshape(n, self.d)
            x = x + a @ self.wo[l]
            x = x + torch.nn.functional.gelu(self.norm(x) @ self.w1[l]) @ self.w2[l]
        return (self.norm(x[-1]) @ self.out), kv


class Engine:
    """The model over kvtier: L1 = per-layer K and V tensors (an engine tier),
    L2 = a checksummed host tier, L3 = a store shared by every engine on it."""

    def __init__(self, model, l1_pages, l2_pages, page_tokens, l3_url, prefetch_policy="wait_complete"):
        self.m, self.pt = model, page_tokens
        shape = (l1_pages, page_tokens, model.h, model.dh)
        self.k = [torch.zeros(shape) for _ in range(model.layers)]
        self.v = [torch.zeros(shape) for _ in range(model.layers)]
        self.l1 = kvtier.Tier.from_tensors(self.k, self.v, dtype=torch.float32)
        piece = page_tokens * model.h * model.dh * 4
        self.l2 = kvtier.Tier.host(l2_pages, model.layers, 2 * piece, checksum=True)
        self.xfer = kvtier.Transfer([self.l1, self.l2], threads=1)
        self.cache = kvtier.Cache(l1_pages=l1_pages, l2_pages=l2_pages, page_tokens=page_tokens,
                                  write_policy="write_through", l3_write_policy="write_through",
                                  prefetch_policy=prefetch_policy, prefetch_threshold=page_tokens)
        self.cache.attach(self.xfer, self.l1, self.l2)
        self.store = None
        if l3_url:
            self.store = kvtier.Store(l3_url, tier=self.l2, page_tokens=page_tokens, dtype_bytes=4,
                                      model=f"tiny-{model.layers}x{model.d}x{model.h}-v{model.vocab}")
            self.cache.attach_store(self.store)

    def close(self):
        for o in (self.cache, self.store, self.xfer, self.l2, self.l1):
            if o is not None:
                o.close()

    def serve(self, tokens):
        """One request: (logits, request, seconds spent computing)."""
        pf = self.cache.prefetch(tokens)
        req = self.cache.admit(tokens, prefetch=pf)
        hit = req.hit_pages
        # the last token is always computed (its logits are the output): a request
        # cached whole reuses all pages but its last
        use = min(hit, (len(tokens) - 1) // self.pt)
        ids = torch.from_numpy(tokens.astype(np.int64) % self.m.vocab)
        t0 = time.perf_counter()
        past = None
        if use:
            pages = torch.tensor(list(req.l1_ids[:use]), dtype=torch.int64)
            past = [(self.k[l][pages].reshape(-1, self.m.h, self.m.dh), self.v[l][pages].reshape(-1, self.m.h, self.m.dh))
                    for l in range(self.m.layers)]
        logits, kv = self.m.forward(ids[use * self.pt:], past)
        new = req.pages - hit  # whole pages the cache gave us for the new part: their KV goes to L1
        if new:
            dst = torch.tensor(list(req.l1_ids[hit:req.pages]), dtype=torch.int64)
            off = (hit - use) * self.pt  # the recomputed hit page comes first in kv
            for l, (k, v) in enumerate(kv):
                self.k[l][dst] = k[off: off + new * self.pt].reshape(new, self.pt, self.m.h, self.m.dh)
                self.v[l][dst] = v[off: off + new * self.pt].reshape(new, self.pt, self.m.h, self.m.dh)
        dt = time.perf_counter() - t0
        req.commit()
        req.release()
        return logits, req, use, dt


def corrupt_l2(engine):
    """Flips a byte of every L2 page that holds a valid copy (its bytes match
    the checksum the tier keeps for it): each load of one must be refused."""
    l2, n = engine.l2, 0
    sums = l2.checksums()
    for p in range(l2.pages):
        if sums[p] and l2.page_sum(p) == sums[p]:
            l2.view(p)[7] ^= 0x5A
            n += 1
    return n


def corrupt_l3(url, store, hashes):
    """Flips a payload byte of the first of these objects the store has: a
    file under a dir store, a Redis key through SETRANGE. The byte is the
    high byte of a float32 (sign and exponent), so that KV served from it
    would change the logits far past the check's tolerance: a low mantissa
    byte moves them by 3e-7, which the check cannot see."""
    for h in hashes:
        key = store.key(h)
        if url.startswith("dir:"):
            root = url[4:].split(",")[0]
            path = pathlib.Path(root, key[0:2], key)
            if path.exists():
                data = bytearray(path.read_bytes())
                data[len(data) // 2 | 3] ^= 0x5A  # a payload byte (the header is last, format v2)
                path.write_bytes(bytes(data))
                return 1
        elif url.startswith("redis://"):
            host, port = url[len("redis://"):].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=5) as s:
                def cmd(*args):
                    b = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
                    s.sendall(b)
                    return s.recv(4096)
                name = b"kvt:" + key.encode()
                size = cmd(b"STRLEN", name)
                n = int(size[1:].split(b"\r\n")[0])
                if n > 0:
                    off = str(n // 2 | 3).encode()  # a payload byte (the header is last, format v2), flipped
                    byte = cmd(b"GETRANGE", name, off, off).split(b"\r\n")[1][:1]
                    cmd(b"SETRANGE", name, off, bytes([byte[0] ^ 0x5A]))
                    return 1
    return 0


def run(args):
    model = TinyModel(args.layers, args.d_model, args.heads, args.vocab, args.seed)
    reqs = ktrace.load(args.trace)
    if not args.all_requests:  # the requests that share a first block with another: sessions, shared prompts
        first = {}
        for r in reqs:
            if r.hash_ids:
                first[r.hash_ids[0]] = first.get(r.hash_ids[0], 0) + 1
        reqs = [r for r in reqs if r.hash_ids and first[r.hash_ids[0]] > 1]
    reqs = reqs[: args.requests]
    prompts = []
    for r in reqs:  # a hash id is a block of --block-tokens tokens here (512 in the trace), at most --max-blocks
        ids = r.hash_ids[: args.max_blocks]
        prompts.append(ktrace.block_tokens(ids, args.block_tokens))
    tmp = None
    url = args.l3
    if url is None:
        tmp = tempfile.mkdtemp(prefix="kvtier-tiny-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        url = f"dir:{tmp}"
    eng = Engine(model, args.l1_pages, args.l2_pages, args.page_tokens, url if url != "none" else None,
                 args.prefetch_policy)
    res = {"requests": 0, "l1_hit_tokens": 0, "l2_hit_tokens": 0, "l3_hit_tokens": 0, "l3_foreign_hit_tokens": 0,
           "computed_tokens": 0, "recompute_tokens": 0, "max_rel_err": 0.0, "corrupt_pages_refused": 0,
           "cached_s": 0.0, "recompute_s": 0.0, "rounds": args.rounds, "l3": url, "mismatches": 0}
    corrupted = {"l2": 0, "l3": 0}
    try:
        for rnd in range(args.rounds):
            if rnd == 1 and args.corrupt != "none":
                eng.cache.sync()
                if args.corrupt in ("l2", "both"):
                    corrupted["l2"] += corrupt_l2(eng)
                if args.corrupt in ("l3", "both") and eng.store is not None:
                    hashes = [h for p in prompts[::-1] for h in kvtier.page_hashes(p, args.page_tokens)]
                    corrupted["l3"] += corrupt_l3(url, eng.store, hashes)
            for tokens in prompts:
                logits, req, used, dt = eng.serve(tokens)
                t0 = time.perf_counter()
                ref, _ = model.forward(torch.from_numpy(tokens.astype(np.int64) % model.vocab))
                res["recompute_s"] += time.perf_counter() - t0
                res["cached_s"] += dt
                err = float((logits - ref).abs().max() / ref.abs().max())
                res["max_rel_err"] = max(res["max_rel_err"], err)
                if err > args.tolerance:
                    res["mismatches"] += 1
                pt = args.page_tokens
                res["requests"] += 1
                res["l1_hit_tokens"] += req.l1_hit_pages * pt
                res["l2_hit_tokens"] += req.l2_hit_pages * pt
                res["l3_hit_tokens"] += req.l3_hit_pages * pt
                res["l3_foreign_hit_tokens"] += req.l3_foreign_pages * pt
                res["computed_tokens"] += len(tokens) - used * pt
                res["recompute_tokens"] += len(tokens)
        eng.cache.sync()
        st = eng.cache.stats()
        bad = eng.store.stats("get")["bad_objects"] if eng.store is not None else 0
        res["corrupted"] = corrupted
        res["l2_pages_refused"] = st["corrupt_dropped"]
        res["l2_loads_refused"] = st["integrity_failures"]
        res["l3_objects_refused"] = bad
        res["corrupt_pages_refused"] = st["corrupt_dropped"] + bad
        res["saved_tokens"] = res["recompute_tokens"] - res["computed_tokens"]
        res["speedup"] = res["recompute_s"] / res["cached_s"] if res["cached_s"] else 0.0
        eng.cache.check()
    finally:
        eng.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(HERE.parent / "data" / "mooncake_synthetic_trace.jsonl"))
    p.add_argument("--requests", type=int, default=24, help="requests of the trace served per round (24)")
    p.add_argument("--all-requests", action="store_true",
                   help="serve the trace's requests in order (default: only those sharing a first block with another)")
    p.add_argument("--rounds", type=int, default=3, help="times the requests are served (3)")
    p.add_argument("--block-tokens", type=int, default=32, help="tokens a trace hash id stands for here (32; 1..512)")
    p.add_argument("--max-blocks", type=int, default=8, help="hash ids of a request used at most (8)")
    p.add_argument("--page-tokens", type=int, default=16)
    p.add_argument("--l1-pages", type=int, default=48, help="L1 pages (48: fewer than a round needs)")
    p.add_argument("--l2-pages", type=int, default=128, help="L2 pages (128)")
    p.add_argument("--l3", default=None, help="store URL (default: a dir store in a temporary directory; none: no L3)")
    p.add_argument("--prefetch-policy", default="wait_complete", choices=kvtier.PREFETCH_POLICIES)
    p.add_argument("--corrupt", default="both", choices=("none", "l2", "l3", "both"),
                   help="between rounds, corrupt L2's valid pages and/or an object in L3 (both)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative logits difference allowed (1e-5)")
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
