"""The frozen remappers of both managed-collision modules compile with ``torch.jit.script`` on their own
(not only inside an export), and the scripted remapper maps ids as the eager one: the hash functions
read their 64-bit constants as literals (TorchScript refused the module-level globals they were)."""

from __future__ import annotations

import pytest
import torch

from lightrec import JaggedTensor
from lightrec.modules.managed_collision import (
    HashZchManagedCollisionModule,
    LRU_EvictionPolicy,
    ManagedCollisionModule,
    MCHManagedCollisionModule,
)


def _trained(kind: str) -> ManagedCollisionModule:
    cpu = torch.device("cpu")
    module: ManagedCollisionModule
    if kind == "hash_zch":
        module = HashZchManagedCollisionModule(zch_size=16, device=cpu, total_num_buckets=1)
    else:
        module = MCHManagedCollisionModule(
            zch_size=16, device=cpu, eviction_policy=LRU_EvictionPolicy(), eviction_interval=2, input_hash_size=2**50
        )  # fmt: skip
    module._name = "t"
    module.train()
    module.remap({"t": JaggedTensor(values=torch.tensor([5, 9, 2**40, 123456789]), lengths=torch.tensor([4]))})
    return module.eval()


@pytest.mark.parametrize("kind", ["hash_zch", "mch"])
def test_frozen_remapper_scripts_directly_and_maps_as_eager(kind: str) -> None:
    remapper = _trained(kind).frozen_remapper()
    scripted = torch.jit.script(remapper)
    ids = torch.tensor([5, 9, 2**40, 123456789, 7, 2**45 + 3, 0])
    assert torch.equal(scripted(ids), remapper(ids))
