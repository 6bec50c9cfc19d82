"""`stuck_gate`'s schedule where there is a gate, the plain layer-wise one elsewhere.

With a gate fault on one rank of a tensor-parallel scenario (`fault = { kind = "gate", ranks = [1] }`)
only that rank's gate is held behind the harness's back: that rank ends with a gate-timeout, and the
other ranks are left waiting in a collective.
"""


def schedule(op):
    op.wait_start()
    if op.gate is not None:
        op.gate.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.complete(layer)
