"""The sparse types and collections under torch.fx, torch.jit.script and torch.compile."""

# No `from __future__ import annotations` here: fx copies forward() annotations into the traced
# code, and TorchScript must see real classes, not strings.

import pytest
import torch

from lightrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor
from lightrec.modules import EmbeddingIdError


class _Model(torch.nn.Module):
    """A module that takes a KJT (as inference models do) and returns pooled embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            [
                EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["a", "b"]),
                EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=2, feature_names=["c"]),
            ]
        )

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(kjt).values()


def _kjt(keys: "list[str] | None" = None, bad: bool = False) -> KeyedJaggedTensor:
    values = torch.tensor([1, 5, 19, 3, 4, 8, 0] if not bad else [1, 5, 19, 3, 4, 9, 0])
    return KeyedJaggedTensor(keys=keys or ["a", "b", "c"], values=values, lengths=torch.tensor([2, 1, 0, 2, 1, 1]))


def test_fx_trace_then_script_reproduces_eager_outputs() -> None:
    torch.manual_seed(0)
    model = _Model()
    gm = torch.fx.symbolic_trace(model)
    scripted = torch.jit.script(gm)
    kjt = _kjt()
    expected = model(kjt)
    torch.testing.assert_close(gm(kjt), expected)
    torch.testing.assert_close(scripted(kjt), expected)
    # keys in another order are permuted inside the scripted graph
    torch.testing.assert_close(scripted(kjt.permute([2, 0, 1])), expected)


def test_scripted_graph_keeps_the_id_check() -> None:
    scripted = torch.jit.script(torch.fx.symbolic_trace(_Model()))
    with pytest.raises(Exception, match="table 't1' has 9 rows"):
        scripted(_kjt(bad=True))
    with pytest.raises(EmbeddingIdError):
        _Model()(_kjt(bad=True))


def test_scripted_function_uses_kjt_methods() -> None:
    @torch.jit.script
    def use(kjt: KeyedJaggedTensor) -> list[torch.Tensor]:
        parts = kjt.split([1, 2])
        kt = KeyedTensor.from_tensor_list(["x"], [kjt.values().float().unsqueeze(1)])
        return [kjt["b"].values(), kjt.permute([2, 0]).lengths(), parts[1].offsets(), kt.to_dict()["x"]]

    kjt = _kjt()
    got = use(kjt)
    assert got[0].tolist() == [3, 4]
    assert got[1].tolist() == [1, 1, 2, 1]
    assert got[2].tolist() == [0, 0, 2, 3, 4]
    assert got[3].shape == (7, 1)


def _every_scriptable_kjt_path(values: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b", "c"], values, lengths)
    from_offsets = KeyedJaggedTensor.from_offsets_sync(["a", "b", "c"], values, kjt.offsets())
    both = KeyedJaggedTensor.concat([kjt, from_offsets.permute_to_keys(["c", "a", "b"])])
    moved = kjt.to(torch.device("cpu")).flatten_lengths()
    like = KeyedJaggedTensor.empty_like(kjt, torch.device("cpu"))
    variable = KeyedJaggedTensor(
        keys=["u", "i"], values=values[:6], lengths=lengths[:5], stride_per_key_per_rank=[[2], [3]]
    )
    out = [both.lengths(), both.split([2, 4])[1].values(), moved.offsets()]
    out.extend(kjt.dist_tensors() + variable.dist_tensors() + [variable.permute([1, 0]).values()])
    sizes = [kjt.stride(), like.stride(), like.lengths().numel(), KeyedJaggedTensor.empty(True).stride()]
    sizes += [len(KeyedJaggedTensor.empty_like(kjt).keys())]
    sizes += kjt.dist_splits([1, 2])[1] + variable.dist_splits([1, 1])[0] + variable.lengths_offset_per_key()
    sizes += variable.length_per_key() + [kjt.index_per_key()["c"]] + variable.split([1, 1])[1].stride_per_key()
    return out + [torch.tensor(sizes)]


def test_scripted_kjt_constructors_and_transforms_match_eager() -> None:
    """Every method TorchScript compiles runs the same scripted and eager: the helpers in the
    ``kjt_*`` modules are compiled from the class's methods without compiling the class twice."""
    scripted = torch.jit.script(_every_scriptable_kjt_path)
    values = torch.tensor([1, 5, 19, 3, 4, 8, 0])
    lengths = torch.tensor([2, 1, 0, 2, 1, 1])
    expected = _every_scriptable_kjt_path(values, lengths)
    got = scripted(values, lengths)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_torch_compile_has_no_graph_breaks_in_common_paths() -> None:
    """Splitting values per key needs data-dependent sizes, which dynamo captures as unbacked
    symbolic ints once ``capture_scalar_outputs`` is on (the setting torchrec documents too)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = _Model()

    def step(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths, stride=2)
        return model(kjt).sum() + kjt.offsets().sum()

    kjt = _kjt()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        explanation = torch._dynamo.explain(step)(kjt.values(), kjt.lengths())
        assert explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(step, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(kjt.values(), kjt.lengths()), step(kjt.values(), kjt.lengths()))


class _WeightedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            [EmbeddingBagConfig(name="t", num_embeddings=20, embedding_dim=4, feature_names=["a", "b", "c"])],
            is_weighted=True,
        )

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(kjt).values()


def test_weighted_collection_traces_then_scripts() -> None:
    model = _WeightedModel()
    kjt = _kjt()
    kjt = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                            weights=torch.rand(kjt.values().numel()))
    scripted = torch.jit.script(torch.fx.symbolic_trace(model))
    torch.testing.assert_close(scripted(kjt), model(kjt))
