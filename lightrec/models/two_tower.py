"""Two-tower retrieval: a query tower and a candidate tower scored by a dot product.

One ``EmbeddingBagCollection`` holds the features of both sides (e.g. ``user_id`` for queries,
``item_id`` and ``genre`` for candidates). Each tower concatenates its pooled features and maps
them through an MLP whose last layer is linear::

    KJT --EBC--> KeyedTensor --regroup--> query feats [B, Dq] --query_proj-------> q [B, E]
                                      \\-> cand. feats [B, Dc] --candidate_proj---> c [B, E]

Training (``TwoTowerTrainTask``) uses in-batch negatives: sample ``i``'s candidate is the
positive of query ``i`` and every other candidate of the batch a negative::

    logits = q @ c.T / temperature      [B, B]   (row i: query i against all B candidates)
    loss   = cross_entropy(logits, arange(B))   (a softmax over the batch for every query)

Feature dims may differ between features (unlike DLRM); only the towers' outputs must match.

Differences from torchrec's retrieval example (``examples/retrieval/modules/two_tower.py``, not a
``torchrec.*`` module, so migrating scripts keep their own copy of it; see
``docs/examples/torchrec_two_tower_retrieval.py``). The names are the same, the models are not:

- towers: torchrec's are ``MLP(embedding_dim, layer_sizes)`` with a ReLU after *every* layer (its
  embeddings are >= 0) over exactly one table's features (``in_size`` is one ``embedding_dim``);
  here the last layer is linear, a tower reads any number of features of any widths, and the
  split is configurable. State dict keys differ: torchrec ``query_proj._mlp.<i>._linear.*``, here
  ``query_proj.0._mlp.<i>._linear.*`` and ``query_proj.1.*`` (``query_proj.0.*`` for one layer), so
  a torchrec ``TwoTower`` checkpoint does not load into this one.
- ``TwoTowerTrainTask``: torchrec's scores each pair (``logits = (q * c).sum(1)`` ``[B]``) with
  binary cross-entropy against ``batch.labels``, so it needs negative pairs in the data; this one
  is an in-batch softmax (``logits`` ``[B, B]``, ``targets`` ``arange(B)``) over positive pairs,
  with a ``temperature``, and uses ``labels`` only to skip non-positive rows as queries.
- ``TwoTowerRetrieval`` (faiss index, separate query/candidate collections) is not provided.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightrec.models._sparse_arch import feature_names_and_dims
from lightrec.modules.mlp import MLP, check_layer_sizes
from lightrec.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["TwoTower", "TwoTowerTrainTask"]

Device = torch.device | str | None


def _tower(in_features: int, layer_sizes: list[int], device: Device) -> nn.Sequential:
    """ReLU MLP over all but the last width, then a linear layer (embeddings may be negative)."""
    hidden: list[nn.Module] = []
    if len(layer_sizes) > 1:
        hidden.append(MLP(in_features, layer_sizes[:-1], device=device))
    last_in = layer_sizes[-2] if len(layer_sizes) > 1 else in_features
    return nn.Sequential(*hidden, nn.Linear(last_in, layer_sizes[-1], device=device))


def _split_towers(pooled: KeyedTensor, query_names: list[str], candidate_names: list[str]) -> list[torch.Tensor]:
    return KeyedTensor.regroup([pooled], [query_names, candidate_names])


# Recorded as one call under fx: regrouping walks the runtime keys of the KeyedTensor.
torch.fx.wrap("_split_towers")


class TwoTower(nn.Module):
    """Query and candidate towers over one embedding bag collection.

    Args:
        embedding_bag_collection: pooled features of both sides (may be on ``meta``).
        layer_sizes: widths of each tower; ``layer_sizes[-1]`` is the embedding size ``E``.
        device: where the towers are created.
        query_feature_names: features of the query tower. Default: with exactly two tables,
            the first table's features; otherwise every feature not named as a candidate feature.
        candidate_feature_names: features of the candidate tower. Default: with exactly two
            tables, the second table's features; otherwise every feature not named as a query one.
        normalize: L2-normalize both embeddings (dot products become cosine similarities; pair
            with a temperature < 1 in training).

    Shapes:
        ``forward(kjt with stride B) -> (query [B, E], candidate [B, E])``.

    Raises:
        ValueError: unknown feature names, features named on both sides, a side with no
            features, or no way to infer the split.
    """

    def __init__(
        self,
        embedding_bag_collection: nn.Module,
        layer_sizes: list[int],
        device: Device = None,
        query_feature_names: list[str] | None = None,
        candidate_feature_names: list[str] | None = None,
        normalize: bool = False,
    ) -> None:
        super().__init__()
        sizes = check_layer_sizes("layer_sizes", layer_sizes)
        names, dims, _ = feature_names_and_dims(embedding_bag_collection)
        dim_of = dict(zip(names, dims, strict=True))
        query, candidate = _resolve_split(embedding_bag_collection, names, query_feature_names, candidate_feature_names)
        self.ebc = embedding_bag_collection
        self._query_names = query
        self._candidate_names = candidate
        self._normalize = normalize
        self.query_proj = _tower(sum(dim_of[n] for n in query), sizes, device)
        self.candidate_proj = _tower(sum(dim_of[n] for n in candidate), sizes, device)

    @property
    def query_feature_names(self) -> list[str]:
        return list(self._query_names)

    @property
    def candidate_feature_names(self) -> list[str]:
        return list(self._candidate_names)

    def forward(self, kjt: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``KJT -> (query [B, E], candidate [B, E])``."""
        pooled = self.ebc(kjt)
        if isinstance(pooled, tuple):  # a managed-collision collection: (embeddings, remapped KJT or None)
            pooled = pooled[0]
        query_in, candidate_in = _split_towers(pooled, self._query_names, self._candidate_names)
        query = self.query_proj(query_in)
        candidate = self.candidate_proj(candidate_in)
        if self._normalize:
            query = F.normalize(query, dim=-1)
            candidate = F.normalize(candidate, dim=-1)
        return query, candidate


def _resolve_split(
    ebc: Any, names: list[str], query: list[str] | None, candidate: list[str] | None
) -> tuple[list[str], list[str]]:
    """Which features feed which tower (see ``TwoTower``'s arguments)."""
    for arg, given in (("query_feature_names", query), ("candidate_feature_names", candidate)):
        if isinstance(given, str):
            raise TypeError(f"{arg} must be a list of feature names, got the string {given!r}; write [{given!r}]")
        if given is not None:
            unknown = [n for n in given if n not in names]
            if unknown:
                raise ValueError(f"{arg} names unknown features {unknown}; the collection's features are {names}")
    if query is None and candidate is None:
        configs = ebc.embedding_bag_configs()
        if len(configs) != 2:
            raise ValueError(
                f"TwoTower can only infer the query/candidate split from exactly two tables, got "
                f"{len(configs)} tables; pass query_feature_names=[...] and candidate_feature_names=[...]"
            )
        query, candidate = list(configs[0].feature_names), list(configs[1].feature_names)
    elif query is None:
        query = [n for n in names if n not in candidate]  # type: ignore[operator]
    elif candidate is None:
        candidate = [n for n in names if n not in query]
    query, candidate = list(query), list(candidate)  # type: ignore[arg-type]
    both = [n for n in query if n in candidate]
    if both:
        raise ValueError(f"features {both} are named for both towers; give each feature to one tower")
    for side, feats in (("query", query), ("candidate", candidate)):
        if len(feats) == 0:
            raise ValueError(f"the {side} tower has no features; name them with {side}_feature_names=[...]")
    return query, candidate


class TwoTowerTrainTask(nn.Module):
    """In-batch-negative softmax training of a ``TwoTower``.

    Args:
        two_tower: the model.
        temperature: logits are divided by it (> 0); small values sharpen the softmax.

    ``forward(batch)`` reads ``batch.sparse_features`` (KJT, query and candidate features of ``B``
    pairs) and, when present, ``batch.labels`` ``[B]``: rows with ``label <= 0`` are not used as
    queries (their candidate still serves as a negative for the others), so a batch of rated
    pairs can be fed as is. Returns ``(loss, (loss.detach(), logits.detach(), targets))`` with
    ``logits`` ``[B, B]`` and ``targets = arange(B)`` ``[B]`` int64, ready for ``RecallAtK``
    (filter rows with ``labels <= 0`` out first when there are any).

    Known limitation: a candidate that appears twice in a batch is a false negative for the
    other row; batches drawn uniformly from a large catalogue make this rare.
    """

    def __init__(self, two_tower: TwoTower, temperature: float = 1.0) -> None:
        super().__init__()
        if not isinstance(two_tower, nn.Module):
            raise TypeError(f"two_tower must be an nn.Module, got {type(two_tower).__name__}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
        self.two_tower = two_tower
        self.temperature = float(temperature)

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``batch -> (loss, (loss, logits [B, B], targets [B]))``."""
        query, candidate = self.two_tower(batch.sparse_features)
        logits = query @ candidate.t() / self.temperature
        targets = torch.arange(logits.shape[0], device=logits.device)
        per_query = F.cross_entropy(logits, targets, reduction="none")
        labels = getattr(batch, "labels", None)
        if labels is None:
            loss = per_query.mean()
        else:
            if labels.shape != per_query.shape:
                raise ValueError(
                    f"batch.labels must have shape [B] = [{per_query.shape[0]}], got {tuple(labels.shape)}"
                )
            positive = (labels > 0).to(per_query.dtype)
            # Mean over positive rows; a batch without positives gives a zero loss (still in the graph).
            loss = (per_query * positive).sum() / positive.sum().clamp(min=1.0)
        return loss, (loss.detach(), logits.detach(), targets)
