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
