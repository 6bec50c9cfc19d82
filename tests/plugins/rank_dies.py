"""A fence that ends its process at replay 1: a tensor-parallel rank that dies mid-run.

Run it on one rank (`fence_ranks = [1]`): the other ranks are left waiting in a collective for a
peer that is gone, and the scenario must end as an error naming each rank's end, never a hang.
"""

import os


def fence(ctx):
    if ctx.replay >= 1:
        os._exit(3)
