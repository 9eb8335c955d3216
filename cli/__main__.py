"""``python -m millstream.cli``: the millstream command."""

import sys

from millstream.cli import main

if __name__ == "__main__":
    sys.exit(main())
