"""`python -m sweep [OVERRIDES...]`: see sweep.cli.main."""

import sys

if __name__ == "__main__":
    try:
        from sweep.cli.main import main

        code = main()
    except KeyboardInterrupt:  # Ctrl-C in the first moments (main() catches it once it runs): one line, as later
        print("sweep: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
