"""A load-back schedule that drops one layer's copies on odd replays, and no others.

The data of an odd replay is stale at that layer whatever the fence does, and an even
replay is clean under a correct fence: a verdict that slid to the next replay, or was
shared by a batch, shows at once.
"""

SKIPPED = 1  # the layer whose copies an odd replay leaves out


def schedule(op):
    op.wait_start()
    op.hold()
    for layer in range(op.num_layers):
        if not (op.fault.replay % 2 == 1 and layer == SKIPPED):
            op.copy_layer(layer)
        op.complete(layer)
