"""Registry of benchmarked systems: name -> System subclass (imported lazily)."""

from __future__ import annotations

import importlib

from bench.systems.base import System

# name -> "module:Class"; modules are imported only when the system is used
REGISTRY: dict[str, str] = {
    "raw": "bench.systems.raw:Raw",
    "procrastinate": "bench.systems.procrastinate:Procrastinate",
    "pgqueuer": "bench.systems.pgqueuer:PgQueuer",
    "postjob_sa": "bench.systems.postjob_sa:PostjobSA",
}


def get_system(name: str) -> System:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(REGISTRY)}") from None
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    system: System = cls()
    return system
