"""Optimizers whose state is addressed by parameter *name*.

A model-parallel model has no single place where every parameter lives: embedding rows sit in
kernel-owned storage and are updated inside backward, dense layers are replicated. Checkpoints
therefore key optimizer state by the fully qualified parameter name (``embedding_bags.t1.weight``),
not by a position in a parameter list, so a checkpoint can be read back into a differently
built (or differently sharded) model.

``state_dict()`` layout (all three classes)::

    {"state":        {"<param name>": {"<state name>": Tensor | number, ...}, ...},
     "param_groups": [{"params": ["<param name>", ...], "lr": ..., ...}, ...]}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias, cast, overload

import torch

__all__ = ["CombinedOptimizer", "KeyedOptimizer", "KeyedOptimizerWrapper", "OptimizerWrapper"]

# A torch optimizer state dict ({"state": ..., "param_groups": [...]}) and one (own group, saved group) pair
# of it, as ``check_state_dict`` returns them: their values are whatever the optimizer keeps.
_StateDict: TypeAlias = Mapping[str, Any]
_ParamGroup: TypeAlias = dict[str, Any]  # torch's param group: "params" and the hyper-parameters
_GroupPair: TypeAlias = tuple[_ParamGroup, _StateDict]
# KeyedOptimizerWrapper's optimizer factories: given the parameters as a list, or (pass_params_dict=True)
# as the {name: parameter} mapping.
_ListFactory: TypeAlias = Callable[[list[torch.Tensor]], torch.optim.Optimizer]
_DictFactory: TypeAlias = Callable[[Mapping[str, torch.Tensor]], torch.optim.Optimizer]


class KeyedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` over named parameters, checkpointed by name.

    The base class does not update anything by itself (``step`` is a no-op); subclasses such as
    :class:`KeyedOptimizerWrapper` or a fused embedding optimizer provide the update.

    Args:
        params: ``{name: parameter}``.
        state: ``{parameter: {state name: value}}`` (tensors are checkpointed by reference and
            restored in place).
        param_groups: groups in torch's format (``{"params": [tensors], "lr": ...}``); every
            parameter of ``params`` must belong to exactly one group.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        state: Mapping[Any, Any],
        param_groups: Collection[Mapping[str, Any]],
    ) -> None:
        torch._C._log_api_usage_once("lightrec.optim.KeyedOptimizer")
        # torch.optim.Optimizer.__init__ would rebuild the groups; we adopt the given objects so a
        # wrapper and its inner optimizer share them (an LR scheduler on one drives the other).
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()
        self.params: dict[str, torch.Tensor] = dict(params)
        self.state = state  # type: ignore[assignment]
        self.param_groups = param_groups  # type: ignore[assignment]
        self._warned_capturable_if_run_uncaptured = True
        self._save_param_groups = True
        self._check_groups()

    def __call__(self) -> KeyedOptimizer:
        """Itself: torchrec calls ``module.fused_optimizer()`` where lightrec has a property that
        returns this optimizer, so both spellings work."""
        return self

    def save_param_groups(self, save: bool) -> None:
        """Whether ``state_dict`` carries ``param_groups`` (hyper-parameters) besides the state.

        torchrec's switch. lightrec saves them by default (torchrec does not); a state dict
        without groups loads the state and keeps the current hyper-parameters.
        """
        if not isinstance(save, bool):
            raise TypeError(f"save_param_groups(save=...) takes a bool, got {save!r}")
        self._save_param_groups = save

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults/state/param_groups; keep the names (and any
        # subclass attributes) so deep copies and pickles stay keyed optimizers. An instance ``step``
        # is the wrapper an LR scheduler installs, bound to *this* optimizer by a weak reference: a
        # copy carrying it would step the original (and a pickle fails); the copy uses its class's
        # step, as a copied torch optimizer does.
        state = dict(self.__dict__)
        state.pop("step", None)
        return state

    def _check_groups(self) -> None:
        ids = {id(p) for p in self.params.values()}
        grouped: set[int] = set()
        for i, group in enumerate(self.param_groups):
            for p in group["params"]:
                if id(p) not in ids:
                    raise ValueError(
                        f"param_groups[{i}] holds a parameter that is not among the named params"
                    )
                if id(p) in grouped:
                    raise ValueError(f"a parameter appears in more than one param group (group {i})")
                grouped.add(id(p))
        missing = [name for name, p in self.params.items() if id(p) not in grouped]
        if missing:
            raise ValueError(f"parameters {missing} belong to no param group")

    def _names_by_id(self) -> dict[int, str]:
        return {id(p): name for name, p in self.params.items()}

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """No update here (fused subclasses update in backward); runs ``closure`` if given."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params.values():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def init_state(self, sparse_grad_parameter_names: Collection[str] | None = None) -> None:
        """Materialise lazily created state so a fresh optimizer checkpoints every key.

        Runs one ``step`` with all-zero gradients (gradients already present are set aside and
        put back afterwards) and learning rate 0 (weights do not move), then
        puts every ``step`` counter back, in place, to its value before (0 where that step created
        it), so the next real step behaves as on a fresh optimizer and a fused embedding
        optimizer's counter stays the kernel's own.

        Args:
            sparse_grad_parameter_names: parameters whose zero gradient is a sparse tensor (as
                torchrec: for optimizers that take sparse gradients, e.g. of ``sparse=True`` embeddings).
        """
        sparse_names = set(sparse_grad_parameter_names or ())
        unknown = sorted(sparse_names - set(self.params))
        if unknown:
            raise KeyError(f"init_state(sparse_grad_parameter_names=...) names unknown parameters {unknown}")
        saved_lrs = [group.get("lr") for group in self.param_groups]
        saved_grads = {name: p.grad for name, p in self.params.items()}
        saved_steps: dict[int, Any] = {}
        for p in self.params.values():
            step = self.state.get(p, {}).get("step")
            if step is not None:
                saved_steps[id(p)] = step.clone() if isinstance(step, torch.Tensor) else step
        for group in self.param_groups:
            if "lr" in group:
                group["lr"] = 0.0
        # every gradient is zero during this step, also one the caller already computed: a real
        # gradient would enter the moments (Adam) or momentum buffers (SGD) here, and again at the
        # next real step, whose counter starts over
        for name, p in self.params.items():
            if p.requires_grad:
                p.grad = torch.zeros_like(p).to_sparse() if name in sparse_names else torch.zeros_like(p)
        try:
            self.step()
        finally:
            for group, lr in zip(self.param_groups, saved_lrs, strict=True):
                if lr is not None:
                    group["lr"] = lr
            for name, p in self.params.items():
                p.grad = saved_grads[name]
        # Counters go back to what they were (0 where the step created them), in place: a fused
        # embedding optimizer's "step" is the kernel's own counter (Adam's t), which its no-op step
        # did not advance; a new tensor in the state would detach it, so a checkpoint loaded
        # afterwards would never reach the kernel (resumed Adam restarting its bias correction).
        for p in self.params.values():
            st = self.state.get(p, {})
            if "step" not in st:
                continue
            before = saved_steps.get(id(p))
            if isinstance(st["step"], torch.Tensor):
                if before is None:
                    st["step"].zero_()
                else:
                    st["step"].copy_(before)
            else:
                st["step"] = 0 if before is None else before

    def state_dict(self) -> dict[str, Any]:
        names = self._names_by_id()
        state = {names[id(p)]: dict(s) for p, s in self.state.items() if id(p) in names}
        groups = []
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [names[id(p)] for p in group["params"]]
            groups.append(g)
        return {"state": state, "param_groups": groups if self._save_param_groups else []}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore state and hyper-parameters by name; tensors are copied in place.

        Everything is checked before anything changes: raises ``KeyError`` naming any parameter,
        state entry or param group the checkpoint lacks, or any parameter it names that this
        optimizer does not have, and ``ValueError`` naming any state tensor
        whose shape differs from this optimizer's (e.g. per-row vs per-element Adagrad state).
        """
        own_groups = self.check_state_dict(state_dict)
        saved_state = state_dict["state"]
        with torch.no_grad():
            for name, p in self.params.items():
                if name not in saved_state:
                    continue
                own = self.state.setdefault(p, {}) if isinstance(self.state, dict) else self.state[p]
                for key, value in saved_state[name].items():
                    current = own.get(key)
                    if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
                        current.copy_(value)
                    elif isinstance(value, torch.Tensor):
                        own[key] = value.detach().clone().to(p.device if key != "step" else value.device)
                    else:
                        own[key] = value
        for group, saved in own_groups:
            for k, v in saved.items():
                if k != "params":
                    group[k] = v

    def check_state_dict(self, state_dict: _StateDict) -> list[_GroupPair]:
        """Raise what ``load_state_dict(state_dict)`` would raise, changing nothing.

        Returns ``(own group, saved group)`` pairs (empty when the state dict has no groups).
        """
        if (
            not isinstance(state_dict, Mapping)
            or "state" not in state_dict
            or "param_groups" not in state_dict
        ):
            raise KeyError("optimizer state_dict must have 'state' and 'param_groups' entries")
        saved_state = state_dict["state"]
        _check_no_unknown_names(state_dict, set(self.params), self._extra_state_names())
        for name, p in self.params.items():
            own = self.state.get(p, {})
            if own and name not in saved_state:
                raise KeyError(f"optimizer state_dict has no state for parameter {name!r}")
            for key in own:
                if key not in saved_state[name]:
                    raise KeyError(f"optimizer state_dict entry {name!r} lacks state {key!r}")
            for key, value in saved_state.get(name, {}).items():
                current = own.get(key)
                if (
                    isinstance(current, torch.Tensor)
                    and isinstance(value, torch.Tensor)
                    and current.shape != value.shape
                ):
                    raise ValueError(
                        f"optimizer state {name}.{key}: shape {tuple(value.shape)} in the checkpoint, "
                        f"{tuple(current.shape)} here (saved with another optimizer type?); nothing was loaded; "
                        "load a state dict of the same optimizer"
                    )
        saved_groups = {tuple(sorted(g["params"])): g for g in state_dict["param_groups"]}
        names = self._names_by_id()
        own_groups = []
        for group in self.param_groups if saved_groups else []:  # no groups saved: keep ours
            key = tuple(sorted(names[id(p)] for p in group["params"]))
            if key not in saved_groups:
                raise KeyError(f"optimizer state_dict has no param group with params {list(key)}")
            own_groups.append((group, saved_groups[key]))
        return own_groups

    def add_param_group(self, param_group: _ParamGroup) -> None:
        raise TypeError(f"{type(self).__name__} has a fixed set of named parameters; build a new one instead")

    def _extra_state_names(self) -> set[str]:
        """Names in ``state_dict()["state"]`` that are not parameters (a warm-up schedule's
        position), so a :class:`CombinedOptimizer` hands them back to this optimizer on load."""
        return set()


class KeyedOptimizerWrapper(KeyedOptimizer):
    """Give any torch optimizer name-keyed checkpoints.

    Args:
        params: ``{name: parameter}``.
        optim_factory: ``fn(list_of_params) -> torch.optim.Optimizer``, e.g.
            ``lambda ps: torch.optim.Adam(ps, lr=1e-3)``.
        pass_params_dict: hand ``optim_factory`` the ``params`` mapping itself instead of the list
            of its values (torchrec's switch), for factories that group parameters by name.
    """

    @overload
    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        optim_factory: _ListFactory,
        pass_params_dict: Literal[False] = False,
    ) -> None: ...

    @overload
    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        optim_factory: _DictFactory,
        pass_params_dict: Literal[True],
    ) -> None: ...

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        optim_factory: _ListFactory | _DictFactory,
        pass_params_dict: bool = False,
    ) -> None:
        if not params:
            raise ValueError("KeyedOptimizerWrapper got no parameters")
        if not isinstance(pass_params_dict, bool):
            raise TypeError(f"KeyedOptimizerWrapper(pass_params_dict=...) takes a bool, got {pass_params_dict!r}")
        if pass_params_dict:
            self._optimizer = cast(_DictFactory, optim_factory)(params)
        else:
            self._optimizer = cast(_ListFactory, optim_factory)(list(params.values()))
        super().__init__(params, self._optimizer.state, self._optimizer.param_groups)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"KeyedOptimizerWrapper({self._optimizer!r})"


class OptimizerWrapper(KeyedOptimizer):
    """A keyed optimizer that forwards everything to another one: the base of optimizers that
    add behaviour around ``step`` (warm-up, gradient clipping), as torchrec's ``OptimizerWrapper``.

    Args:
        optimizer: the wrapped ``KeyedOptimizer`` (its parameters, state and groups are shared).
    """

    def __init__(self, optimizer: KeyedOptimizer) -> None:
        if not isinstance(optimizer, KeyedOptimizer):
            raise TypeError(f"OptimizerWrapper wraps a KeyedOptimizer, got {type(optimizer).__name__}")
        self._optimizer = optimizer
        super().__init__(optimizer.params, optimizer.state, optimizer.param_groups)

    @property
    def param_groups(self) -> list[_ParamGroup]:
        """The wrapped optimizer's groups, read on each access (a :class:`CombinedOptimizer`'s
        are built per access, and a wrapped optimizer may replace its list)."""
        return self._optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: Collection[Mapping[str, Any]]) -> None:
        if not _same_groups(groups, self._optimizer.param_groups):  # KeyedOptimizer.__init__ sets its own
            self._optimizer.param_groups = cast("list[_ParamGroup]", groups)  # the caller's list, as is

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def init_state(self, sparse_grad_parameter_names: Collection[str] | None = None) -> None:
        self._optimizer.init_state(sparse_grad_parameter_names)

    def save_param_groups(self, save: bool) -> None:
        super().save_param_groups(save)
        self._optimizer.save_param_groups(save)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def check_state_dict(self, state_dict: _StateDict) -> list[_GroupPair]:
        return self._optimizer.check_state_dict(state_dict)

    def _extra_state_names(self) -> set[str]:
        return self._optimizer._extra_state_names()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._optimizer!r})"


def _check_no_unknown_names(state_dict: _StateDict, params: set[str], extra: set[str]) -> None:
    """Refuse a state dict naming parameters this optimizer does not have (in its state or its
    param groups): that state would be dropped unseen, e.g. a checkpoint of a renamed or other model."""
    unknown = sorted(
        {name for name in state_dict["state"] if name not in params and name not in extra}
        | {name for g in state_dict["param_groups"] for name in g.get("params", ()) if name not in params}
    )
    if unknown:
        raise KeyError(
            f"optimizer state_dict names parameters {unknown} that this optimizer does not have (its parameters: "
            f"{sorted(params)}); nothing was loaded; load a state dict saved from an optimizer over the same "
            "named parameters"
        )


def _same_groups(groups: Collection[Mapping[str, Any]], current: Collection[Mapping[str, Any]]) -> bool:
    """Whether ``groups`` holds the very group dicts of ``current``, in order."""
    given, now = list(groups), list(current)
    return len(given) == len(now) and all(a is b for a, b in zip(given, now, strict=True))


def _prefixed(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class CombinedOptimizer(KeyedOptimizer):
    """Several keyed optimizers driven as one (dense optimizer + fused embedding optimizers).

    ``param_groups`` is the concatenation of the children's group dicts (the same objects), built
    on each access as torchrec's is: an LR scheduler built on the combined optimizer changes every
    child's learning rate, also after a child replaced its groups (e.g. when loading a checkpoint).

    Args:
        optims: keyed optimizers, or ``(prefix, optimizer)`` pairs; a prefix is prepended to the
            child's parameter names as ``"<prefix>.<name>"``.
    """

    def __init__(self, optims: Sequence[KeyedOptimizer | tuple[str, KeyedOptimizer]]) -> None:
        self._optims: list[tuple[str, KeyedOptimizer]] = []
        for item in optims:
            prefix, opt = item if isinstance(item, tuple) else ("", item)
            if not isinstance(opt, KeyedOptimizer):
                raise TypeError(
                    f"CombinedOptimizer takes KeyedOptimizers, got {type(opt).__name__}; wrap a plain torch "
                    "optimizer with KeyedOptimizerWrapper(dict(model.named_parameters()), factory)"
                )
            self._optims.append((prefix, opt))
        params: dict[str, torch.Tensor] = {}
        for prefix, opt in self._optims:
            for name, p in opt.params.items():
                key = _prefixed(prefix, name)
                if key in params:
                    raise ValueError(
                        f"parameter name {key!r} appears in two optimizers given to CombinedOptimizer"
                    )
                params[key] = p
        groups = [g for _, opt in self._optims for g in opt.param_groups]
        super().__init__(params, _CombinedState(self._optims), groups)

    @property
    def param_groups(self) -> list[_ParamGroup]:
        """The children's groups in order (the same dict objects), read from them on each access."""
        return [g for _, opt in self._optims for g in opt.param_groups]

    @param_groups.setter
    def param_groups(self, groups: Collection[Mapping[str, Any]]) -> None:
        # KeyedOptimizer.__init__ hands back the children's own groups; anything else has no child to go to.
        if not _same_groups(groups, self.param_groups):
            raise TypeError(
                "CombinedOptimizer.param_groups is its optimizers' groups, read from them on each access; "
                "change an entry of a group (group['lr'] = ...) or the child optimizer instead of assigning the list"
            )

    @property
    def optimizers(self) -> list[tuple[str, KeyedOptimizer]]:
        return list(self._optims)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for _, opt in self._optims:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._optims:
            opt.zero_grad(set_to_none=set_to_none)

    def init_state(self, sparse_grad_parameter_names: Collection[str] | None = None) -> None:
        names = set(sparse_grad_parameter_names or ())
        for prefix, opt in self._optims:
            opt.init_state([n for n in opt.params if _prefixed(prefix, n) in names])

    def save_param_groups(self, save: bool) -> None:
        super().save_param_groups(save)
        for _, opt in self._optims:
            opt.save_param_groups(save)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": {}, "param_groups": []}
        for prefix, opt in self._optims:
            sd = opt.state_dict()
            out["state"].update({_prefixed(prefix, k): v for k, v in sd["state"].items()})
            for g in sd["param_groups"]:
                out["param_groups"].append({**g, "params": [_prefixed(prefix, n) for n in g["params"]]})
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load every child's part by name; every child is checked before any is loaded, so a
        mismatch in a later child leaves the earlier ones unchanged too."""
        parts = self._split(state_dict)
        for (_, opt), part in zip(self._optims, parts, strict=True):
            opt.check_state_dict(part)
        for (_, opt), part in zip(self._optims, parts, strict=True):
            opt.load_state_dict(part)

    def check_state_dict(self, state_dict: _StateDict) -> list[_GroupPair]:
        return [pair for (_, opt), part in zip(self._optims, self._split(state_dict), strict=True)
                for pair in opt.check_state_dict(part)]  # fmt: skip

    def _extra_state_names(self) -> set[str]:
        return {_prefixed(prefix, n) for prefix, opt in self._optims for n in opt._extra_state_names()}

    def _split(self, state_dict: _StateDict) -> list[_StateDict]:
        """Each child's part of ``state_dict``, in the child's own names; a name that belongs to no
        child raises ``KeyError`` (it would be dropped unseen)."""
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
            raise KeyError("optimizer state_dict must have 'state' and 'param_groups' entries")
        _check_no_unknown_names(state_dict, set(self.params), self._extra_state_names())
        parts: list[_StateDict] = []
        for prefix, opt in self._optims:
            own = set(opt.params) | opt._extra_state_names()

            def strip(name: str, prefix: str = prefix) -> str:
                return name[len(prefix) + 1 :] if prefix else name

            state = {
                strip(k): v
                for k, v in state_dict["state"].items()
                if (k.startswith(prefix + ".") or not prefix) and strip(k) in own
            }
            groups = []
            for g in state_dict["param_groups"]:
                names = [strip(n) for n in g["params"] if (n.startswith(prefix + ".") or not prefix)]
                if names and all(n in own for n in names):
                    groups.append({**g, "params": names})
            parts.append({"state": state, "param_groups": groups})
        return parts

    def __repr__(self) -> str:
        return ",".join(f"{prefix}: {opt!r}" for prefix, opt in self._optims)


class _CombinedState(Mapping[torch.Tensor, Any]):
    """Read-through view ``{param: state}`` over the children (nothing is copied)."""

    def __init__(self, optims: Iterable[tuple[str, KeyedOptimizer]]) -> None:
        self._optims = list(optims)

    def _merged(self) -> dict[torch.Tensor, Any]:
        out: dict[torch.Tensor, Any] = {}
        for _, opt in self._optims:
            out.update(opt.state)
        return out

    def __getitem__(self, key: torch.Tensor) -> Any:
        return self._merged()[key]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())
