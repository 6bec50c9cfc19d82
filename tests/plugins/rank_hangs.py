"""A fence that never returns from replay 1 on: a tensor-parallel rank that hangs on the host.

Run on one rank (`fence_ranks = [1]`), the other ranks time out in their collective; the hung
rank must be stopped, with its stack, and the scenario end as an error.
"""

import time


def fence(ctx):
    if ctx.replay >= 1:
        time.sleep(600)
