"""Which `WorkerClient` calls a worker: the registry of transports (runtimes.interface has the interface).

`client_for(worker)` is the one place that looks at a worker's transport and runtime_config to pick an
implementation. A new transport is `runtimes/<name>.py` with a `WorkerClient` subclass plus a line in
`_REGISTRY` (and its transport in workers/registration.py, its probe in workers/probes.py).
"""

from __future__ import annotations

from runtimes.interface import WorkerClient
from runtimes.openai import OpenAIClient
from runtimes.target import WorkerTarget
from runtimes.triton import TritonClient
from runtimes.triton_stream import TritonStreamClient

# transport -> its clients, most specific first: a variant (its `serves(worker)` true) before the plain one.
_REGISTRY: dict[str, tuple[type[WorkerClient], ...]] = {
    OpenAIClient.transport: (OpenAIClient,),
    TritonClient.transport: (TritonStreamClient, TritonClient),
}


def client_for(worker: WorkerTarget) -> WorkerClient:
    """The client that calls `worker` (its capabilities say what it serves)."""
    for client in _REGISTRY.get(worker.transport, ()):
        if client.serves(worker):
            return client(worker)
    raise LookupError(f"no client for the transport {worker.transport!r}")
