"""Feature processors (torchrec's ``torchrec.modules.feature_processor_``): per-id weights computed
from the features before they are pooled.

``PositionWeightedModule`` gives the id at position ``k`` of its bag the learned weight
``position_weight[k]`` (one parameter per position, initialised to 1), so a pooled table sums its
rows with weights that depend on where they sit in the sequence::

    bag of feature f:       ids   [17, 4, 9]           (positions 0, 1, 2)
    weights:                      [p_f[0], p_f[1], p_f[2]]
    pooled (weighted SUM):  p_f[0] * E[17] + p_f[1] * E[4] + p_f[2] * E[9]

:class:`PositionWeightedModule` processes one ``JaggedTensor``; :class:`PositionWeightedModuleCollection`
a whole ``KeyedJaggedTensor`` (keys without a processor get weight 1). Bags longer than the
processor's ``max_feature_length`` raise ``FeatureProcessorError`` naming the feature (torchrec's
gather fails with an index error). Whatever weights the input carried are replaced.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from lightrec.modules._dense_checks import check_positive_int
from lightrec.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "FeatureProcessor",
    "FeatureProcessorError",
    "FeatureProcessorsCollection",
    "PositionWeightedModule",
    "PositionWeightedModuleCollection",
    "positions_in_bags",
    "with_weights",
]


class FeatureProcessorError(ValueError):
    """A feature processor got input it cannot process (a bag longer than its positions)."""


def positions_in_bags(lengths: torch.Tensor, num_values: int) -> torch.Tensor:
    """``[N]`` int64 position of every value within its bag, from ``[B]`` (or ``[F * B]``) lengths.

    >>> positions_in_bags(torch.tensor([2, 0, 3]), 5).tolist()
    [0, 1, 0, 1, 2]
    """
    lengths = lengths.long()
    starts = torch.cumsum(lengths, 0) - lengths
    return torch.arange(num_values, device=lengths.device) - torch.repeat_interleave(
        starts, lengths, output_size=num_values
    )


def _check_lengths(lengths: torch.Tensor, max_length: int, feature: str | None) -> None:
    """Raise ``FeatureProcessorError`` for a bag longer than ``max_length``; ``feature`` names the
    feature (``None``: a lone ``JaggedTensor``, whose caller adds the name when it knows it)."""
    what = "a bag" if feature is None else f"feature {feature!r} has a bag"
    if torch.compiler.is_compiling():
        # torch.export / torch.compile: no Python branch on data; the program asserts at run time
        torch._assert_async(torch.all(lengths <= max_length), f"{what} longer than {max_length} positions")
        return
    if lengths.numel() and int(lengths.max()) > max_length:
        raise FeatureProcessorError(
            f"{what} of {int(lengths.max())} ids but its position weights cover "
            f"max_feature_length={max_length} positions; truncate the bags or give a larger max_feature_length"
        )



def with_weights(features: KeyedJaggedTensor, weights: torch.Tensor) -> KeyedJaggedTensor:
    """``features`` with ``weights`` ``[N]`` as its per-id weights (same tensors and sizes otherwise)."""
    return features._copy_with(
        features.values(), weights, features.lengths_or_none(), features.offsets_or_none(),
        features.inverse_indices_or_none(),
    )  # fmt: skip


class FeatureProcessor(nn.Module, abc.ABC):
    """Maps one feature's ``JaggedTensor`` to the same ids with per-id weights."""

    @abc.abstractmethod
    def forward(self, features: JaggedTensor) -> JaggedTensor:
        """The same values and lengths, with ``weights`` filled in."""


class PositionWeightedModule(FeatureProcessor):
    """Position weights of one feature (see the module docstring).

    Args:
        max_feature_length: the longest bag (number of position weights).
        dtype: dtype of the weights.
        device: where the weights live.
    """

    def __init__(
        self, max_feature_length: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.max_feature_length = check_positive_int("max_feature_length", max_feature_length)
        self.position_weight = nn.Parameter(torch.ones(max_feature_length, dtype=dtype, device=device))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.position_weight.fill_(1.0)

    def forward(self, features: JaggedTensor) -> JaggedTensor:
        lengths = features.lengths()
        _check_lengths(lengths, self.max_feature_length, None)
        positions = positions_in_bags(lengths, features.values().numel())
        return JaggedTensor(
            values=features.values(), weights=self.position_weight[positions], lengths=lengths,
            offsets=features.offsets(),
        )  # fmt: skip


class FeatureProcessorsCollection(nn.Module, abc.ABC):
    """Maps a whole ``KeyedJaggedTensor`` to the same ids with per-id weights."""

    @abc.abstractmethod
    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The same keys, values and lengths, with ``weights`` filled in."""


class PositionWeightedModuleCollection(FeatureProcessorsCollection):
    """Position weights of several features: ``position_weights[key]`` ``[max_feature_lengths[key]]``.

    Args:
        max_feature_lengths: ``{feature: longest bag}``.
        device: where the weights live.
    """

    def __init__(self, max_feature_lengths: dict[str, int], device: torch.device | str | None = None) -> None:
        super().__init__()
        bad = {k: v for k, v in max_feature_lengths.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0}
        if bad:
            raise ValueError(f"max_feature_lengths must be positive ints, got {bad}")
        self.max_feature_lengths = dict(max_feature_lengths)
        self.position_weights = nn.ParameterDict(
            {k: nn.Parameter(torch.ones(n, device=device)) for k, n in max_feature_lengths.items()}
        )

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for p in self.position_weights.values():
                p.fill_(1.0)

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        values = features.values()
        lengths = features.lengths()
        positions = positions_in_bags(lengths, values.numel())
        parts = []
        for key, pos, lens in zip(features.keys(), positions.split(features.length_per_key()),
                                  lengths.split(features.stride_per_key())):  # fmt: skip
            if key in self.position_weights:
                _check_lengths(lens, self.max_feature_lengths[key], key)
                parts.append(self.position_weights[key][pos])
            else:
                parts.append(torch.ones(pos.numel(), device=values.device))
        weights = torch.cat(parts) if parts else torch.ones(0, device=values.device)
        if torch.compiler.is_compiling():
            # torch.export sizes the parts by data (length_per_key): state that they add up to the ids
            torch._check(weights.numel() == values.numel())
        return with_weights(features, weights)
