"""A load-back schedule that drops one layer's copies on the replays named in STALE, and no others.

Those replays' data are stale at that layer whatever the fence does; every other replay is clean
under a correct fence: a verdict that moved to another row of its batch shows at once.
"""

SKIPPED = 1  # the layer whose copies a stale replay leaves out
STALE = frozenset({5, 37, 66})  # in the first batch of 64, its last row's neighbour, the second batch


def schedule(op):
    op.wait_start()
    op.hold()
    for layer in range(op.num_layers):
        if not (op.fault.replay in STALE and layer == SKIPPED):
            op.copy_layer(layer)
        op.complete(layer)
