"""`python -m sweep [OVERRIDES...]`: see sweep.cli.main."""

import sys

from sweep.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
