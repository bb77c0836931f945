"""Which worker recently served which prompt prefix: an approximate, bounded, per-process index.

The gateway cannot see a runtime's KV cache, so it remembers where it sent prefixes (as the Gateway API
Inference Extension's prefix-cache scorer does): the forwarded prompt text (the messages' text in order,
or the prompt) is cut into BLOCK_CHARS-character blocks and a hash is chained over them, so block i's hash
stands for the whole prompt up to the end of block i. The first hash is seeded with the model and the
request's `prompt_cache_key`, so a key alone is one block that every request carrying it shares (the
explicit affinity key), and different models never match.

The index maps a block hash to the workers it was sent to, one least-recently-used table of at most
CAPACITY hashes for the whole process (about 400 bytes a hash, measured: ~40 MB when full). A lookup walks the
request's hashes in order and counts, per worker, the run of blocks from the start that it holds: the
longest run is where the runtime most probably still has the prefix cached.

Per process, not shared through Redis: a lookup happens on every request and must cost microseconds, not a
round trip, and gateway processes behind one load balancer each see a steady sample of every tenant, so
each learns the same affinity after a few requests. What a process loses is the first request or two of
a prefix per process (docs/scheduler.md gives the argument and the measured figures).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from core import state as process_state

BLOCK_CHARS = 64  # vLLM's 16-token block at about 4 characters a token
MAX_BLOCKS = 256  # prompts longer than 16K characters match on their first 16K
CAPACITY = 100_000  # hashes (~40 MB); the endpoint picker keeps 31,250 per server

_index: OrderedDict[int, dict[str, None]] = OrderedDict()
# worker id -> [blocks matched on the worker chosen, blocks asked]: the prefix-hit estimate in /metrics.
_hits: dict[str, list[int]] = {}


def block_hashes(*, model: str, texts: Iterable[str], cache_key: str = "") -> list[int]:
    """The chained hashes of the prompt's full blocks (a partial last block is not hashed)."""
    text = "\x1e".join(texts)
    limit = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    previous = hash((model, cache_key))
    hashes = [previous] if cache_key else []
    for i in range(limit):
        # Python's str hash is randomised per process; the index never leaves the process, so that is fine.
        previous = hash((previous, text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS]))
        hashes.append(previous)
    return hashes


def matches(hashes: list[int]) -> dict[str, int]:
    """Per worker, how many of the request's blocks from the start it was sent recently."""
    found: dict[str, int] = {}
    index = _index
    for i, h in enumerate(hashes):
        holders = index.get(h)
        if not holders:
            break
        extended = False
        for worker_id in holders:
            if found.get(worker_id, 0) == i:
                found[worker_id] = i + 1
                extended = True
        if not extended:
            break
    return found


def record(hashes: list[int], worker_id: str) -> None:
    """The request with these hashes goes to `worker_id`: it will hold them (most recent last). Counts
    the leading blocks it already held, for the hit estimate."""
    index = _index
    matched, run = 0, True
    for h in hashes:
        holders = index.get(h)
        if holders is None:
            index[h] = {worker_id: None}
            run = False
        else:
            if run and worker_id in holders:
                matched += 1
            else:
                run = False
            holders[worker_id] = None
            index.move_to_end(h)
    if hashes:
        counts = _hits.setdefault(worker_id, [0, 0])
        counts[0] += matched
        counts[1] += len(hashes)
    while len(index) > CAPACITY:
        index.popitem(last=False)


def forget_worker(worker_id: str) -> None:
    for holders in _index.values():
        holders.pop(worker_id, None)


def hit_estimates() -> dict[str, tuple[int, int]]:
    """Per worker: (prefix blocks it was sent that the index said it held, blocks it was sent)."""
    return {w: (c[0], c[1]) for w, c in _hits.items()}


def size() -> int:
    return len(_index)


def reset() -> None:
    """Forget everything (tests)."""
    _index.clear()
    _hits.clear()


process_state.register("workers.prefix", reset)
