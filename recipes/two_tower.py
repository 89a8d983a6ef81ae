"""Recipe: two-tower retrieval on MovieLens — source-checkout entry point.

The recipe itself ships inside the package as ``lightrec/recipes/two_tower.py`` (so ``lightrec run`` works
from a pip install); this file only calls its ``main``. The YAML files in ``recipes/configs/`` are
copies of ``lightrec/recipes/configs/`` (a test keeps them identical)::

    python recipes/two_tower.py fit --config recipes/configs/two_tower_movielens.yaml
    torchrun --nproc_per_node 2 recipes/two_tower.py fit --config recipes/configs/two_tower_movielens.yaml

To edit a recipe, copy it: ``lightrec cp two_tower my_dir``.
"""

from lightrec.recipes.two_tower import main

if __name__ == "__main__":
    main()
