"""Recipe: DLRM / DLRM-DCNv2 (synthetic data or Criteo) — source-checkout entry point.

The recipe itself ships inside the package as ``lightrec/recipes/dlrm.py`` (so ``lightrec run`` works
from a pip install); this file only calls its ``main``. The YAML files in ``recipes/configs/`` are
copies of ``lightrec/recipes/configs/`` (a test keeps them identical)::

    python recipes/dlrm.py fit --config recipes/configs/dlrm.yaml
    python recipes/dlrm.py fit --config recipes/configs/dlrm_dcn.yaml
    python recipes/dlrm.py fit --config recipes/configs/dlrm_criteo.yaml
    torchrun --nproc_per_node 2 recipes/dlrm.py fit --config recipes/configs/dlrm.yaml

To edit a recipe, copy it: ``lightrec cp dlrm my_dir``.
"""

from lightrec.recipes.dlrm import main

if __name__ == "__main__":
    main()
