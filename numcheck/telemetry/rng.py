"""The random generators a forward draws from (dropout): their states read and put back (the
sentinel's replay of a step runs each forward again from the states it started from:
numcheck/telemetry/sentinel.py; a layer's float64 shadow draws what its live forward drew),
and forks of them for the float64 shadows, so that the live run's draws stay what they were.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from numcheck.telemetry._structs import tensors


def devices(*objs) -> set[tuple[str, int]]:
    """(device type, index) of the accelerator devices the tensors of ``objs`` (modules,
    argument structures) live on: whose generators a forward on them draws from, with the
    CPU's."""
    devs = set()
    for o in objs:
        ts = [*o.parameters(), *o.buffers()] if isinstance(o, nn.Module) else tensors(o)
        devs |= {(t.device.type, t.device.index or 0) for t in ts
                 if t.device.type not in ("cpu", "meta")}
    return devs


def own_rng(*objs) -> contextlib.ExitStack:
    """A context in which the shadows draw random numbers (dropout) from a fork of the CPU
    generator and of the generators of the devices of ``objs`` (devices()): the live run's
    draws stay what they were."""
    kinds: dict[str, set[int]] = {}
    for kind, idx in devices(*objs):
        kinds.setdefault(kind, set()).add(idx)
    stack = contextlib.ExitStack()
    if not kinds:
        stack.enter_context(torch.random.fork_rng(devices=[]))
    for kind, idx in kinds.items():
        stack.enter_context(torch.random.fork_rng(devices=sorted(idx), device_type=kind))
    return stack


def rng_states(*objs, devs: set | None = None) -> tuple:
    """The CPU generator's state and those of the devices of ``objs`` (devices()) and
    ``devs``: what a module's forward is about to draw from."""
    devs = devices(*objs) | (devs or set())
    return torch.get_rng_state(), {(k, i): getattr(torch, k).get_rng_state(i)
                                   for k, i in devs}


def set_rng_states(states: tuple) -> None:
    """Put back generator states that rng_states() read."""
    cpu, devs = states
    torch.set_rng_state(cpu)
    for (k, i), st in devs.items():
        getattr(torch, k).set_rng_state(st, i)
