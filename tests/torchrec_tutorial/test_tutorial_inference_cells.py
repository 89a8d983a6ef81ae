"""The TorchRec tutorial's "Inference" cells (quantize -> shard -> fx trace -> script) under lightrec.

The code is the tutorial's (``../shared/seeds/intro-to-torchrec-tutorial.txt``, section
"Inference"), with ``torchrec`` replaced by ``lightrec`` -- including the torchrec module paths
``lightrec.modules.embedding_configs.QuantConfig``, ``lightrec.distributed.shard._shard_modules``
and ``lightrec.fx.Tracer``.
"""

# No `from __future__ import annotations`: InferenceModule.forward is fx-traced.

import contextlib
import io

import torch

import lightrec as torchrec  # the only change a torchrec user makes
from lightrec import KeyedJaggedTensor

EXPECTED_BUFFERS = [
    "ebc_.embedding_bags.product_table.weight torch.Size([4096, 80]) torch.uint8",
    "ebc_.embedding_bags.user_table.weight torch.Size([4096, 80]) torch.uint8",
]
EXPECTED_PARAMS = [
    "ebc_.embedding_bags.product_table.weight torch.Size([4096, 64]) torch.float32",
    "ebc_.embedding_bags.user_table.weight torch.Size([4096, 64]) torch.float32",
]


def _imports():
    from lightrec.distributed.shard import _shard_modules
    from lightrec.fx import Tracer
    from lightrec.modules.embedding_configs import QuantConfig

    return QuantConfig, _shard_modules, Tracer


class InferenceModule(torch.nn.Module):
    def __init__(self, ebc: torchrec.EmbeddingBagCollection):
        super().__init__()
        self.ebc_ = ebc

    def forward(self, kjt: KeyedJaggedTensor):
        return self.ebc_(kjt)


def test_torchrec_tutorial_inference_cells() -> None:
    QuantConfig, _shard_modules, Tracer = _imports()
    from torch import quantization as quant

    from lightrec import distributed as trec_dist
    from lightrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    ebc = torchrec.EmbeddingBagCollection(
        device="cpu",
        tables=[
            torchrec.EmbeddingBagConfig(name="product_table", embedding_dim=64, num_embeddings=4096,
                                        feature_names=["product"], pooling=torchrec.PoolingType.SUM),
            torchrec.EmbeddingBagConfig(name="user_table", embedding_dim=64, num_embeddings=4096,
                                        feature_names=["user"], pooling=torchrec.PoolingType.SUM),
        ],
    )
    kjt = KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
                            lengths=torch.tensor([3, 1, 2, 2]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module = InferenceModule(ebc)
        for name, param in module.named_parameters():
            print(name, param.shape, param.dtype)

        quant_dtype = torch.int8
        qconfig = QuantConfig(
            activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
            weight=quant.PlaceholderObserver.with_args(dtype=quant_dtype),
        )
        qconfig_spec = {torchrec.EmbeddingBagCollection: qconfig}
        mapping = {torchrec.EmbeddingBagCollection: QuantEmbeddingBagCollection}
        module = InferenceModule(ebc)
        qebc = quant.quantize_dynamic(module, qconfig_spec=qconfig_spec, mapping=mapping, inplace=False)
        print(f"Quantized EBC: {qebc}")
        kjt = kjt.to("cpu")
        quantized_out = qebc(kjt)
        for name, buffer in qebc.named_buffers():
            print(name, buffer.shape, buffer.dtype)

        sharded_qebc = _shard_modules(module=qebc, device=torch.device("cpu"),
                                      env=trec_dist.ShardingEnv.from_local(1, 0))
        print(f"Sharded Quantized EBC: {sharded_qebc}")
        sharded_out = sharded_qebc(kjt)

        tracer = Tracer(leaf_modules=["IntNBitTableBatchedEmbeddingBagsCodegen"])
        graph = tracer.trace(sharded_qebc)
        gm = torch.fx.GraphModule(sharded_qebc, graph)
        print("Graph Module Created!")
        print(gm.code)
        scripted_gm = torch.jit.script(gm)
        print("Scripted Graph Module Created!")
        print(scripted_gm.code)

    lines = [ln.strip() for ln in out.getvalue().splitlines()]
    assert lines[:2] == EXPECTED_PARAMS
    assert lines[2] == "Quantized EBC: InferenceModule(" and "(ebc_): QuantEmbeddingBagCollection(" in lines
    assert [ln for ln in lines if ln.startswith("ebc_.embedding_bags.") and "uint8" in ln] == EXPECTED_BUFFERS
    assert "(ebc_): ShardedQuantEmbeddingBagCollection(" in lines
    assert "Graph Module Created!" in lines and "Scripted Graph Module Created!" in lines
    # the quantized, sharded and scripted modules agree with each other and (to int8 precision) with fp32
    assert isinstance(sharded_out, torchrec.KeyedTensor)
    assert torch.equal(sharded_out.values(), quantized_out.values())
    assert torch.equal(scripted_gm(kjt).values(), quantized_out.values())
    torch.testing.assert_close(quantized_out.values(), ebc(kjt).values(), atol=2e-4, rtol=0)
