"""scripts/bench-ab at smoke size: two builds (here one build twice) side by side."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
KVTIER = os.environ.get("KVTIER_BIN", str(ROOT / "build" / "kvtier"))
AB = str(ROOT / "scripts" / "bench-ab")


def run(*args):
    return subprocess.run([sys.executable, AB, *args], capture_output=True, text=True, timeout=120)


def test_bench_ab_compares_two_builds_on_one_configuration():
    out = run(KVTIER, KVTIER, "3", "--limit", "300", "--policy", "lru")
    assert out.returncode == 0, out.stderr
    o = json.loads(out.stdout)
    assert o["rounds"] == 3 and o["args"] == "--limit 300 --policy lru"
    assert o["hit_rates_equal"] is True
    for k in ("base_wall_s", "new_wall_s", "speedup_wall", "pairwise_wall_median"):
        assert o[k] > 0, k
    lo, hi = o["pairwise_wall_q1_q3"]
    assert lo <= o["pairwise_wall_median"] <= hi
    assert o["speedup_user"] is None or o["speedup_user"] > 0  # (user time can read 0 on a run this short)


def test_bench_ab_refuses_bad_usage_and_names_a_failed_replay():
    out = run(KVTIER, KVTIER, "1")
    assert out.returncode != 0 and "ROUNDS >= 2" in out.stderr
    out = run(KVTIER, KVTIER, "2", "--policy", "nope")
    assert out.returncode != 0 and "replay failed" in out.stderr and "policy" in out.stderr
    out = run(KVTIER, "/nonexistent/kvtier", "2")
    assert out.returncode != 0 and "/nonexistent/kvtier: cannot run it" in out.stderr


CHAT = str(ROOT / "scripts" / "chat-trace")


def chat(*args):
    return subprocess.run([sys.executable, CHAT, *args], capture_output=True, text=True, timeout=60)


def test_chat_trace_is_first_turns_and_their_next_turns_once():
    out = chat("--requests", "600", "--gap", "10", "--first", "3", "--next", "2", "--seed", "3")
    assert out.returncode == 0, out.stderr
    reqs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(reqs) == 600 and out.stdout == chat("--requests", "600", "--gap", "10", "--first", "3", "--next", "2",
                                                    "--seed", "3").stdout
    firsts, seen, nexts = {}, set(), 0
    for i, r in enumerate(reqs):
        b = r["hash_ids"]
        assert r["timestamp"] == i and r["input_length"] == 512 * len(b)
        if len(b) == 3:  # a first turn: blocks never seen before
            assert not seen & set(b)
            firsts[tuple(b)] = i
        else:  # a next turn: a first turn's blocks, at least gap later, once, then two new ones
            head = tuple(b[:3])
            assert len(b) == 5 and i - firsts.pop(head) >= 10 and not seen & set(b[3:])
            nexts += 1
        seen |= set(b)
    assert nexts > 100
    bad = chat("--gap", "0")
    assert bad.returncode != 0 and "--gap must be at least 1" in bad.stderr


def test_chat_trace_hybrid_pieces_learn_room_for_first_uses(tmp_path):
    """Every reuse on the chat trace is a piece's first use. Under arc the
    window pieces in L1 learn to give the pieces seen once room (ARC's
    target, from misses its ghosts remember) and the Gemma-like hybrid
    serves nearly what the all-full cache does (0.97 of it); with the
    seen-again class always first it serves a small part of it, in recency
    order 0.90 (docs/hybrid.md)."""
    trace = chat("--requests", "1000")
    assert trace.returncode == 0
    path = tmp_path / "chat.jsonl"
    path.write_text(trace.stdout)
    out = subprocess.run([KVTIER, "replay", str(path), "--model", "gemma-3-like", "--l1-pages", "8192",
                          "--l2-pages", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)["runs"][0]
    hybrid, full = run["hybrid"]["hit_rate"], run["every_layer_full"]["hit_rate"]
    print("chat trace, gemma-3-like, 8192 L1 pages: hybrid", hybrid, "all-full", full)
    assert full > 0.2 and hybrid >= 0.95 * full
