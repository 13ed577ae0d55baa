"""Stopping several servers at once at teardown: each stop waits for its process to exit (a
Triton for its models to unload, a daemon for its operations to end), so one after another the
waits add up, seconds per test; side by side they take as long as the slowest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def stop_all(things: Sequence[T], stop: Callable[[T], object]) -> None:
    """`stop(thing)` for every thing at once; the first error, if any, once all have ended."""
    if len(things) <= 1:
        for thing in things:
            stop(thing)
        return
    with ThreadPoolExecutor(len(things)) as pool:
        futures = [pool.submit(stop, thing) for thing in things]
    for future in futures:
        future.result()
