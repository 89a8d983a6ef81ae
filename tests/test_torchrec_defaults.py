"""torchrec's behaviour by default (issue 37's differences): state-dict keys both ways and the
package attributes torchrec code reaches for. torchrec is not installed here: its key names are
written down below from its module layout (``Perceptron._linear``, ``MLP._mlp``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightrec import KeyedJaggedTensor
from lightrec.modules.mlp import MLP

# torchrec's MLP(in_size=4, layer_sizes=[8, 2]).state_dict().keys(), in order
TORCHREC_MLP_KEYS = ["_mlp.0._linear.weight", "_mlp.0._linear.bias", "_mlp.1._linear.weight", "_mlp.1._linear.bias"]


def test_mlp_saves_torchrecs_keys_and_loads_both_layouts() -> None:
    torch.manual_seed(0)
    mlp = MLP(4, [8, 2])
    state = mlp.state_dict()
    assert list(state) == TORCHREC_MLP_KEYS  # a lightrec checkpoint loads strictly into torchrec's MLP
    assert mlp._mlp[0].linear is mlp._mlp[0]._linear
    again = MLP(4, [8, 2])
    assert not again.load_state_dict(state, strict=True).missing_keys
    earlier = {k.replace("._linear.", ".linear."): v for k, v in state.items()}  # lightrec before issue 37
    result = again.load_state_dict(earlier, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(3, 4)
    torch.testing.assert_close(again(x), mlp(x))
    scripted = torch.jit.script(mlp)
    torch.testing.assert_close(scripted(x), mlp(x))


def test_inference_submodules_are_attributes_after_import_lightrec() -> None:
    code = (
        "import lightrec\n"
        "m = lightrec.inference.modules\n"
        "assert callable(m.quantize_embeddings) and m.PredictFactory\n"
        "assert lightrec.inference.model_packager.PredictFactoryPackager\n"
        "assert lightrec.inference.state_dict_transform.state_dict_gather\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_sharded_routes_fold_raw_ids_as_the_unsharded_collection_does() -> None:
    """The sharded managed-collision input side admits ids the way the collection does (the
    collection's own case: tests/modules/managed_collision/test_collection_steps.py)."""
    from lightrec.distributed.sharding.managed_collision import McRoutes
    from lightrec.modules.feature_checks import strict_checks
    from lightrec.modules.managed_collision import (
        LRU_EvictionPolicy,
        ManagedCollisionIdError,
        MCHManagedCollisionModule,
    )

    module = MCHManagedCollisionModule(5, "cpu", LRU_EvictionPolicy(), 3, input_hash_size=1000)
    routes = McRoutes({"t0": module}, {"t0": ["f0"]}, need_preprocess=True)
    kjt = KeyedJaggedTensor(["f0", "other"], torch.tensor([1, 2004, -5, 7777]), lengths=torch.ones(4, dtype=torch.int64))
    with pytest.warns(UserWarning, match="'t0' got raw ids outside"):
        out = routes.prepare(kjt)
    assert out["f0"].values().tolist() == [1, 4] and out["other"].values().tolist() == [-5, 7777]
    assert routes.prepare(KeyedJaggedTensor(["f0"], torch.tensor([3]), lengths=torch.ones(1, dtype=torch.int64)))[
        "f0"].values().tolist() == [3]  # fmt: skip
    with strict_checks(), pytest.raises(ManagedCollisionIdError, match="'t0'.*2004"):
        routes.prepare(kjt)
