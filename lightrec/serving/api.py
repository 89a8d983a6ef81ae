"""``RecServingAPI``: the LitServe ``LitAPI`` that scores requests with an exported lightrec artifact.

LitServe runs one copy of it in every inference worker process and calls, per batch::

    decode_request(body)      -> SampleColumns | Rejected     one request, validated on its own
    batch([decoded, ...])     -> ScoringBatch                  the valid ones joined (batching.py)
    predict(batch)            -> [ScoredRequest | Rejected]    one forward under the model's lock
    unbatch(outputs)          -> outputs                       one per request, in order
    encode_response(output)   -> EncodedResponse               200 {"scores", "version"} or the 4xx, as bytes

The body arrives as the client sent it (bytes): the HTTP server does not parse it but hands it to
the workers (:class:`~lightrec.serving.transport.PredictDispatch`), and ``decode_request`` parses
and validates it in one go, in the worker.

A bad request never raises out of these methods: LitServe fails every request of a batch when
one method raises, so ``decode_request`` returns a :class:`~lightrec.serving.request_forms.Rejected`
instead, which skips the forward and becomes its own 4xx in ``encode_response``.

``setup`` loads the artifact on the worker's device, warms it up, and -- when the server follows
a delta folder -- brings it to the newest published version before the worker reports ready, then
keeps following on a thread (:class:`~lightrec.serving.model_updates.UpdateFollower`).

No ``from __future__ import annotations`` here: LitServe hands ``decode_request``'s annotation to
FastAPI as the type of the request body, which must be an object, not a string.
"""

import gc
import json
import logging
import os
import time
import warnings
from typing import Annotated, Any

import litserve as ls
import torch
from fastapi import Body

from lightrec.inference.predictor import load
from lightrec.serving.batching import ScoredRequest, ScoringBatch, assemble, split
from lightrec.serving.config import ServeConfig
from lightrec.serving.metrics import ServingMetrics, WorkerMetrics, WorkerState
from lightrec.serving.model_updates import UpdateFollower
from lightrec.serving.request_forms import Rejected, SampleColumns, decode_body
from lightrec.serving.scoring_loop import ScoringLoop
from lightrec.serving.served_model import ModelDamaged, ServedModel, UpdaterFactory
from lightrec.serving.transport import EncodedResponse

__all__ = ["RecServingAPI"]

log = logging.getLogger(__name__)

PREDICT_PATH = "/predict"
# TorchScript profiles a module's first calls and optimizes it on the next: run them before requests arrive
_WARMUP_SIZES = (1, 1, 2, 2, 8, 8)


class RecServingAPI(ls.LitAPI):
    """See the module docstring.

    Args:
        config: the server's options (artifact, batching, limits, follow interval).
        metrics: the shared metrics (this worker writes its slot).
        updater_factory: builds the worker's updater (``--deltas`` or a test's fake); None: no live updates.
        threads: torch intra-op threads per worker on CPU.
    """

    def __init__(self, config: ServeConfig, metrics: ServingMetrics, updater_factory: UpdaterFactory | None = None,
                 threads: int | None = None) -> None:
        with warnings.catch_warnings():  # max_batch_size=1 is fine here: predict takes a lone request too
            warnings.filterwarnings("ignore", message="The LitServer has both batch and unbatch")
            super().__init__(max_batch_size=config.max_batch_size, batch_timeout=config.batch_timeout_ms / 1000,
                             api_path=PREDICT_PATH, loop=ScoringLoop())
        self.config = config
        self.metrics = metrics
        self.updater_factory = updater_factory
        self.threads = threads
        self._model: ServedModel | None = None
        self._slot: WorkerMetrics | None = None
        self._follower: UpdateFollower | None = None

    # ------------------------------------------------------------------ worker start-up
    def setup(self, device: str) -> None:
        """Load the artifact on ``device`` (LitServe's ``"cpu"`` / ``"cuda:N"``), warm it up, catch up on deltas."""
        worker = int(os.environ.get("LITSERVE_WORKER_ID", "0"))  # LitServe sets it before setup
        self._slot = slot = self.metrics.worker(worker)
        slot.set_state(WorkerState.STARTING)
        if self.threads is not None and not str(device).startswith("cuda"):
            torch.set_num_threads(self.threads)
        artifact = str(self.config.artifact)
        predictor = load(artifact, missing_features=self.config.missing_features, device=device)
        self._model = model = ServedModel(predictor, version=0, published_at=os.path.getmtime(artifact))
        slot.set_model(model.version, model.published_at)
        for size in _WARMUP_SIZES:  # id 0 once per feature, dense zeros: valid for any artifact
            ids = size * len(predictor.feature_names)  # (exported programs take at least one id)
            model.score(torch.zeros(size, predictor.dense_in_features), torch.zeros(ids, dtype=torch.int64),
                        torch.ones(ids, dtype=torch.int64), torch.ones(ids) if predictor.is_weighted else None)
        if self.updater_factory is not None:
            self._follower = UpdateFollower(model, self.updater_factory(model), self.config.follow_interval_s, slot)
            applied = self._follower.catch_up()
            log.info("worker %d serves version %d (%d updates applied at start-up)", worker, model.version, applied)
        gc.collect()
        gc.freeze()  # the model and the modules loaded so far: never scanned again by a collection mid-request
        slot.set_state(WorkerState.SERVING)
        if self._follower is not None:  # only now: a failed apply's "damaged" must not be overwritten by "serving"
            self._follower.start()

    def close(self) -> None:
        """Stop following updates (a worker process simply ends; for an API used in-process)."""
        if self._follower is not None:
            self._follower.stop(timeout_s=5)

    @property
    def model(self) -> ServedModel:
        if self._model is None:
            raise RuntimeError("RecServingAPI.setup has not run in this process")
        return self._model

    # ------------------------------------------------------------------ the request path
    def decode_request(self, request: Annotated[Any, Body()]) -> SampleColumns | Rejected:
        """One request body -> its samples as columns, or the error to answer it with."""
        try:
            return decode_body(self.model.predictor, request, self.config.max_samples_per_request)
        except Exception:  # a bug in validation must fail this request alone, not its whole batch
            log.exception("decoding a request failed")
            return Rejected(500, "the server failed to decode this request (its log has the traceback)")

    def batch(self, inputs: list[SampleColumns | Rejected]) -> ScoringBatch:
        predictor = self.model.predictor
        return assemble(inputs, predictor.dense_in_features, predictor.is_weighted)

    def predict(self, x: ScoringBatch | SampleColumns | Rejected) -> ScoredRequest | Rejected | list[ScoredRequest | Rejected]:
        """Score the valid requests of a batch in one forward (a lone request when ``max_batch_size`` is 1:
        LitServe then calls ``predict`` without ``batch``)."""
        single = not isinstance(x, ScoringBatch)
        batch = self.batch([x]) if not isinstance(x, ScoringBatch) else x
        scores, version = None, self.model.version
        if batch.dense is not None and batch.values is not None and batch.lengths is not None:
            start = time.perf_counter()
            try:
                scores, version = self.model.score(batch.dense, batch.values, batch.lengths, batch.weights)
            except ModelDamaged as exc:  # a failed update left the model half-written: no score from it
                outputs = self._unavailable(batch, str(exc))
                return outputs[0] if single else outputs
            if self._slot is not None:
                self._slot.record_batch(len(batch.sizes), batch.samples, time.perf_counter() - start)
        outputs = split(batch, scores, version)
        return outputs[0] if single else outputs

    def _unavailable(self, batch: ScoringBatch, reason: str) -> list[ScoredRequest | Rejected]:
        """503 for every valid request of ``batch`` (the others keep their own 4xx); the worker reports damage."""
        if self._slot is not None:
            self._slot.set_damaged()  # the follower has already, when it applied the update; say it in any case
        busy = Rejected(503, reason)
        return [r if isinstance(r, Rejected) else busy for r in batch.requests]

    def unbatch(self, output: list[ScoredRequest | Rejected]) -> list[ScoredRequest | Rejected]:
        return output

    def encode_response(self, output: ScoredRequest | Rejected) -> EncodedResponse:
        """``200 {"scores": [...], "version": v}``, or the request's error with its status, as JSON bytes
        (the HTTP server writes them as they are: :class:`~lightrec.serving.transport.PredictDispatch`)."""
        # allow_nan=False: NaN is not JSON (strict parsers refuse the whole body). Scores are finite
        # (``split`` turns a NaN into a 500) and error bodies show non-finite values as strings.
        if isinstance(output, Rejected):
            return EncodedResponse(output.status, json.dumps(output.body(), allow_nan=False).encode())
        return EncodedResponse(200, json.dumps({"scores": output.scores, "version": output.version},
                                               allow_nan=False).encode())

    # ------------------------------------------------------------------ LitServe's /health
    def health(self) -> bool:
        """False once a worker's model is damaged (an update failed part way; it answers 503 from then
        on): replace the replica."""
        return all(state != WorkerState.DAMAGED for state, _ in self.metrics.worker_states())
