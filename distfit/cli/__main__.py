"""``python -m distfit.cli``: the distfit command."""
from distfit.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
