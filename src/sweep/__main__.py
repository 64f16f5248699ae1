"""`python -m sweep [OVERRIDES...]`: see sweep.cli.main."""

import sys

if __name__ == "__main__":
    try:
        from sweep.cli.main import main
    except KeyboardInterrupt:  # Ctrl-C in the first moments: one line, as later
        print("sweep: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
