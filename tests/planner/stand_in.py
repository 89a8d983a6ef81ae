"""A minimal embedding collection for planner tests: the planner only reads its configs.

(The real ``lightrec.modules.EmbeddingBagCollection`` exposes the same ``embedding_bag_configs()``.)
"""

from __future__ import annotations

from torch import nn

from lightrec.distributed.types import ModuleSharder
from lightrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

MiB = 1024**2  # the memory units the planner tests write caps and sizes in
GiB = 1024**3


class StandInEBC(nn.Module):
    def __init__(self, configs: list[EmbeddingBagConfig]) -> None:
        super().__init__()
        self._configs = configs

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs


class StandInEC(nn.Module):
    def __init__(self, configs: list[EmbeddingConfig]) -> None:
        super().__init__()
        self._configs = configs

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return self._configs


class StandInSharder(ModuleSharder):
    def __init__(self, module_type: type[nn.Module] = StandInEBC, fused_params: dict | None = None) -> None:
        super().__init__(fused_params)
        self._type = module_type

    @property
    def module_type(self) -> type[nn.Module]:
        return self._type


def tutorial_ebc() -> StandInEBC:
    """The TorchRec tutorial's two 4096 x 64 tables."""
    return StandInEBC(
        [
            EmbeddingBagConfig(
                name="product_table", embedding_dim=64, num_embeddings=4096, feature_names=["product"]
            ),
            EmbeddingBagConfig(
                name="user_table", embedding_dim=64, num_embeddings=4096, feature_names=["user"]
            ),
        ]
    )


def tables(spec: list[tuple[int, int]], prefix: str = "t") -> StandInEBC:
    """``[(rows, dim), ...]`` -> a collection of tables named ``t0, t1, ...``."""
    return StandInEBC(
        [
            EmbeddingBagConfig(
                name=f"{prefix}{i}", num_embeddings=r, embedding_dim=d, feature_names=[f"{prefix}f{i}"]
            )
            for i, (r, d) in enumerate(spec)
        ]
    )
