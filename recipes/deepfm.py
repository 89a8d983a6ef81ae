"""Recipe: DeepFM click prediction on MovieLens — source-checkout entry point.

The recipe itself ships inside the package as ``lightrec/recipes/deepfm.py`` (so ``lightrec run`` works
from a pip install); this file only calls its ``main``. The YAML files in ``recipes/configs/`` are
copies of ``lightrec/recipes/configs/`` (a test keeps them identical)::

    python recipes/deepfm.py fit --config recipes/configs/deepfm_movielens.yaml
    torchrun --nproc_per_node 2 recipes/deepfm.py fit --config recipes/configs/deepfm_movielens.yaml

To edit a recipe, copy it: ``lightrec cp deepfm my_dir``.
"""

from lightrec.recipes.deepfm import main

if __name__ == "__main__":
    main()
