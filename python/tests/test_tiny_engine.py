"""The tiny engine (examples/tiny_engine.py): reused KV gives the logits a
full recompute gives, for L1 hits, L2 load-backs and L3 fetches, with pages
corrupted on purpose, and across two engine processes sharing one Redis."""
import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGINE = ROOT / "examples" / "tiny_engine.py"
sys.path.insert(0, str(ROOT / "examples"))
import tiny_engine  # noqa: E402


def run(*args):
    p = subprocess.run([sys.executable, str(ENGINE), "--json", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def test_default_scenario_touches_every_tier_and_agrees_with_recompute():
    r = run()
    assert r["requests"] == 72
    assert r["l1_hit_tokens"] > 0 and r["l2_hit_tokens"] > 0 and r["l3_hit_tokens"] > 0
    assert r["max_rel_err"] <= 1e-5 and r["mismatches"] == 0
    # a page corrupted in L2 and an object corrupted in L3, each refused (then recomputed)
    assert r["l2_pages_refused"] >= 1 and r["l3_objects_refused"] >= 1
    assert r["corrupt_pages_refused"] == r["l2_pages_refused"] + r["l3_objects_refused"]
    # tokens: what was computed plus what was reused is what recompute costs
    assert r["computed_tokens"] + r["saved_tokens"] == r["recompute_tokens"]
    assert r["computed_tokens"] < r["recompute_tokens"]


def test_two_engine_processes_share_one_redis_store(redis_server):
    a = run("--l3", redis_server, "--rounds", "1", "--corrupt", "none")
    b = run("--l3", redis_server, "--rounds", "1", "--corrupt", "none")
    assert a["max_rel_err"] <= 1e-5 and b["max_rel_err"] <= 1e-5
    # the second process starts cold: its L3 hits are pages the first one put
    assert b["l3_foreign_hit_tokens"] > 0
    assert b["computed_tokens"] < a["computed_tokens"]
    # an object corrupted in Redis (a payload byte, through SETRANGE) is refused and recomputed
    c = run("--l3", redis_server, "--rounds", "2", "--corrupt", "l3")
    assert c["corrupted"]["l3"] == 1 and c["l3_objects_refused"] >= 1 and c["max_rel_err"] <= 1e-5


def test_the_logits_check_catches_wrong_kv(monkeypatch, tmp_path):
    """The oracle can fail: an engine that reads one wrong value of its cached
    KV is caught."""
    real = tiny_engine.TinyModel.forward

    def forward(self, ids, past=None):
        if past:
            past = [(k.clone(), v) for k, v in past]
            past[0][0][0, 0, 0] += 1.0
        return real(self, ids, past)

    monkeypatch.setattr(tiny_engine.TinyModel, "forward", forward)
    args = ["--json", "--rounds", "2", "--l3", f"dir:{tmp_path}/l3", "--corrupt", "none"]
    assert tiny_engine.main(args) == 1


def test_bad_arguments_are_refused():
    p = subprocess.run([sys.executable, str(ENGINE), "--block-tokens", "0"], capture_output=True, text=True)
    assert p.returncode == 2 and "--block-tokens" in p.stderr
