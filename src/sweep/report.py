"""`python -m sweep.report DIR`: the report command (it lives in sweep.analysis.report)."""

import sys

from sweep.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
