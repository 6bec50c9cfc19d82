import sys

from harness.frontends.cli import main

sys.exit(main())
