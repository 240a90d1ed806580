"""``python -m torchplace``: the ``torchplace`` command, for an environment whose scripts folder
is not on ``PATH``."""

from torchplace.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
