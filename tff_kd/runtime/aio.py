"""Runs `tff.program`'s coroutines (state managers, release managers) from
synchronous code, in scripts and in notebooks alike."""

import asyncio
import concurrent.futures
from typing import Any, Coroutine


def run_sync(coroutine: Coroutine[Any, Any, Any]) -> Any:
  """Runs a `tff.program` coroutine to completion from synchronous code.

  Inside a running event loop (a Jupyter kernel runs one), `asyncio.run`
  refuses to start; the coroutine then runs on a loop of its own in a
  worker thread.

  Args:
    coroutine: e.g. `manager.save(state, version)`.

  Returns:
    The coroutine's result.
  """
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coroutine)
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(asyncio.run, coroutine).result()
