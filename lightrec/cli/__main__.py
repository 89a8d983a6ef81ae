"""``python -m lightrec.cli``: the ``lightrec`` command (Lightning re-runs it to start more ranks)."""

import sys

from lightrec.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
