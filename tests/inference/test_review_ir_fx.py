"""Review of ``lightrec.fx.symbolic_trace``: a DLRM with a KJT input traces to a graph with the
eager outputs, the KJT's methods stay ``call_method`` nodes (as under torchrec's tracer),
torchrec's ``(root, concrete_args, leaf_modules)`` signature works, and a module fx cannot trace
is named in the error."""

# No `from __future__ import annotations`: fx copies forward() annotations into the traced code.

import pytest
import torch
from torch import nn

from lightrec.fx import UntraceableModuleError, symbolic_trace
from lightrec.models import DLRM
from lightrec.modules.embedding_configs import EmbeddingBagConfig
from lightrec.modules.embedding_modules import EmbeddingBagCollection
from lightrec.sparse import KeyedJaggedTensor


def dlrm() -> DLRM:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"])]
    )
    return DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[4, 1])


def kjt() -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3, 4, 9]), lengths=torch.tensor([2, 0, 1, 2]))


def test_traced_dlrm_equals_eager_and_keeps_kjt_methods_as_calls() -> None:
    model = dlrm().eval()
    dense = torch.rand(2, 3)
    traced = symbolic_trace(model)
    assert torch.equal(traced(dense, kjt()), model(dense, kjt()))
    methods = {n.target for n in traced.graph.nodes if n.op == "call_method"}
    assert {"values", "lengths"} <= methods  # the KJT's accessors are recorded, not traced into


class _Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = dlrm()

    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor, scale: float) -> torch.Tensor:
        return self.model(dense, features) * scale


def test_torchrecs_signature_root_concrete_args_leaf_modules() -> None:
    wrapper = _Wrapper().eval()
    dense = torch.rand(2, 3)
    traced = symbolic_trace(wrapper, {"scale": 2.0}, ["DenseArch"])  # torchrec's positional order
    assert torch.equal(traced(dense, kjt(), 2.0), wrapper(dense, kjt(), 2.0))  # fx keeps the argument
    assert "model.dense_arch" in {n.target for n in traced.graph.nodes if n.op == "call_module"}
    leafy = symbolic_trace(dlrm(), leaf_modules=["DenseArch"])
    assert "dense_arch" in {n.target for n in leafy.graph.nodes if n.op == "call_module"}
    old_style = symbolic_trace(dlrm(), ["DenseArch"])  # lightrec's earlier (module, leaf_modules)
    assert "dense_arch" in {n.target for n in old_style.graph.nodes if n.op == "call_module"}
    with pytest.raises(TypeError, match=r"concrete_args.*got str"):
        symbolic_trace(dlrm(), "DenseArch")  # type: ignore[arg-type]


class _Branchy(nn.Module):
    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        if features.values().sum() > 3:  # control flow on a traced value
            return features.values()
        return features.lengths()


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(_Branchy())

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.inner(features)


def test_an_untraceable_module_is_named_with_the_fix() -> None:
    with pytest.raises(UntraceableModuleError, match=r"module 'inner\.0' \(_Branchy\).*leaf_modules=\['_Branchy'\]") as e:
        symbolic_trace(_Outer())
    assert isinstance(e.value, torch.fx.proxy.TraceError) and e.value.module_path == "inner.0"
    with pytest.raises(UntraceableModuleError, match=r"the root module \(_Branchy\)"):
        symbolic_trace(_Branchy())
    # the fix the message names works: the module runs as one call
    traced = symbolic_trace(_Outer(), leaf_modules=["_Branchy"])
    assert torch.equal(traced(kjt()), _Outer()(kjt()))
