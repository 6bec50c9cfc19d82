"""A load-back schedule that holds the gate behind the harness's back.

`op.gate.hold()` instead of `op.hold()`: the harness does not know the gate is
held, so nothing opens it but the gate's watchdog. Tests use it to show that a
gate nobody opens ends as a gate-timeout error, never a hang.
"""


def schedule(op):
    op.wait_start()
    op.gate.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.complete(layer)
