"""`python -m harness`: the `fence-harness` command line (harness.frontends.cli)."""

import sys

try:
    from harness.frontends.cli import main
except KeyboardInterrupt:
    # Ctrl-C while the command line is still importing: no handler of the harness is in place
    # yet, and nothing has run; the same one line and exit code as an interrupt anywhere else.
    print("fence-harness: interrupted (SIGINT)", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
