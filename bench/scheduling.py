"""`make bench BENCH_ARGS=--scheduling`: the same multi-tenant workloads through each routing policy, with the
direct path beside, on simulators with the GPU model (devtools/simulator.py: a prefix KV cache, prefill time
per uncached block, decode time per token, a batch capacity). docs/scheduler.md explains the figures.

Workloads (closed loop, CONCURRENCY clients):
- shared: 8 tenants, each with a 3,000-character system prompt, and a short unique question;
- unique: every prompt different (nothing to reuse);
- hot: one prefix for every request;
- noisy: one tenant with 2x the fleet's capacity of clients beside a quiet one with one client, against
  the quiet one alone;
- two gateway processes (prefix policy, hot workload): the most requests a worker ever ran at once.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import run as base

WORKERS = 4
CAPACITY = 4  # each simulator's batch, declared as runtime_config.max_concurrency
KV_BLOCKS = 200  # a worker's cache holds about four tenants' prefixes (47 blocks each)
PREFILL_MS = 8.0  # per uncached 64-character block: ~375 ms for a cold 3,000-character prefix
DECODE_MS = 4.0
CONCURRENCY = 8
TENANT_PREFIX = "Tenant {n} policy: answer politely, cite the handbook section, never guess. "
POLICIES = ("prefix", "least-loaded", "random")


def _system(n: int) -> str:
    text = TENANT_PREFIX.format(n=n)
    return (text * (3000 // len(text) + 1))[:3000]


def _payload(system: str, question: str) -> dict[str, Any]:
    return {
        "model": base.MODEL,
        "max_tokens": 8,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


def _metric(port: int, name: str) -> float:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _load(
    urls: list[str], key: str, payloads: list[dict[str, Any]], *, concurrency: int
) -> tuple[list[float], int, int]:
    """Send every payload (concurrency clients), to the urls in turn; (latencies ms of 200s, 503s, other)."""
    latencies: list[float] = []
    refused = errors = 0
    todo = list(enumerate(payloads))
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def client() -> None:
            nonlocal refused, errors
            while todo:
                i, payload = todo.pop(0)
                started = time.perf_counter()
                async with session.post(urls[i % len(urls)], json=payload) as resp:
                    await resp.read()
                    if resp.status == 200:
                        latencies.append((time.perf_counter() - started) * 1000)
                    elif resp.status == 503:
                        refused += 1
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, refused, errors


def _workloads(rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    shared = [_payload(_system(i % 8), f"question {i}: {rng.random()}") for i in range(160)]
    unique = [_payload(f"{rng.random()} " * 160, f"question {i}") for i in range(60)]
    hot = [_payload(_system(99), f"question {i}: {rng.random()}") for i in range(120)]
    return {"shared": shared, "unique": unique, "hot": hot}


def _start_sims(env: dict[str, str], args: Any) -> tuple[list[Any], list[int]]:
    ports = [base.free_port() for _ in range(WORKERS)]
    sims = [
        base.start(
            f"gpu{i}",
            [
                base.PY,
                "-m",
                "devtools.simulator",
                "--port",
                str(port),
                "--model",
                base.MODEL,
                "--deltas",
                "8",
                "--max-concurrency",
                str(CAPACITY),
                "--kv-blocks",
                str(KV_BLOCKS),
                "--prefill-ms",
                str(PREFILL_MS),
                "--decode-ms",
                str(DECODE_MS),
            ],
            env,
            port=port,
            cpus=args.upstream_cpus,
        )  # fmt: skip
        for i, port in enumerate(ports)
    ]
    return sims, ports


def _figures(
    latencies: list[float], refused: int, errors: int, ports: list[int], before: dict[str, list[float]]
) -> dict[str, Any]:
    served = [_metric(p, "vllm:request_success_total") - b for p, b in zip(ports, before["served"], strict=True)]
    hits = sum(_metric(p, "vllm:prefix_cache_hits_total") for p in ports) - sum(before["hits"])
    queried = sum(_metric(p, "vllm:prefix_cache_queries_total") for p in ports) - sum(before["queries"])
    return {
        "requests": len(latencies),
        "refused": refused,
        "errors": errors,
        "p50_ms": base.pct(latencies, 50) if latencies else 0.0,
        "p90_ms": base.pct(latencies, 90) if latencies else 0.0,
        "hit_ratio": hits / queried if queried else 0.0,
        "max_share": max(served) / max(1.0, sum(served)),
    }


def _before(ports: list[int]) -> dict[str, list[float]]:
    return {
        "served": [_metric(p, "vllm:request_success_total") for p in ports],
        "hits": [_metric(p, "vllm:prefix_cache_hits_total") for p in ports],
        "queries": [_metric(p, "vllm:prefix_cache_queries_total") for p in ports],
    }


def _noisy(urls: list[str], noisy_key: str, quiet_key: str) -> dict[str, Any]:
    quiet_payloads = [_payload(_system(50), f"quiet {i}") for i in range(12)]
    solo, _, _ = asyncio.run(_load(urls, quiet_key, quiet_payloads, concurrency=1))

    async def both() -> tuple[tuple[list[float], int, int], tuple[list[float], int, int]]:
        noisy = [_payload(_system(60 + i % 4), f"noisy {i}") for i in range(200)]
        loud = asyncio.ensure_future(_load(urls, noisy_key, noisy, concurrency=2 * WORKERS * CAPACITY))
        await asyncio.sleep(0.5)
        quiet = await _load(
            urls, quiet_key, [_payload(_system(50), f"quiet again {i}") for i in range(12)], concurrency=1
        )
        return await loud, quiet

    (loud_lat, loud_refused, loud_errors), (quiet_lat, _, quiet_errors) = asyncio.run(both())
    return {
        "quiet_solo_p50_ms": base.pct(solo, 50),
        "quiet_p50_ms": base.pct(quiet_lat, 50) if quiet_lat else float("inf"),
        "noisy_ok": len(loud_lat),
        "noisy_503": loud_refused,
        "errors": loud_errors + quiet_errors,
    }


def scoring_cost() -> dict[str, float]:
    """Microseconds the prefix policy adds to one selection (p50): hashing a 3,000-character prompt, the
    index lookup, and the holder pick, against the least-loaded order alone."""
    sys.path.insert(0, str(base.ROOT))
    from workers import balancer, prefix

    texts = [_system(1), "a question of a few words"]
    for i in range(WORKERS):
        prefix.record(prefix.block_hashes(model=base.MODEL, texts=[_system(i), "q"]), f"w{i}")
    candidates = [balancer.Candidate(f"w{i}", i % 3) for i in range(WORKERS)]
    plain, scored = [], []
    for _ in range(2000):
        t0 = time.perf_counter()
        balancer.order(candidates, policy="least-loaded")
        t1 = time.perf_counter()
        hashes = prefix.block_hashes(model=base.MODEL, texts=texts)
        matched = prefix.matches(hashes)
        balancer.order(
            [balancer.Candidate(c.worker_id, c.in_flight, matched=matched.get(c.worker_id, 0)) for c in candidates],
            policy="prefix",
        )
        prefix.record(hashes, "w1")
        t2 = time.perf_counter()
        plain.append(t1 - t0)
        scored.append(t2 - t1)
    plain.sort()
    scored.sort()
    return {"least_loaded_us": plain[1000] * 1e6, "prefix_us": scored[1000] * 1e6}


def bench_scheduling(args: Any) -> str:
    var_dir = Path(tempfile.mkdtemp(prefix="speedinfer-bench-scheduling-"))
    env = base.profile_env("full", var_dir)
    base.reset_stores("full")
    rng = random.Random(20)
    work = _workloads(rng)
    rows: dict[str, dict[str, Any]] = {}
    key = quiet_key = ""
    for policy in ("direct", *POLICIES):
        sims, ports = _start_sims(env, args)
        with base.running(sims):
            if not key:
                key = base.seed(env, None)
                base.manage(env, "createaccount", "quiet")
                base.manage(env, "grantcredits", "quiet", "1000000")
                quiet_key = base.manage(env, "createapikey", "quiet").strip().splitlines()[-1]
            base.manage(env, "shell", "-c", "from workers.models import Worker; Worker.objects.all().delete()")
            for i, port in enumerate(ports):
                base.register(
                    env,
                    f"gpu{i}",
                    f"http://127.0.0.1:{port}/v1",
                    metrics_url=f"http://127.0.0.1:{port}/metrics",
                    max_concurrency=CAPACITY,  # type: ignore[arg-type]
                )
            base.manage(env, "probeworkers")
            row: dict[str, Any] = {}
            if policy == "direct":
                # The direct path: each client picks a worker at random, as a plain load balancer would.
                urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for p in ports]
                for name, payloads in work.items():
                    before = _before(ports)
                    shuffled = [(rng.choice(urls), p) for p in payloads]
                    row[name] = _figures(*_direct(shuffled, key), ports, before)
                rows[policy] = row
                print(f"== scheduling / {policy}: {_fmt(row)}", flush=True)
                continue
            gw_port = base.free_port()
            gw_env = {**env, "SPEEDINFER_ROUTING_POLICY": policy, "SPEEDINFER_QUEUE_TIMEOUT": "10"}
            gw = base.start("uvicorn", base.server_cmd("uvicorn", gw_port, 1), gw_env, port=gw_port)
            with base.running([gw]):
                url = [f"http://127.0.0.1:{gw_port}/v1/chat/completions"]
                for name, payloads in work.items():
                    before = _before(ports)
                    row[name] = _figures(
                        *asyncio.run(_load(url, key, payloads, concurrency=CONCURRENCY)), ports, before
                    )
                row["noisy"] = _noisy(url, key, quiet_key)
            rows[policy] = row
            print(f"== scheduling / {policy}: {_fmt(row)}", flush=True)
    # Two gateway processes (uvicorn --workers 2) share the fleet's capacity through Redis.
    sims, ports = _start_sims(env, args)
    with base.running(sims):
        base.manage(env, "shell", "-c", "from workers.models import Worker; Worker.objects.all().delete()")
        for i, port in enumerate(ports):
            base.register(env, f"gpu{i}", f"http://127.0.0.1:{port}/v1", max_concurrency=CAPACITY)  # type: ignore[arg-type]
        base.manage(env, "probeworkers")
        gw_port = base.free_port()
        gw = base.start("uvicorn", base.server_cmd("uvicorn", gw_port, 2), env, port=gw_port)
        with base.running([gw]):
            url = [f"http://127.0.0.1:{gw_port}/v1/chat/completions"]
            lat, refused, errors = asyncio.run(_load(url, key, work["hot"] * 2, concurrency=3 * WORKERS * CAPACITY))
            peak = max(_metric(p, "simulator_peak_running") for p in ports)
    two = {"requests": len(lat), "refused": refused, "errors": errors, "peak": peak}
    cost = scoring_cost()
    shutil.rmtree(var_dir, ignore_errors=True)
    return table(rows, two, cost)


def _direct(pairs: list[tuple[str, dict[str, Any]]], key: str) -> tuple[list[float], int, int]:
    urls = [u for u, _ in pairs]
    payloads = [p for _, p in pairs]

    async def run() -> tuple[list[float], int, int]:
        # _load sends payload i to urls[i % len]: give it one url per payload.
        return await _load(urls, key, payloads, concurrency=CONCURRENCY)

    return asyncio.run(run())


def _fmt(row: dict[str, Any]) -> str:
    parts = [
        f"{name}: hit {r['hit_ratio']:.2f} p50 {r['p50_ms']:.0f} p90 {r['p90_ms']:.0f} ms "
        f"max-share {r['max_share']:.0%}"
        for name, r in row.items()
        if name != "noisy"
    ]
    if "noisy" in row:
        n = row["noisy"]
        parts.append(
            f"noisy: quiet p50 {n['quiet_p50_ms']:.0f} ms (solo {n['quiet_solo_p50_ms']:.0f}), "
            f"noisy {n['noisy_ok']} ok / {n['noisy_503']} 503"
        )
    return " | ".join(parts)


def _ok(flag: bool) -> str:
    return "met" if flag else "MISSED"


def table(rows: dict[str, dict[str, Any]], two: dict[str, Any], cost: dict[str, float]) -> str:
    lines = [
        f"## Scheduling ({WORKERS} simulated GPUs, batch {CAPACITY}, KV cache {KV_BLOCKS} blocks, "
        f"prefill {PREFILL_MS:g} ms/block, c{CONCURRENCY})",
        "",
        "| path | shared: hit, p50 / p90 ms | unique: p50 / p90 ms | hot: max share, p90 ms "
        "| noisy: quiet p50 (solo) ms, noisy ok/503 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        s, u, h = row["shared"], row["unique"], row["hot"]
        noisy = row.get("noisy")
        n = (
            f"{noisy['quiet_p50_ms']:.0f} ({noisy['quiet_solo_p50_ms']:.0f}), {noisy['noisy_ok']}/{noisy['noisy_503']}"
            if noisy
            else "-"
        )
        lines.append(
            f"| {name} | {s['hit_ratio']:.2f}, {s['p50_ms']:.0f} / {s['p90_ms']:.0f} | {u['p50_ms']:.0f} / "
            f"{u['p90_ms']:.0f} | {h['max_share']:.0%}, {h['p90_ms']:.0f} | {n} |"
        )
    p, ll, rnd = rows["prefix"], rows["least-loaded"], rows["random"]
    shared_gain = min(
        ll["shared"]["p50_ms"] / p["shared"]["p50_ms"],
        rnd["shared"]["p50_ms"] / p["shared"]["p50_ms"],
        ll["shared"]["p90_ms"] / p["shared"]["p90_ms"],
        rnd["shared"]["p90_ms"] / p["shared"]["p90_ms"],
    )
    noisy = p["noisy"]
    targets = [
        (
            "shared prefixes",
            "hit >= 0.75; p50 and p90 >= 2x better than least-loaded and random",
            f"hit {p['shared']['hit_ratio']:.2f}; {shared_gain:.1f}x",
            p["shared"]["hit_ratio"] >= 0.75 and shared_gain >= 2,
        ),
        (
            "unique prompts",
            "within 15% of least-loaded",
            f"p50 {p['unique']['p50_ms']:.0f} vs {ll['unique']['p50_ms']:.0f} ms",
            p["unique"]["p50_ms"] <= 1.15 * ll["unique"]["p50_ms"],
        ),
        (
            "one hot prefix",
            "no worker above half; p90 within 1.5x of least-loaded",
            f"max share {p['hot']['max_share']:.0%}; p90 {p['hot']['p90_ms']:.0f} vs {ll['hot']['p90_ms']:.0f} ms",
            p["hot"]["max_share"] <= 0.5 and p["hot"]["p90_ms"] <= 1.5 * ll["hot"]["p90_ms"],
        ),
        (
            "noisy neighbour",
            "quiet p50 <= 2.5x solo; noisy completes or clean 503s",
            f"{noisy['quiet_p50_ms']:.0f} vs solo {noisy['quiet_solo_p50_ms']:.0f} ms; "
            f"{noisy['noisy_ok']} ok, {noisy['noisy_503']} 503, {noisy['errors']} other",
            noisy["quiet_p50_ms"] <= 2.5 * noisy["quiet_solo_p50_ms"] and noisy["errors"] == 0,
        ),
        (
            "two gateway processes",
            f"no worker above its capacity ({CAPACITY})",
            f"peak {two['peak']:.0f} running; {two['requests']} ok, {two['refused']} 503, {two['errors']} other",
            two["peak"] <= CAPACITY and two["errors"] == 0,
        ),
        (
            "scoring cost",
            "<= 0.1 ms added p50",
            f"{cost['prefix_us'] - cost['least_loaded_us']:.1f} us added "
            f"({cost['prefix_us']:.1f} vs {cost['least_loaded_us']:.1f} us)",
            cost["prefix_us"] - cost["least_loaded_us"] <= 100,
        ),
    ]
    lines += ["", "| workload | target | measured | |", "| --- | --- | --- | --- |"]
    lines += [f"| {w} | {t} | {m} | {_ok(ok)} |" for w, t, m, ok in targets]
    return "\n".join(lines)
