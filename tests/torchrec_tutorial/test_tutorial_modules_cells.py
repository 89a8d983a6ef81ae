"""The TorchRec tutorial's data-type and EBC cells, with ``torchrec`` replaced by ``lightrec``.

The code below is the tutorial's (``../shared/seeds/intro-to-torchrec-tutorial.txt``, sections
"TorchRec Input/Output Data Types" and "From EmbeddingBag to EmbeddingBagCollection"); the expected
lines are the output the TorchRec tutorial prints. Object addresses in the TorchRec tutorial's ``to_dict`` line are compared
by type only.
"""

from __future__ import annotations

import contextlib
import io

import torch

EXPECTED_DATA_TYPES = """\
Offsets: tensor([1, 3])
First Batch: tensor([5])
Second Batch: tensor([7, 1])
Offsets: tensor([0, 1, 3])
List of Values: [tensor([5]), tensor([7, 1])]
JaggedTensor({
[[5], [7, 1]]
})
Keys: ['product', 'user']
Lengths: tensor([3, 1, 2, 2])
Values: tensor([1, 2, 1, 5, 2, 3, 4, 1])
to_dict: {'product': <JaggedTensor>, 'user': <JaggedTensor>}
KeyedJaggedTensor({
"product": [[1, 2, 1], [5]],
"user": [[2, 3], [4, 1]]
})
['product', 'user']
torch.Size([2, 128])
product torch.Size([2, 64])
user torch.Size([2, 64])"""

EXPECTED_EBC = """\
ModuleDict(
(product_table): EmbeddingBag(4096, 64, mode='sum')
(user_table): EmbeddingBag(4096, 64, mode='sum')
)"""


def _normalise(text: str) -> list[str]:
    import re

    lines = [ln.strip() for ln in text.splitlines()]
    lines = [re.sub(r"<lightrec\.sparse\.jagged_tensor\.JaggedTensor object at 0x[0-9a-f]+>", "<JaggedTensor>", ln)
             for ln in lines]
    # print("X: ", y) puts two spaces after the colon; the TorchRec tutorial's HTML rendering collapsed them.
    return [re.sub(r"\s+", " ", ln) for ln in lines if ln]


def _run_cells():
    import lightrec as torchrec  # the only change a torchrec user makes (import lightrec)

    ebc = torchrec.EmbeddingBagCollection(
        device="cpu",
        tables=[
            torchrec.EmbeddingBagConfig(
                name="product_table",
                embedding_dim=64,
                num_embeddings=4096,
                feature_names=["product"],
                pooling=torchrec.PoolingType.SUM,
            ),
            torchrec.EmbeddingBagConfig(
                name="user_table",
                embedding_dim=64,
                num_embeddings=4096,
                feature_names=["user"],
                pooling=torchrec.PoolingType.SUM,
            ),
        ],
    )
    ebc_out = io.StringIO()
    with contextlib.redirect_stdout(ebc_out):
        print(ebc.embedding_bags)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        id_list_feature_lengths = torch.tensor([1, 2])
        id_list_feature_values = torch.tensor([5, 7, 1])
        id_list_feature_offsets = torch.cumsum(id_list_feature_lengths, dim=0)
        print("Offsets: ", id_list_feature_offsets)
        print("First Batch: ", id_list_feature_values[: id_list_feature_offsets[0]])
        print(
            "Second Batch: ",
            id_list_feature_values[id_list_feature_offsets[0] : id_list_feature_offsets[1]],
        )
        from lightrec import JaggedTensor

        jt = JaggedTensor(values=id_list_feature_values, lengths=id_list_feature_lengths)
        print("Offsets: ", jt.offsets())
        print("List of Values: ", jt.to_dense())
        print(jt)
        from lightrec import KeyedJaggedTensor

        product_jt = JaggedTensor(values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1]))
        user_jt = JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2]))
        kjt = KeyedJaggedTensor.from_jt_dict({"product": product_jt, "user": user_jt})
        print("Keys: ", kjt.keys())
        print("Lengths: ", kjt.lengths())
        print("Values: ", kjt.values())
        print("to_dict: ", kjt.to_dict())
        print(kjt)
        result = ebc(kjt)
        print(result.keys())
        print(result.values().shape)
        result_dict = result.to_dict()
        for key, embedding in result_dict.items():
            print(key, embedding.shape)
    return ebc_out.getvalue(), out.getvalue(), ebc, kjt


def test_tutorial_data_type_cells_print_what_the_tutorial_shows() -> None:
    ebc_text, text, _, _ = _run_cells()
    assert _normalise(ebc_text) == _normalise(EXPECTED_EBC)
    assert _normalise(text) == _normalise(EXPECTED_DATA_TYPES)


def test_tutorial_pytorch_embedding_cell_values() -> None:
    """The first cell (plain nn.Embedding / nn.EmbeddingBag) agrees with our EBC on the same weights."""
    import lightrec

    weights = torch.rand(10, 4)
    bag = torch.nn.EmbeddingBag(10, 4, _weight=weights)  # default mode is mean
    ebc = lightrec.EmbeddingBagCollection(
        tables=[lightrec.EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"],
                                            pooling=lightrec.PoolingType.MEAN)]
    )
    with torch.no_grad():
        ebc.embedding_bags["t"].weight.copy_(weights)
    ids = torch.tensor([[1, 3]])
    kjt = lightrec.KeyedJaggedTensor(keys=["f"], values=ids.flatten(), lengths=torch.tensor([2]))
    torch.testing.assert_close(ebc(kjt).values(), bag(ids))
