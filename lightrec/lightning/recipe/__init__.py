"""The recipes' library: what ``recipes/*.py`` (``lightrec run``, ``lightrec cp``) are built on.

=================  ==================================================================================
module             what it holds
=================  ==================================================================================
``cli.py``         ``RecipeCLI`` (LightningCLI with lightrec's defaults), ``run_recipe`` (a recipe's
                   ``main``), what ``fabric run``'s flags become, the end-of-run summary
``checks.py``      the command line checked before any rank starts: config names and files, keys,
                   devices (``RecipeArgumentError``: one line, exit 2)
``preflight.py``   the checks that need the built model, DataModule and checkpoint
``module.py``      ``RecipeModule``: a ``RecModule`` whose tables are sized from the DataModule
=================  ==================================================================================

A recipe imports this package only (``from lightrec.lightning.recipe import RecipeModule,
run_recipe``), so a copy made by ``lightrec cp`` runs outside the checkout.
"""

from lightrec.lightning.recipe.cli import RecipeCLI, run_recipe
from lightrec.lightning.recipe.module import DataTableSpec, RecipeModule

__all__ = ["DataTableSpec", "RecipeCLI", "RecipeModule", "run_recipe"]
