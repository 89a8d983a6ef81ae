"""The planted Criteo model of :mod:`lightrec.data.synthetic.planted`, sampled with torch on any device.

A GPU that trains at millions of samples per second cannot be fed by numpy in a few data-loader
workers; generating the batch where it is consumed costs a few dozen kernel launches and no
host-to-device copy. :class:`TorchPlantedSampler` draws from the same hidden model as the numpy
generator (same dense parameters, power-law id popularity, scattering permutation, hashed
per-id effects and logistic labels), so the data have the same distribution and the same
Bayes-optimal AUC. The *sample stream* is a different one: torch's generators (CPU or CUDA) are not
numpy's, so a device batch is not the host batch of the same index.

Everything is vectorised over all 26 features at once, ids laid out key-major::

    fid     [N]  feature of each id (feature 0's ids, then feature 1's, ...)
    u       [N]  uniforms -> popularity ranks (exact head CDF + continuous tail, as bounded_zipf)
    ids     [N]  (rank * a_f + b_f) % n_f            effects [N]  std_f * hash_unit(id, seed, 1000 + f)
    logit   [n]  bias + z . w + sum_f mean over bag_f of effects

Bag sizes are drawn on the host (numpy, a few bytes per sample; fixed sizes need no draw), so every
size the lookups need, including ids per key, is known without reading the device, and no
pageable host-to-device copy (which would stall a CUDA stream) is made. Hashes reproduce
:func:`lightrec.data.hashing.mix64` bit for bit in int64 arithmetic (wrapping multiply, masked
logical shifts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lightrec.data.hashing import mix64, stream_key, zipf_tables
from lightrec.data.synthetic.planted import PlantedCriteoModel

__all__ = ["DeviceBlock", "TorchPlantedSampler", "torch_hash_unit", "torch_mix64"]

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A uint64 bit pattern as the int64 holding the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _M1, _M2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def torch_mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 tensors holding uint64 bits (equals ``mix64`` bit for bit)."""
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _M1
    x = (x ^ _shift_right(x, 27)) * _M2
    return x ^ _shift_right(x, 31)


def torch_hash_unit(ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``hash_unit`` of ``ids`` under per-id stream keys (int64 bit patterns of ``stream_key``); float64."""
    h = torch_mix64(ids ^ keys)
    uniform = _shift_right(h, 11).to(torch.float64) * (1.0 / (1 << 53))
    return (uniform - 0.5) * (2.0 * math.sqrt(3.0))


@dataclass
class DeviceBlock:
    """``n`` samples on the device: ``dense [n, 13]`` f32, ``values [N]`` i64 (key-major), ``lengths``
    ``[26, n]`` i32, ``ids_per_key`` (host ints), ``logit [n]`` f64, ``labels [n]`` f32."""

    dense: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor
    ids_per_key: list[int]
    logit: torch.Tensor
    labels: torch.Tensor


class TorchPlantedSampler:
    """Draws blocks of a :class:`~lightrec.data.PlantedCriteoModel` on ``device``.

    Args:
        model: the hidden model (read for its parameters only).
        device: where samples are generated (``"cuda"``, ``"cpu"``, ...).
    """

    def __init__(self, model: PlantedCriteoModel, device: torch.device | str) -> None:
        self.model = model
        self.device = torch.device(device)
        m = model
        sizes = m.num_embeddings
        self.num_features = len(sizes)
        exponent = m.zipf_exponent
        heads, head_start, los, his, masses = [], [0], [], [], []
        for f, n in enumerate(sizes):
            cdf, lo, hi, mass = zipf_tables(int(n), float(exponent))
            # Shifted by 2f, the concatenated head CDFs are one increasing sequence: one
            # searchsorted serves every feature (u + 2f lands in feature f's stretch).
            heads.append(cdf + 2.0 * f)
            head_start.append(head_start[-1] + cdf.shape[0])
            los.append(lo)
            his.append(hi)
            masses.append(mass)
        dev, f64, i64 = self.device, torch.float64, torch.int64
        self._cdf = torch.tensor(np.concatenate(heads), dtype=f64, device=dev)
        self._head_start = torch.tensor(head_start[:-1], dtype=i64, device=dev)
        self._head_size = torch.tensor(np.diff(head_start), dtype=i64, device=dev)
        self._lo = torch.tensor(los, dtype=f64, device=dev)
        self._hi = torch.tensor(his, dtype=f64, device=dev)
        self._mass = torch.tensor(masses, dtype=f64, device=dev)
        self._exponent = float(exponent)
        self._size = torch.tensor(sizes, dtype=i64, device=dev)
        self._scatter_a = torch.tensor([a for a, _ in m.scatter], dtype=i64, device=dev)
        self._scatter_b = torch.tensor([b for _, b in m.scatter], dtype=i64, device=dev)
        seed = m.seed
        self._hash_key = torch.tensor(
            [_signed(int(stream_key(seed, 1000 + f))) for f in range(self.num_features)], dtype=i64, device=dev
        )
        self._effect_std = torch.tensor(m.effect_std, dtype=f64, device=dev)
        self._dense_mu = torch.tensor(m.dense_mu, dtype=f64, device=dev)
        self._dense_sigma = torch.tensor(m.dense_sigma, dtype=f64, device=dev)
        self._dense_weight = torch.tensor(m.dense_weight, dtype=f64, device=dev)
        self._features = torch.arange(self.num_features, device=dev)
        self._fixed_counts = torch.tensor(m.ids_per_feature, dtype=i64, device=dev)

    def _generator(self, split: int, block: int) -> torch.Generator:
        seed = int(mix64(np.array([self.model.seed * 7_919 + split * 104_729 + block], dtype=np.uint64))[0])
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed & ((1 << 63) - 1))
        return gen

    def _bag_sizes(self, split: int, block: int, n: int) -> np.ndarray:
        """``[26, n]`` ids per (feature, sample), drawn on the host so every size stays host-known."""
        counts = np.asarray(self.model.ids_per_feature, dtype=np.int64)[:, None]
        if self.model.ids_distribution == "poisson":
            rng = np.random.default_rng([self.model.seed, split, block, 0xB46])
            return rng.poisson(counts, (self.num_features, n)).astype(np.int32)
        return np.broadcast_to(counts, (self.num_features, n)).astype(np.int32)

    def ranks(self, u: torch.Tensor, fid: torch.Tensor) -> torch.Tensor:
        """Popularity ranks ``[N]`` of uniforms ``u`` for features ``fid`` (``bounded_zipf`` per feature)."""
        ranks = torch.searchsorted(self._cdf, u + 2.0 * fid, right=True) - self._head_start[fid]
        mass, lo, hi = self._mass[fid], self._lo[fid], self._hi[fid]
        v = (u - (1.0 - mass)) / mass.clamp(min=1e-300)
        if self._exponent == 1.0:
            x = lo * torch.exp(v * torch.log(hi / lo))
        else:
            a = 1.0 - self._exponent
            x = (lo**a + v * (hi**a - lo**a)).clamp(min=0.0) ** (1.0 / a)
        in_tail = (ranks >= self._head_size[fid]) & (mass > 0)
        ranks = torch.where(in_tail, torch.round(torch.nan_to_num(x)).to(torch.int64) - 1, ranks)
        return torch.minimum(ranks.clamp(min=0), self._size[fid] - 1)

    def generate(self, split: int, block: int, n: int) -> DeviceBlock:
        """Block ``block`` of split code ``split``: ``n`` samples, a pure function of the arguments."""
        gen, dev = self._generator(split, block), self.device
        counts_host = self._bag_sizes(split, block, n)
        ids_per_key = [int(c) for c in counts_host.sum(axis=1)]
        total = sum(ids_per_key)
        # No pageable host-to-device copy (CUDA would wait for the stream): fixed bag sizes are built
        # on the device, Poisson ones travel from pinned memory.
        if self.model.ids_distribution == "poisson":
            host = torch.from_numpy(counts_host)
            lengths = (host.pin_memory() if dev.type == "cuda" else host).to(dev, non_blocking=True)
        else:
            lengths = self._fixed_counts.to(torch.int32)[:, None].expand(self.num_features, n).contiguous()
        z = torch.randn(n, len(self.model.dense_mu), generator=gen, device=dev, dtype=torch.float64)
        dense = torch.log1p(torch.exp(self._dense_mu + self._dense_sigma * z)).to(torch.float32)
        logit = self.model.bias + z @ self._dense_weight
        fid = torch.repeat_interleave(self._features, lengths.sum(dim=1), output_size=total)
        u = torch.rand(total, generator=gen, device=dev, dtype=torch.float64)
        ids = (self.ranks(u, fid) * self._scatter_a[fid] + self._scatter_b[fid]) % self._size[fid]
        effects = self._effect_std[fid] * torch_hash_unit(ids, self._hash_key[fid])
        bag = torch.repeat_interleave(
            torch.arange(self.num_features * n, device=dev), lengths.reshape(-1), output_size=total
        )
        sums = torch.zeros(self.num_features * n, dtype=torch.float64, device=dev).index_add_(0, bag, effects)
        means = sums / lengths.reshape(-1).clamp(min=1)
        logit = logit + means.view(self.num_features, n).sum(dim=0)
        labels = (torch.rand(n, generator=gen, device=dev, dtype=torch.float64) < torch.sigmoid(logit)).to(
            torch.float32
        )
        return DeviceBlock(dense, ids, lengths, ids_per_key, logit, labels)
