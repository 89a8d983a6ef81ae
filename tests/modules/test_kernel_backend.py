"""One spelling of the kernel choice, ``kernel_backend``; the older ``backend=`` and ``use_fbgemm=``
keep working with a ``DeprecationWarning`` that names the new spelling, and contradictions fail."""

from __future__ import annotations

import warnings

import pytest
import torch

import lightrec
from lightrec.modules.kernel_backend import resolve_kernel_backend

TABLES = [lightrec.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]


def _deprecated(call):  # noqa: ANN001, ANN202
    """``call()``'s result and the one DeprecationWarning it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 1, messages
    return result, messages[0]


def test_resolve_kernel_backend() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the one spelling warns about nothing
        assert resolve_kernel_backend("auto", "f") == "auto"
        assert resolve_kernel_backend("triton", "f") == "triton"
    assert _deprecated(lambda: resolve_kernel_backend("auto", "f", backend="torch")) == (
        "torch",
        "f(backend='torch') is deprecated: pass kernel_backend='torch'",
    )
    assert _deprecated(lambda: resolve_kernel_backend("auto", "f", use_fbgemm=False))[0] == "torch"
    assert _deprecated(lambda: resolve_kernel_backend("fbgemm", "f", use_fbgemm=True))[0] == "fbgemm"
    with pytest.raises(ValueError, match=r"f: kernel_backend='triton', backend='torch' ask for different kernels"):
        resolve_kernel_backend("triton", "f", backend="torch")
    with pytest.raises(ValueError, match=r"backend='fbgemm', use_fbgemm=False ask for different kernels"):
        resolve_kernel_backend("auto", "f", backend="fbgemm", use_fbgemm=False)


def test_old_spellings_still_choose_the_kernel() -> None:
    from lightrec.inference import quantize
    from lightrec.kernels import BatchedEmbeddingBag, FusedEmbeddingBagCollection
    from lightrec.quant import QuantEmbeddingBagCollection
    from lightrec.quant.sharded_embedding_bag import shard_for_inference

    bag, message = _deprecated(lambda: BatchedEmbeddingBag([(10, 4)], backend="torch"))
    assert bag.backend_name == "torch" and "BatchedEmbeddingBag(backend='torch')" in message
    fused, _ = _deprecated(
        lambda: FusedEmbeddingBagCollection(TABLES, fused_params={"optimizer": "sgd", "learning_rate": 0.1}, backend="torch")
    )
    assert {m.backend_name for m in fused.modules() if isinstance(m, BatchedEmbeddingBag)} == {"torch"}
    q, message = _deprecated(lambda: QuantEmbeddingBagCollection(TABLES, use_fbgemm=False))
    assert q.kernel == "torch" and "use_fbgemm=False) is deprecated: pass kernel_backend='torch'" in message
    ebc = lightrec.EmbeddingBagCollection(TABLES)
    q, _ = _deprecated(lambda: quantize(ebc, "int8", backend="torch"))
    assert q.kernel == "torch"
    sharded, _ = _deprecated(lambda: shard_for_inference(q, devices=1, use_fbgemm=False))
    kjt = lightrec.KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    assert torch.equal(sharded(kjt).values(), q(kjt).values())


def test_strategy_and_sharders_take_kernel_backend() -> None:
    from lightrec.distributed import get_default_sharders

    assert [s.kernel_backend for s in get_default_sharders(kernel_backend="torch")] == ["torch"] * 6  # + MC twins
    with pytest.raises(ValueError, match="kernel_backend must be one of"):
        get_default_sharders(kernel_backend="tbe")
