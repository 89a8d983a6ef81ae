"""lightrec runs on a range of torch releases (``torch>=2.11,<2.15``): every torch API it names
directly must exist on the running torch; APIs that differ within the range go through
``lightrec._compat`` (whose shims are checked here against a reference too).

Run the suite on the oldest and the newest supported torch (README, "Tested versions") and this
file lists any API used outside ``_compat`` that one of them lacks.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import lightrec
from lightrec import _compat

PACKAGE = Path(lightrec.__file__).parent
# Registered at run time (fbgemm's and lightrec's custom ops), not attributes of torch itself.
DYNAMIC_PREFIXES = ("torch.ops.",)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """``{local name: dotted torch module}`` for ``import torch...`` / ``from torch... import m`` lines."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module == "torch" or node.module.startswith("torch."))
        ):
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _torch_references() -> dict[str, set[str]]:
    """``{dotted torch API: files naming it}`` over every module of the package."""
    refs: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = _aliases(tree)
        outer = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in outer:
                continue  # only the outermost attribute of a chain
            chain = _dotted(node)
            if chain is None or chain[0] not in aliases:
                continue
            name = ".".join([aliases[chain[0]], *chain[1:]])
            refs.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))
        for target in aliases.values():
            refs.setdefault(target, set()).add(str(path.relative_to(PACKAGE.parent)))
    return refs


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:  # a submodule not imported by its parent package
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return False
        if not (isinstance(obj, type) or type(obj).__name__ == "module"):
            return True  # a function, tensor method or value: what follows is not torch's API surface
    return True


def test_every_torch_api_lightrec_names_exists_on_this_torch() -> None:
    refs = _torch_references()
    assert len(refs) > 100  # the walk found the package's torch usage
    missing = {
        name: sorted(files)
        for name, files in refs.items()
        if not name.startswith(DYNAMIC_PREFIXES) and not _resolves(name)
    }
    assert not missing, (
        f"torch {torch.__version__} lacks APIs lightrec uses directly: {missing}; route them through "
        "lightrec/_compat.py with a fallback for the older releases"
    )


@pytest.mark.parametrize("name", ["reduce_scatter_single", "all_gather_single"])
def test_compat_collectives_are_not_named_directly(name: str) -> None:
    """torch 2.11/2.12 lack them: only lightrec._compat may name them (as a getattr fallback)."""
    refs = _torch_references()
    assert f"torch.distributed.{name}" not in refs, refs.get(f"torch.distributed.{name}")


def _compat_body(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    x = torch.arange(12.0).reshape(6, 2) + rank
    rs, ag = torch.empty(6 // world_size, 2), torch.empty(6 * world_size, 2)
    _compat.reduce_scatter_single(rs, x)
    _compat.all_gather_single(ag, x)
    return {"reduce_scatter": rs, "all_gather": ag}


def test_compat_collectives_match_their_definition() -> None:
    from tests.multiprocess import run_ranks

    out = run_ranks(_compat_body, 2)
    x = torch.arange(12.0).reshape(6, 2)
    for rank in range(2):
        assert torch.equal(out[rank]["reduce_scatter"], (2 * x + 1)[rank * 3 : rank * 3 + 3])
        assert torch.equal(out[rank]["all_gather"], torch.cat([x, x + 1]))


def test_lightning_names_resolve_lazily() -> None:
    assert callable(_compat.optimizers_to_device)
    assert _compat.PrefetchDataFetcher.__name__ == "_PrefetchDataFetcher"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _compat.nope  # noqa: B018
    assert _compat.TORCH_VERSION >= (2, 11)


def test_ddp_buffer_sync_names_a_keyword_this_torch_has(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.nn.parallel import DistributedDataParallel

    (key,) = _compat.ddp_buffer_sync(every_forward=False)
    assert key in DistributedDataParallel.__init__.__code__.co_varnames
    monkeypatch.setattr(_compat, "_ddp_parameters", lambda: frozenset({"broadcast_buffers"}))  # torch 2.11
    assert _compat.ddp_buffer_sync(every_forward=True) == {"broadcast_buffers": True}


def test_sparse_types_never_call_the_deprecated_is_fx_tracing() -> None:
    """Issue 23: building a KJT printed torch's "is_fx_tracing will return true for both
    fx.symbolic_trace and torch.export" line in every process (``ProxyableClassMeta`` calls the
    deprecated function). Now eager construction and fx tracing of a constructor both stay quiet,
    with ``lightrec`` alone imported (not ``lightrec.lightning``, which silences other warnings)."""
    import subprocess
    import sys

    code = (
        "import torch, lightrec\n"
        "from lightrec import JaggedTensor, KeyedJaggedTensor, KeyedTensor\n"
        "KeyedJaggedTensor(keys=['a'], values=torch.tensor([1]), lengths=torch.tensor([1]))\n"
        "JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1]))\n"
        "KeyedTensor(keys=['a'], length_per_key=[1], values=torch.ones(1, 1))\n"
        "def build(values, lengths):\n"
        "    return KeyedJaggedTensor(keys=['a'], values=values, lengths=lengths).values()\n"
        "gm = torch.fx.symbolic_trace(build)\n"
        "assert any(n.target is KeyedJaggedTensor for n in gm.graph.nodes), gm.graph\n"
        "assert gm(torch.tensor([4, 5]), torch.tensor([2])).tolist() == [4, 5]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "is_fx_tracing" not in done.stderr + done.stdout


def test_is_fx_symbolic_tracing_is_true_only_inside_symbolic_trace() -> None:
    seen: list[bool] = []

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen.append(_compat.is_fx_symbolic_tracing())
        return x + 1

    probe(torch.ones(1))
    torch.fx.symbolic_trace(probe)
    assert seen == [False, True]


def test_timeout_of_reads_the_timeout_a_group_was_made_with_and_the_datas_group_takes_it(tmp_path: Path) -> None:
    """``timeout_of`` reads a private attribute of torch's: if a torch release moves it, this fails (and the
    groups lightrec makes beside the user's would fall back to torch's 30-minute default silently)."""
    from datetime import timedelta

    import torch.distributed as dist

    from lightrec.data.parquet import ranks

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1, timeout=timedelta(seconds=17))
    try:
        assert _compat.timeout_of(None) == timedelta(seconds=17)
        side = dist.new_group(backend="gloo", timeout=timedelta(seconds=23))
        assert _compat.timeout_of(side) == timedelta(seconds=23)
        assert _compat.timeout_of(ranks.data_group()) == timedelta(seconds=17)  # the default group's, not 30 min
    finally:
        dist.destroy_process_group()
