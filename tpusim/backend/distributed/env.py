"""The torchrun environment a script expects, derived from the simulated slice.

world = chips of the slice; local world = chips per host of the generation (capped by the world);
``LOCAL_RANK`` = rank modulo the local world. ``MASTER_ADDR``/``MASTER_PORT`` point at the store
the launcher hosts (``--ranks all``) or are placeholders (``--ranks one`` needs no rendezvous).
"""

from __future__ import annotations

import socket


def loopback_listener() -> socket.socket:
    """A listening socket on 127.0.0.1 for the launcher's store (a TCPStore given no socket binds every
    interface, so anyone on the network could write the ranks' rendezvous and the run's diagnosis)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def torchrun_env(rank: int, world: int, chips_per_host: int, mode: str, port: int) -> dict[str, str]:
    local = max(1, min(chips_per_host, world))
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local),
            "LOCAL_WORLD_SIZE": str(local), "GROUP_RANK": str(rank // local), "NODE_RANK": str(rank // local),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TPUSIM_RANKS": mode}
