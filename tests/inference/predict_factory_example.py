"""A torchrec-style PredictFactory, packaged by tests/inference/test_torchrec_serving.py.

Its configs come from inside the package (``load_config_text``), as a factory loaded by a server would
read them; the model is a quantized DLRM whose weights are in the state-dict file the config names.
"""

from __future__ import annotations

import torch

from lightrec.inference.model_packager import load_config_text
from lightrec.inference.modules import BatchingMetadata, PredictFactory, PredictModule, quantize_embeddings
from lightrec.sparse.jagged_tensor import KeyedJaggedTensor
from tests.inference.helpers import FEATURES, dlrm


class DLRMPredictModule(PredictModule):
    def predict_forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        kjt = KeyedJaggedTensor(keys=FEATURES, values=batch["values"], lengths=batch["lengths"])
        return {"default": torch.sigmoid(self.predict_module(batch["float_features"], kjt)).squeeze(1)}


class DLRMPredictFactory(PredictFactory):
    def create_predict_module(self) -> torch.nn.Module:
        model = dlrm(seed=0)
        model.load_state_dict(torch.load(load_config_text("weights_path"), weights_only=True))
        return DLRMPredictModule(quantize_embeddings(model, dtype=torch.qint8, inplace=True))

    def batching_metadata(self) -> dict[str, BatchingMetadata]:
        return {"float_features": BatchingMetadata("dense", "cpu", []),
                "id_list_features": BatchingMetadata("sparse", "cpu", ["lengths"])}  # fmt: skip

    def result_metadata(self) -> str:
        return "dict_of_tensor"

    def run_weights_independent_tranformations(self, predict_module: torch.nn.Module) -> torch.nn.Module:
        return predict_module

    def run_weights_dependent_transformations(self, predict_module: torch.nn.Module) -> torch.nn.Module:
        return predict_module
