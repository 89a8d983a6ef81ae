"""``python -m lightrec``: the ``lightrec`` command, as ``python -m lightrec.cli`` runs it."""

import sys

from lightrec.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
