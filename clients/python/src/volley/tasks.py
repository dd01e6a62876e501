"""Background tasks of the package (lease renewals, watches)."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancels ``task`` and waits until it has stopped (nothing if it is None)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
