"""``EmbeddingShardingPlanner``: tables + cluster -> :class:`ShardingPlan` (+ an explained report).

Pipeline (all deterministic: no randomness, ties broken by table and rank order)::

    collect tables -> enumerate options -> proposals (greedy; memory DP when memory binds)
        -> partition (repair by escalating tables that do not pack) -> refine -> best plan

The best plan has the least estimated cost on its busiest rank (then the least total cost). It
runs first with the in-memory kernels only; when no plan fits, again with the tiered kernels
offered too (``key_value``: every row on SSD; ``fused_uvm_caching`` on GPUs: every row in host
memory; a cache of hot rows in fast memory at one of several load factors, priced by the expected
misses, ``shard_estimators.py``), so tables are tiered only when memory demands it, and those whose
misses cost least. torchrec's ``to_sharding_plan``, ``extract_plan``: ``option_plans.py``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch.distributed as dist
from torch import nn

from lightrec.distributed.comm.sharding_env import resolve_group
from lightrec.distributed.planner.constants import DEFAULT_BATCH_SIZE
from lightrec.distributed.planner.enumerators import EmbeddingEnumerator, enumerate_options
from lightrec.distributed.planner.errors import gib, no_packing_error, too_big_error
from lightrec.distributed.planner.option_plans import extract_plan, to_sharding_plan
from lightrec.distributed.planner.options import Options, option_index, shard_offsets, write_back_estimates
from lightrec.distributed.planner.partitioners import Placement, partition, refine
from lightrec.distributed.planner.plan import (
    CacheParams,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
    placement_for,
)
from lightrec.distributed.planner.plan.sharder import default_sharders
from lightrec.distributed.planner.proposers import (
    GreedyProposer,
    escalate,
    greedy_proposal,
    memory_dp_proposal,
)
from lightrec.distributed.planner.report import PlannerReport, TableReport
from lightrec.distributed.planner.search import NoopPerfModel, protocol_search, vectorised_partitioner
from lightrec.distributed.planner.shard_estimators import (
    DP,
    KERNELS,
    KEY_VALUE,
    SHARDING_TYPES,
    TIERED,
    EmbeddingPerfEstimator,
    EmbeddingStorageEstimator,
    TableArrays,
    estimate_shards,
)
from lightrec.distributed.planner.tables import ShardableModule, collect_tables, find_shardable_modules
from lightrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    Partitioner,
    PerfModel,
    PlannerError,
    PlannerErrorType,
    Proposer,
    StorageReservation,
    Topology,
)
from lightrec.kernels.tiered.config import DEFAULT_CACHE_LOAD_FACTOR

__all__ = ["EmbeddingShardingPlanner", "extract_plan", "to_sharding_plan"]

_MAX_REPAIR_ROUNDS = 200


class EmbeddingShardingPlanner:
    """Plans how to shard every embedding table of a model.

    Args (torchrec's, in torchrec's order):
        topology: the cluster; default: the enumerator's, else ``Topology(world_size)`` of the
            process group (or 1).
        batch_size: per-rank batch size used by the cost model (default: the enumerator's, else 512).
        enumerator: an :class:`~lightrec.distributed.planner.enumerators.EmbeddingEnumerator` (its
            topology, batch size and constraints fill in the planner's missing ones; its
            estimators' numbers are planned with), or any ``Enumerator``: the planner then keeps to
            the options it returns.
        storage_reservation: a fraction of each rank's table memory kept free, or a
            ``StorageReservation`` (:mod:`lightrec.distributed.planner.storage_reservations`).
        proposer: a ``Proposer`` or a list. None, or lightrec's ``GreedyProposer`` alone, runs
            lightrec's search (greedy, memory DP, repair, refinement); others run the proposers'
            proposals through the partitioner (:mod:`lightrec.distributed.planner.search`).
        partitioner: None or ``GreedyPerfPartitioner`` (vectorised; ``sort_by`` honoured), or any
            ``Partitioner`` (run on the proposals' ``ShardingOption`` s).
        performance_model: a ``PerfModel`` rating partitioned proposals (None/``NoopPerfModel``:
            the busiest rank's cost).
        stats, debug, callbacks, timeout_seconds: accepted for torchrec's signature; lightrec's
            report is :attr:`last_report` (they do not change the plan).
        constraints: ``{table name: ParameterConstraints}`` (default: the enumerator's).

    After :meth:`plan`, :attr:`last_report` holds the :class:`PlannerReport` of the returned plan.
    """

    def __init__(
        self,
        topology: Topology | None = None,
        batch_size: int | None = None,
        enumerator: Enumerator | None = None,
        storage_reservation: float | StorageReservation = 0.0,
        proposer: Proposer | list[Proposer] | None = None,
        partitioner: Partitioner | None = None,
        performance_model: PerfModel | None = None,
        stats: object = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        debug: bool = True,
        callbacks: object = None,
        timeout_seconds: int | None = None,
    ) -> None:
        if topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(storage_reservation, StorageReservation) and not 0.0 <= storage_reservation < 1.0:
            raise ValueError(
                f"storage_reservation must be a fraction in [0, 1) or a StorageReservation, got {storage_reservation!r}"
            )
        for name, part, kind in (("enumerator", enumerator, Enumerator), ("partitioner", partitioner, Partitioner),
                                 ("performance_model", performance_model, PerfModel)):  # fmt: skip
            if part is not None and not isinstance(part, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {type(part).__name__}")
        proposers = proposer if isinstance(proposer, list) else ([proposer] if proposer is not None else [])
        bad = [type(p).__name__ for p in proposers if not isinstance(p, Proposer)]
        if bad:
            raise TypeError(f"proposer must be Proposer(s), got {bad}")
        self._enumerator = enumerator
        self._topology = topology or getattr(enumerator, "topology", None)
        self._batch_size = batch_size or getattr(enumerator, "batch_size", None) or DEFAULT_BATCH_SIZE
        self._constraints = dict(constraints or getattr(enumerator, "constraints", None) or {})
        self._reservation = storage_reservation
        self._proposers = proposers
        self._partitioner = partitioner
        self._perf_model = performance_model
        self.last_report: PlannerReport | None = None

    def _uses_lightrec_search(self) -> bool:
        """None of the given parts needs the ShardingOption protocol (module docstring of search.py)."""
        lightrec_greedy = all(type(p) is GreedyProposer for p in self._proposers) and len(self._proposers) <= 1
        default_rating = self._perf_model is None or type(self._perf_model) is NoopPerfModel
        return lightrec_greedy and default_rating and vectorised_partitioner(self._partitioner) is not None

    def _custom_enumerator(self) -> bool:
        e = self._enumerator
        if e is None:
            return False
        if type(e).enumerate is not EmbeddingEnumerator.enumerate:
            return True
        defaults = (EmbeddingPerfEstimator, EmbeddingStorageEstimator)
        return any(type(est) not in defaults for est in getattr(e, "estimators", []))

    def _default_topology(self, pg: dist.ProcessGroup | None = None) -> Topology:
        """The planner's topology; without one, that of the process group (the default group for
        :meth:`plan` and :meth:`evaluate`): its size, on ``cuda`` when it runs NCCL, else on ``cpu``
        (one rank, device auto-detected, outside a process group). One rule for every entry point, so
        ``plan`` and ``collective_plan`` plan the same cluster: ``plan`` on a GPU host whose group runs
        gloo used to plan for ``cuda`` while ``collective_plan`` planned for ``cpu``."""
        if self._topology is not None:
            return self._topology
        if not dist.is_initialized():
            return Topology(world_size=1)
        group = resolve_group(pg)
        nccl = "nccl" in str(dist.get_backend(group))
        return Topology(world_size=dist.get_world_size(group), compute_device="cuda" if nccl else "cpu")

    # ---- public API --------------------------------------------------------------------------
    def plan(self, module: nn.Module, sharders: Sequence[ModuleSharder]) -> ShardingPlan:
        """Plan every shardable module of ``module`` (raises :class:`PlannerError` if none fits)."""
        return self._plan(module, list(sharders), self._default_topology())

    def collective_plan(
        self, module: nn.Module, sharders: Sequence[ModuleSharder] | None = None, pg: dist.ProcessGroup | None = None
    ) -> ShardingPlan:
        """Plan on rank 0 of ``pg`` and broadcast, so every rank uses the identical plan. ``sharders``
        default to ``get_default_sharders()``; a planning error on rank 0 is raised on every rank."""
        sharders = default_sharders() if sharders is None else list(sharders)
        if not dist.is_initialized():
            return self.plan(module, sharders)
        pg = resolve_group(pg)
        world = dist.get_world_size(pg)
        topo = self._default_topology(pg)
        if topo.world_size != world:
            raise ValueError(
                f"Topology(world_size={topo.world_size}) does not match the process group's {world} ranks"
            )
        # Rank 0 sends (plan JSON, report) or (the planning error, None).
        payload: list[tuple[str | Exception, PlannerReport | None] | None] = [None]
        if dist.get_rank(pg) == 0:
            try:
                plan = self._plan(module, sharders, topo)
                payload = [(plan.to_json(indent=None), self.last_report)]
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                payload = [(exc, None)]
        dist.broadcast_object_list(payload, src=dist.get_global_rank(pg, 0), group=pg)
        received = payload[0]
        assert received is not None  # broadcast_object_list filled it from rank 0
        body, report = received
        if isinstance(body, Exception):
            raise body
        self.last_report = report
        return ShardingPlan.from_json(body)

    def evaluate(self, module: nn.Module, sharders: Sequence[ModuleSharder], plan: ShardingPlan) -> PlannerReport:
        """Estimate any plan (e.g. one written by hand) with the planner's cost model.

        Tables the plan does not mention are ignored. The report's memory may exceed the caps:
        compare ``report.hbm_bytes``/``ddr_bytes`` with the caps to check a hand-written plan.
        """
        topo = self._default_topology()
        modules = find_shardable_modules(module, list(sharders))
        tables = collect_tables(modules, topo, self._constraints, self._batch_size)
        W = topo.world_size
        idx, st, kern, rows, cols, ranks, clfs = [], [], [], [], [], [], []
        reports = []
        for t, (path, name) in enumerate(tables.keys):
            mp = plan.get_plan_for_module(path)
            ps = None if mp is None else mp.get(name)
            if ps is None:
                continue
            if ps.sharding_type not in SHARDING_TYPES or ps.compute_kernel not in KERNELS:
                raise ValueError(
                    f"plan for table {name!r} uses sharding_type={ps.sharding_type!r}, compute_kernel="
                    f"{ps.compute_kernel!r}, which the planner's cost model cannot estimate (it estimates "
                    f"sharding types {SHARDING_TYPES} and kernels {KERNELS}); evaluate a plan without this table"
                )
            code, k = SHARDING_TYPES.index(ps.sharding_type), KERNELS.index(ps.compute_kernel)
            if code == DP:
                shards = [(int(tables.rows[t]), int(tables.cols[t]), -1)]
            else:
                if not ps.sharding_spec:
                    raise ValueError(f"plan for table {name!r} ({ps.sharding_type}) has no sharding_spec")
                shards = [(s.shard_sizes[0], s.shard_sizes[1], s.rank) for s in ps.sharding_spec]
            clf = _plan_clf(ps, tables, t)
            for r, c, rank in shards:
                if rank >= W:
                    raise ValueError(
                        f"plan puts a shard of table {name!r} on rank {rank}; the topology has {W} ranks"
                    )
                idx.append(t)
                st.append(code)
                kern.append(k)
                rows.append(r)
                cols.append(c)
                ranks.append(rank)
                clfs.append(clf)
            reports.append((t, ps, len(shards)))
        arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        est = estimate_shards(
            tables, topo, arr(idx), arr(st), arr(kern), arr(rows), arr(cols), np.asarray(clfs, dtype=np.float64)
        )
        rank_arr, load, mem, back = arr(ranks), np.zeros(W), np.zeros(W), np.zeros((W, 2))
        rep = rank_arr < 0  # data-parallel replicas: on every rank
        load += est.cost[rep].sum()
        mem += est.storage[rep].sum()
        np.add.at(load, rank_arr[~rep], est.cost[~rep])
        np.add.at(mem, rank_arr[~rep], est.storage[~rep])
        np.add.at(back, rank_arr[~rep], est.backing[~rep])
        rows_out, pos = [], 0
        for t, ps, n in reports:
            mult = W if ps.sharding_type == "data_parallel" else 1
            sl = slice(pos, pos + n)
            rows_out.append(
                _table_report(tables.keys[t], ps.sharding_type, ps.compute_kernel, list(ps.ranks or range(W)),
                              est.cost[sl] * mult, est.storage[sl] * mult, est.backing[sl], est.hit_rate[sl],
                              clfs[pos])  # fmt: skip
            )
            pos += n
        return _report(topo, mem, back, load, rows_out, 0.0, "evaluated")

    # ---- pipeline ----------------------------------------------------------------------------
    def _plan(self, module: nn.Module, sharders: list[ModuleSharder], topo: Topology) -> ShardingPlan:
        t0 = time.perf_counter()
        topo = self._reserve(topo, module, sharders)
        modules = find_shardable_modules(module, sharders)
        try:
            return self._plan_tables(module, sharders, modules, topo, t0, tiered=False)
        except PlannerError as in_memory:
            tables = collect_tables(modules, topo, self._constraints, self._batch_size, tiered=True)
            if not any(k in TIERED for opts in tables.allowed for _, kernels in opts for k in kernels):
                raise  # nothing more to try: the sharders or constraints offer no tiered kernel
            try:
                return self._plan_tables(module, sharders, modules, topo, t0, tiered=True)
            except PlannerError as tiered:
                raise tiered from in_memory

    def _plan_tables(
        self, module: nn.Module, sharders: list[ModuleSharder], modules: list[ShardableModule], topo: Topology,
        t0: float, tiered: bool,
    ) -> ShardingPlan:  # fmt: skip
        """One planning pass, with (``tiered``) or without the tiered kernels on offer."""
        tables = collect_tables(modules, topo, self._constraints, self._batch_size, tiered=tiered)
        if len(tables) == 0:
            self.last_report = None
            return ShardingPlan({m.path: EmbeddingModuleShardingPlan() for m in modules})
        opts = enumerate_options(tables, topo)
        if self._custom_enumerator():
            assert self._enumerator is not None  # _custom_enumerator checked it
            enumerated = self._enumerator.enumerate(module, sharders)
            keep = np.zeros(len(opts.fits), dtype=bool)
            keep[[option_index(so, tables, opts) for so in enumerated]] = True
            opts.fits &= keep
            write_back_estimates(enumerated, tables, opts, topo)
        no_fit = [
            t
            for t in range(len(tables))
            if not opts.fits[opts.first[t] : opts.first[t] + opts.count[t]].any()
        ]
        if no_fit:
            raise too_big_error(tables, opts, topo, no_fit)
        if self._uses_lightrec_search():
            name, pl = self._lightrec_search(opts, tables, topo)
        else:
            found = protocol_search(opts, tables, modules, topo, self._batch_size, self._proposers or [GreedyProposer()],
                                    self._partitioner, self._perf_model)  # fmt: skip
            if found is None:
                raise PlannerError(
                    f"none of the proposals of {[type(p).__name__ for p in self._proposers]} could be partitioned "
                    f"onto {topo.world_size} rank(s) with {gib(float(topo.storage_caps.max()))} of "
                    f"{topo.storage_kind} each; add GreedyProposer() to the proposers or give the ranks more memory",
                    [k[1] for k in tables.keys], float(opts.total_storage.sum()), float(topo.storage_caps.max()),
                    PlannerErrorType.PARTITION,
                )  # fmt: skip
            name, pl = found
        plan = _build_plan(modules, tables, opts, pl, topo, self._constraints)
        self.last_report = _build_report(tables, opts, pl, topo, name, time.perf_counter() - t0)
        return plan

    def _reserve(self, topo: Topology, module: nn.Module, sharders: list[ModuleSharder]) -> Topology:
        if isinstance(self._reservation, StorageReservation):
            return self._reservation.reserve(topo, self._batch_size, module, sharders, self._constraints)
        if not self._reservation:
            return topo
        keep = 1.0 - self._reservation
        return dataclasses.replace(topo, hbm_cap=(topo.hbm_caps * keep).tolist(), ddr_cap=(topo.ddr_caps * keep).tolist())

    def _lightrec_search(self, opts: Options, tables: TableArrays, topo: Topology) -> tuple[str, Placement]:
        """Greedy and memory-DP proposals, each packed with repair and refined; the best one."""
        sort_by = vectorised_partitioner(self._partitioner) or "perf"
        proposals = [("greedy", greedy_proposal(opts))]
        total = float(topo.storage_caps.sum())
        if opts.total_storage[proposals[0][1]].sum() > total:
            for fill in (1.0, 0.9):
                choice = memory_dp_proposal(opts, total * fill)
                if choice is not None and not any((choice == c).all() for _, c in proposals):
                    proposals.append(("memory_dp", choice))
        best: tuple[float, float, int] | None = None
        result: tuple[str, Placement] | None = None
        failed: Placement | None = None
        for i, (name, choice) in enumerate(proposals):
            pl = _place_with_repair(opts, choice.copy(), topo, sort_by)
            if not pl.ok:
                failed = failed or pl
                continue
            pl = refine(opts, pl, topo)
            key = (float(pl.load.max()), float(opts.total_cost[pl.choice].sum()), i)
            if best is None or key < best:
                best, result = key, (name, pl)
        if result is None:
            assert failed is not None  # every proposal (there is at least the greedy one) failed to pack
            raise no_packing_error(tables, opts, topo, failed)
        return result


def _place_with_repair(opts: Options, choice: np.ndarray, topo: Topology, sort_by: str = "perf") -> Placement:
    """Partition; while tables do not pack, move them (or the biggest others) to smaller options."""
    pl = partition(opts, choice, topo, sort_by)
    for _ in range(_MAX_REPAIR_ROUNDS):
        if pl.ok:
            return pl
        changed = False
        for t in pl.unplaced:
            o = escalate(opts, t, int(choice[t]))
            if o is not None:
                choice[t], changed = o, True
        if not changed:  # the stuck tables cannot shrink: shrink the largest others instead
            order = np.lexsort((np.arange(len(choice)), -opts.footprint[choice]))
            budget = max(1, len(pl.unplaced))
            for t in order.tolist():
                o = escalate(opts, t, int(choice[t]))
                if o is not None:
                    choice[t], changed = o, True
                    budget -= 1
                    if budget == 0:
                        break
        if not changed:
            return pl
        pl = partition(opts, choice, topo, sort_by)
    return pl


def _shard_specs(opts: Options, o: int, ranks: np.ndarray, topo: Topology) -> list[ShardMetadata]:
    s, n = int(opts.start[o]), int(opts.nshards[o])
    rows, cols = opts.sh_rows[s : s + n], opts.sh_cols[s : s + n]
    row_off, col_off = shard_offsets(opts, o)
    device, local = str(topo.compute_device), topo.local_size
    return [
        ShardMetadata(
            [int(row_off[i]), int(col_off[i])],
            [int(rows[i]), int(cols[i])],
            placement_for(int(r), device, local),
        )
        for i, r in enumerate(ranks.tolist())
    ]


def _build_plan(
    modules: list[ShardableModule],
    tables: TableArrays,
    opts: Options,
    pl: Placement,
    topo: Topology,
    constraints: dict[str, ParameterConstraints],
) -> ShardingPlan:
    index = {key: i for i, key in enumerate(tables.keys)}
    plan = ShardingPlan()
    for m in modules:
        mp = EmbeddingModuleShardingPlan()
        for name in m.configs:
            t = index[(m.path, name)]
            o = int(pl.choice[t])
            st, kernel = int(opts.stype[o]), int(opts.kernel[o])
            c = constraints.get(name)
            cache = kv = None
            if kernel in TIERED:  # the chosen cache size goes into the plan, with the constraint's settings
                given = c.cache_params if c is not None and c.cache_params is not None else CacheParams()
                cache = dataclasses.replace(given, load_factor=float(opts.clf[o]), stats=None)
                kv = c.key_value_params if c is not None and kernel == KEY_VALUE else None
            mp[name] = ParameterSharding(
                sharding_type=SHARDING_TYPES[st],
                compute_kernel=KERNELS[kernel],
                ranks=[int(r) for r in pl.ranks[t].tolist()],
                sharding_spec=None if st == DP else _shard_specs(opts, o, pl.ranks[t], topo),
                cache_params=cache,
                key_value_params=kv,
            )
        # A sharder may lay its shards out further (managed-collision tables: row blocks on whole buckets).
        plan.plan[m.path] = m.sharder.finalize_module_plan(m.module, mp, topo.world_size)
    return plan


def _plan_clf(ps: ParameterSharding, tables: TableArrays, t: int) -> float:
    """The cache load factor a plan's tiered table runs with (the plan's, else the sharder's, else 0.2)."""
    if ps.cache_params is not None and ps.cache_params.load_factor is not None:
        return float(ps.cache_params.load_factor)
    choices = tables.clf_choices[t] if tables.clf_choices else []
    return choices[0] if len(choices) == 1 else DEFAULT_CACHE_LOAD_FACTOR


def _table_report(
    key: tuple[str, str],
    sharding_type: str,
    kernel: str,
    ranks: list[int],
    cost: np.ndarray,
    storage: np.ndarray,
    backing: np.ndarray,
    hit: np.ndarray,
    clf: float,
) -> TableReport:
    """One table's row of the report from its shards' estimates (replicas already multiplied in)."""
    tiered = bool(np.isfinite(hit).any())
    return TableReport(
        key[0], key[1], sharding_type, kernel, ranks, float(cost.sum()), float(storage.sum()),
        cache_load_factor=clf if tiered else None,
        expected_hit_rate=float(np.nanmean(hit)) if tiered else None,
        host_bytes=float(backing[:, 0].sum()),
        ssd_bytes=float(backing[:, 1].sum()),
    )  # fmt: skip


def _report(
    topo: Topology, fast: np.ndarray, backing: np.ndarray, load: np.ndarray, rows: list[TableReport],
    seconds: float, proposer: str,
) -> PlannerReport:  # fmt: skip
    """The report of per-rank fast memory, backing tiers and cost: HBM, DDR (fast on CPU, the host
    backing tier behind a GPU) and SSD."""
    on_hbm = topo.compute_device == "cuda"
    return PlannerReport(
        compute_device=str(topo.compute_device),
        hbm_bytes=fast.copy() if on_hbm else np.zeros(topo.world_size),
        ddr_bytes=backing[:, 0].copy() if on_hbm else fast.copy(),
        hbm_caps=topo.hbm_caps.copy(),
        ddr_caps=topo.ddr_caps.copy(),
        cost_s=load.copy(),
        tables=rows,
        planning_s=seconds,
        proposer=proposer,
        ssd_bytes=backing[:, 1].copy(),
        ssd_caps=topo.ssd_caps.copy(),
    )


def _build_report(
    tables: TableArrays, opts: Options, pl: Placement, topo: Topology, proposer: str, seconds: float
) -> PlannerReport:
    rows = []
    for t, key in enumerate(tables.keys):
        o = int(pl.choice[t])
        sl = slice(int(opts.start[o]), int(opts.start[o]) + int(opts.nshards[o]))
        mult = topo.world_size if int(opts.stype[o]) == DP else 1
        rows.append(
            _table_report(key, SHARDING_TYPES[int(opts.stype[o])], KERNELS[int(opts.kernel[o])],
                          [int(r) for r in pl.ranks[t].tolist()], opts.sh_cost[sl] * mult, opts.sh_storage[sl] * mult,
                          opts.sh_backing[sl], opts.sh_hit[sl], float(opts.clf[o]))  # fmt: skip
        )
    backing = pl.backing if len(pl.backing) else np.zeros((topo.world_size, 2))
    return _report(topo, pl.storage, backing, pl.load, rows, seconds, proposer)
