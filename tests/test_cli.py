"""The ``lightrec`` console script: ls, cp, plan, run, export and their usage errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightrec.cli import main
from lightrec.recipes import CONFIGS, CONFIGS_DIR, RECIPES

TINY = ["--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--data.init_args.num_embeddings_cap=200", "--data.init_args.batch_size=32"]  # fmt: skip


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_ls_lists_every_recipe_and_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    for name in [*RECIPES, *CONFIGS]:
        assert f"  {name} " in out


def test_cp_copies_recipe_and_configs_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "mine"
    assert main(["cp", "two_tower", str(dest)]) == 0
    assert (dest / "two_tower.py").read_text() == RECIPES["two_tower"].path.read_text()
    copied = dest / "configs" / "two_tower_movielens.yaml"
    assert copied.read_text() == (CONFIGS_DIR / "two_tower_movielens.yaml").read_text()
    copied.write_text("# edited\n")
    assert main(["cp", "two_tower", str(dest)]) == 2  # a user mistake
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and str(copied) in err
    assert copied.read_text() == "# edited\n"  # nothing was touched


def test_copied_recipe_runs_from_its_own_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    assert main(["cp", "dlrm", str(tmp_path / "my")]) == 0
    spec = importlib.util.spec_from_file_location("my_dlrm", tmp_path / "my" / "dlrm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # No --config: the copy's own configs/dlrm.yaml is the default.
    cli = module.main(["fit", "--trainer.devices=1", "--trainer.strategy=auto",
                       f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY])  # fmt: skip
    assert type(cli.model).__module__ == "my_dlrm" and cli.trainer.global_step == 2


def test_run_passes_shortcuts_and_lightningcli_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "dlrm", "--devices", "1", "--accelerator", "cpu", "--trainer.strategy", "auto",
            f"--trainer.logger.init_args.save_dir={tmp_path}", "--model.embedding_dim=8", *TINY]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "lightrec recipe finished" in out and "Bayes-optimal AUC" in out
    saved = (tmp_path / "dlrm" / "version_0" / "config.yaml").read_text()
    assert "embedding_dim: 8" in saved and "strategy: auto" in saved
    assert re.search(r"devices: '?1'?\n", saved) and re.search(r"accelerator: cpu\n", saved)


def test_run_with_accelerator_gpu_reaches_the_trainer_and_picks_nccl(capsys: pytest.CaptureFixture[str]) -> None:
    """`lightrec run dlrm --accelerator gpu --devices 1`: the shortcut lands in the Trainer's
    config (parsed only: no GPU here) and the recipe's RecStrategy talks NCCL on a CUDA device."""
    import torch

    from lightrec.lightning import RecStrategy

    assert main(["run", "dlrm", "--accelerator", "gpu", "--devices", "1", "--print_config"]) == 0
    config = capsys.readouterr().out
    assert re.search(r"accelerator: gpu\n", config) and "strategy: lightrec" in config
    assert re.search(r"devices: '?1'?\n", config)
    strategy = RecStrategy(parallel_devices=[torch.device("cuda", 0)])
    assert strategy._get_process_group_backend() == "nccl"


def test_unknown_recipe_and_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    valid = ", ".join(RECIPES)
    assert f"unknown recipe 'dlrn' (did you mean 'dlrm'?); valid recipes: {valid}" in usage_error(["run", "dlrn"], capsys)
    assert f"valid recipes: {valid}" in usage_error(["run"], capsys)
    assert f"valid recipes: {valid}" in usage_error(["cp", "nope", "x"], capsys)
    assert "--devices: must be a positive integer, got '0'" in usage_error(
        ["run", "dlrm", "--devices", "0"], capsys
    )
    assert "invalid choice: 'tpu'" in usage_error(["run", "dlrm", "--accelerator", "tpu"], capsys)
    assert "invalid choice: 'train'" in usage_error(["train"], capsys)
    assert "unrecognized arguments: --verbose" in usage_error(["ls", "--verbose"], capsys)
    err = usage_error(["plan", "no_such_config"], capsys)
    assert "valid configs: " + ", ".join(CONFIGS) in err
    assert "unrecognized arguments: --fast" in usage_error(["plan", "dlrm", "--fast"], capsys)


def test_plan_prints_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, plan_json = tmp_path / "plan.png", tmp_path / "plan.json"
    assert main(["plan", "dlrm", "--devices", "4", "--png", str(png), "--json", str(plan_json)]) == 0
    out = capsys.readouterr().out
    assert "4 device(s) x 1 node(s), cpu" in out
    assert "26 tables on 4 ranks (cpu)" in out
    # which kernel serves the fused tables, and why (the suite pins LIGHTREC_CPU_KERNEL=fbgemm)
    assert "CPU kernels of the fused tables:\nfused row_wise_adagrad, kernel_backend='auto':" in out, out
    assert "  dim <= 16 (26 tables): fbgemm: forced (LIGHTREC_CPU_KERNEL=fbgemm)" in out, out
    rows = [line for line in out.splitlines() if line[:1].isdigit() and " | " in line]
    assert [int(r.split("|")[0]) for r in rows] == [0, 1, 2, 3]
    assert png.read_bytes()[:4] == b"\x89PNG"
    from lightrec.distributed import ShardingPlan

    plan = ShardingPlan.from_json(plan_json.read_text())
    tables = {t for module_plan in plan.plan.values() for t in module_plan}
    assert tables == {f"t_cat_{i}" for i in range(26)}
    assert list(plan.plan) == ["model.sparse_arch.embedding_bag_collection"]  # RecStrategy's path


def test_plan_markdown_config_file_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "custom.yaml"
    config.write_text((CONFIGS_DIR / "dlrm_dcn.yaml").read_text())
    assert "cannot tell which recipe" in usage_error(["plan", str(config)], capsys)
    argv = ["plan", str(config), "--recipe", "dlrm", "--markdown", "--data.init_args.num_embeddings_cap=50"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| rank | HBM used / cap |" in out and "2 device(s) x 1 node(s)" in out


def test_plan_reports_a_config_whose_data_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "dlrm_criteo", "--data.init_args.data_dir=/nonexistent/criteo"]) == 2
    err = capsys.readouterr().err
    assert "cannot build the model of" in err and "preprocess_criteo" in err


def test_export_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "missing.ckpt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    import torch

    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    assert main(["export", str(foreign)]) == 2
    assert "not written by a lightrec recipe" in capsys.readouterr().err


@pytest.mark.parametrize("reference,said", [
    ("nonexistent_pkg.Foo", "cannot be imported (ModuleNotFoundError: No module named 'nonexistent_pkg')"),
    ("Foo", "is not a dotted class path"),  # importlib: ValueError "Empty module name"
    ("lightrec.NoSuchClass", "names nothing: lightrec has no attribute 'NoSuchClass'"),
    ("{tmp}/nofile.py:X", "names file '{tmp}/nofile.py', which does not exist"),
    ("{tmp}/broken.py:X", "cannot be imported (SyntaxError"),
    ("lightrec.inference.export", "is a function, not a class"),
    ("lightrec.KeyedJaggedTensor", "is class KeyedJaggedTensor, not a RecModule (LightningModule) subclass"),
])
@pytest.mark.parametrize("given", ["checkpoint", "--module"])
def test_export_names_a_bad_module_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reference: str, said: str, given: str
) -> None:
    """A stale ``lightrec_module`` entry or a mistyped ``--module``: one line naming it and the two forms."""
    import torch

    (tmp_path / "broken.py").write_text("def (\n")
    reference, said = reference.format(tmp=tmp_path), said.format(tmp=tmp_path)
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": {}, "lightrec_module": reference if given == "checkpoint" else "stale.Name"}, ckpt)
    argv = ["export", str(ckpt)] + (["--module", reference] if given == "--module" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    if given == "checkpoint" and ":" in reference:  # a file the checkpoint names is never run: refused first
        assert "which lightrec does not run on a checkpoint's word" in err and f"--module {reference}" in err
        return
    source = "--module" if given == "--module" else f"the checkpoint's lightrec_module entry ({str(ckpt)!r})"
    assert f"{source} {reference!r} {said}" in err, err
    assert "--module package.module.Class or --module path/to/file.py:Class" in err


def test_export_does_not_run_a_file_the_checkpoint_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint from elsewhere naming ``evil.py:Model`` must not make ``lightrec export`` execute it."""
    import torch

    ran = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(ran)!r}, 'w').close()\nclass Model:\n    pass\n")
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": {}, "lightrec_module": f"{evil}:Model"}, ckpt)
    assert main(["export", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"names its RecModule class by a file ({str(evil) + ':Model'!r})" in err
    assert f"lightrec export {ckpt} --module {evil}:Model" in err
    assert not ran.exists()
    # named by the user, the file is the user's choice: it runs (and is then refused as no LightningModule)
    assert main(["export", str(ckpt), "--module", f"{evil}:Model"]) == 2
    assert ran.exists()
    assert "is class Model, not a RecModule (LightningModule) subclass" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--png"])
def test_plan_checks_its_output_paths_before_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    import lightrec.cli.plan

    def not_reached(*args: object, **kwargs: object) -> None:
        raise AssertionError("planned before the output path was checked")

    monkeypatch.setattr(lightrec.cli.plan, "plan_sharding", not_reached)
    missing = tmp_path / "no_such_dir" / "plan.out"
    assert main(["plan", "dlrm", option, str(missing)]) == 2
    assert f"the folder of {str(missing)!r} does not exist; create it first" in capsys.readouterr().err
    assert main(["plan", "dlrm", option, str(tmp_path)]) == 2
    assert f"{str(tmp_path)!r} is a folder; give the file to write" in capsys.readouterr().err


def test_export_writes_a_quantized_artifact_that_scores_like_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    inference = pytest.importorskip("lightrec.inference")
    if not callable(getattr(inference, "export_from_checkpoint", None)):
        pytest.skip("lightrec.inference.export_from_checkpoint is not available yet")
    argv = ["run", "dlrm", "--devices", "1", "--trainer.strategy", "auto", "--recipe.test_after_fit=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]  # fmt: skip
    assert main(argv) == 0
    last = tmp_path / "dlrm" / "version_0" / "checkpoints" / "last.ckpt"
    out = tmp_path / "served" / "dlrm.pt"
    assert main(["export", str(last), "--out", str(out), "--dtype", "fp16"]) == 0
    assert out.is_file() and f"-> {out}" in capsys.readouterr().out
    from lightrec.data import SyntheticCriteo
    from lightrec.recipes.dlrm import DLRMModule

    batch = SyntheticCriteo(batch_size=16, num_embeddings_cap=200).datasets["test"][0]
    reference = DLRMModule.load_from_checkpoint(last, map_location="cpu").serving_model()
    artifact = torch.jit.load(str(out))
    with torch.no_grad():
        expected = reference(batch.dense_features, batch.sparse_features).reshape(-1)
        kjt = batch.sparse_features
        got = artifact(batch.dense_features, kjt.values(), kjt.lengths()).reshape(-1)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=0)  # fp16 tables


def _dmp_available() -> str | None:
    try:
        from lightrec.distributed import DistributedModelParallel  # noqa: F401
    except ImportError as exc:
        return f"lightrec.distributed.DistributedModelParallel is not importable yet ({exc})"
    return None


@pytest.mark.skipif(_dmp_available() is not None, reason=str(_dmp_available()))
def test_main_job_on_two_cpu_ranks_with_rec_strategy(tmp_path: Path) -> None:
    """The README's main job, reduced: `lightrec run dlrm` sharded over 2 gloo ranks (strategy lightrec)."""
    from tests.multiprocess import free_port

    # A fresh launch, as from a shell: no process-group variables an earlier in-process fit of this
    # pytest run may have left in the environment, and a port nothing listens on.
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launch_vars}
    env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with_summary = [a for a in TINY[1:] if "enable_model_summary" not in a]
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", "--devices", "2",
           f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_steps=4", "--recipe.export=true",
           *with_summary]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "lightrec recipe finished" in done.stdout and "Bayes-optimal AUC" in done.stdout
    assert done.stdout.count("lightrec recipe finished") == 1  # printed by rank 0 only
    _check_first_hour_output(done.stdout + done.stderr, tmp_path)
    saved = (tmp_path / "dlrm" / "version_0" / "config.yaml").read_text()
    assert "strategy: lightrec" in saved and re.search(r"devices: '?2'?\n", saved)
    # The checkpoint is sharded (a folder, one file per rank); consolidate and export read it.
    last = tmp_path / "dlrm" / "version_0" / "checkpoints" / "last.ckpt"
    assert sorted(p.name for p in last.iterdir()) == ["manifest.json", "meta.pt", "shards-rank00000.pt", "shards-rank00001.pt"]
    full = tmp_path / "full.ckpt"
    assert main(["consolidate", str(last), str(full)]) == 0
    assert main(["consolidate", str(last), str(full)]) == 2  # never overwrites without --force
    import torch

    from lightrec.recipes.dlrm import DLRMModule

    state = torch.load(full, weights_only=False)["state_dict"]
    table = state["model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0.weight"]
    assert table.dim() == 2 and table.shape[1] == DLRMModule.load_from_checkpoint(full).hparams.embedding_dim
    out = tmp_path / "served.pt"
    assert main(["export", str(last), "--out", str(out)]) == 0 and out.is_file()
    # recipe.export: the QuantizedExport callback gathered the sharded tables; rank 0 wrote the artifact,
    # which scores like the artifact exported from the (consolidated) last checkpoint.
    artifact = tmp_path / "dlrm" / "version_0" / "export" / "model_int8.pt"
    assert artifact.is_file() and "model_int8.pt" in done.stdout
    from lightrec.data import SyntheticCriteo

    batch = SyntheticCriteo(batch_size=16, num_embeddings_cap=200).datasets["test"][0]
    kjt = batch.sparse_features
    with torch.no_grad():
        scores = [torch.jit.load(str(p))(batch.dense_features, kjt.values(), kjt.lengths()) for p in (artifact, out)]
    torch.testing.assert_close(scores[0], scores[1])


def _check_first_hour_output(output: str, tmp_path: Path) -> None:
    """Issue 16 on the main job's console: no line twice, the plan table (PlanReport is in the
    shipped config) with `lightrec plan`'s numbers, a model summary that counts whole tables as
    trained, and a sharded last.ckpt that RecModule.load_from_checkpoint reads on one process."""
    lines = output.splitlines()
    assert not [line for line in lines if line.startswith("INFO:")]  # Lightning's INFO lines once, not twice
    assert output.count("Sharding plan (greedy):") == 1
    assert output.count("is_fx_tracing will return true") == 0 and "LeafSpec)` is deprecated" not in output
    run_rows = [line for line in lines if re.match(r"^\d+\s+\| .*MiB", line)]
    assert [r.split("|")[0].strip() for r in run_rows] == ["0", "1"]
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["plan", "dlrm", "--devices", "2", *[a for a in TINY if a.startswith("--data.")]]) == 0
    plan_rows = [line for line in printed.getvalue().splitlines() if re.match(r"^\d+\s+\| .*MiB", line)]
    assert plan_rows == run_rows  # the same memory and cost per rank as the run's planner
    assert re.search(r"^0\s+Non-trainable params$", output, re.MULTILINE)
    total = re.search(r"^(\S+ \S?)\s*Total params$", output, re.MULTILINE)
    assert total is not None
    from lightrec.data import SyntheticCriteo
    from lightrec.recipes.dlrm import DLRMModule

    rows = sum(c.num_embeddings for c in SyntheticCriteo(num_embeddings_cap=200).table_configs(1))
    last = tmp_path / "dlrm" / "version_0" / "checkpoints" / "last.ckpt"
    restored = DLRMModule.load_from_checkpoint(last, map_location="cpu")  # a 2-rank folder, one process
    embedding = sum(p.numel() for n, p in restored.named_parameters() if "embedding_bags" in n)
    assert embedding == rows * restored.embedding_dim  # whole tables, not rank 0's shards
    dense = sum(p.numel() for n, p in restored.named_parameters() if "embedding_bags" not in n)
    assert f"{embedding + dense:,}" in output or f"{(embedding + dense) / 1000:.1f} K" in total.group(1)


def _main_job_test_auc(workdir: Path, accelerator: str) -> float:
    """`lightrec run dlrm --accelerator <accelerator> --devices 1` (the full default config): test AUC."""
    from tests.multiprocess import free_port

    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", "--accelerator", accelerator, "--devices", "1",
           f"--trainer.logger.init_args.save_dir={workdir}", "--trainer.enable_progress_bar=false"]  # fmt: skip
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    match = re.search(r"\bauc=([0-9.]+)", done.stdout)
    assert match is not None, done.stdout[-2000:]
    return float(match.group(1))


@pytest.mark.gpu
def test_main_job_on_one_gpu_matches_the_cpu_run(tmp_path: Path) -> None:
    """`lightrec run dlrm --accelerator gpu --devices 1` completes (fit, sharded checkpoint, test,
    int8 export) and learns as the same command on CPU does.

    Not "within 0.005 of the CPU run": both start from the same tables, dense layers and batches, but
    one process's 600 steps are chaotic -- on CPU, dense_lr 0.05 ends at test AUC 0.764 and 0.0501 at
    0.805 (seed 1: 0.807) -- so the GPU's other rounding can land either way (an H200 gave 0.807
    where the CPU gave 0.764). Both must be in the band the CPU runs reach (0.75 and up) and below
    the data's Bayes-optimal 0.836."""
    gpu = _main_job_test_auc(tmp_path / "gpu", "gpu")
    cpu = _main_job_test_auc(tmp_path / "cpu", "cpu")
    assert 0.75 <= gpu <= 0.836 and 0.75 <= cpu <= 0.836, (gpu, cpu)
    assert (tmp_path / "gpu" / "dlrm" / "version_0" / "export" / "model_int8.pt").is_file()

