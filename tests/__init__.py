"""lightrec's test suite.

With ``LIGHTREC_BLOCK_FBGEMM=1`` the fbgemm block is installed as soon as anything under
``tests`` is imported: spawned gloo ranks import this package (to unpickle their test body)
before any of lightrec, so they see the same fbgemm-less world as the parent.
"""

import os

if os.environ.get("LIGHTREC_BLOCK_FBGEMM", "") not in ("", "0"):
    from tests.fbgemm_block import install_fbgemm_block

    install_fbgemm_block()
