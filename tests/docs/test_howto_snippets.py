"""The how-to guides in docs/howto/ stay true: their code runs and their commands work.

* The ``python`` blocks of each page run in page order in a fresh process, in a scratch folder,
  and must print what the page shows (``tests/docs/markdown_blocks.py``).
* The CPU commands a page shows are run **as written**, found verbatim in its ``bash`` blocks;
  a test may only append options that shorten the run (fewer steps, fewer batches).
* Every ``lightrec run`` / ``torchrun`` / ``srun`` command of the guides, including the GPU and
  multi-node ones that cannot run here, must parse with the recipe's options: it is replayed with
  ``--print_config``, which stops after parsing.
* The slow tests (``-m slow``) run the export guide on a recipe checkpoint, launch the
  one-machine ``torchrun`` command and a simulated two-rank SLURM job on CPU, and run the own-data
  recipe on two ranks.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import Block, parse_blocks, python_blocks, run_page
from tests.multiprocess import free_port

HOWTO = Path(__file__).resolve().parents[2] / "docs" / "howto"
PAGES = ["own-data.md", "plan-a-big-model.md", "multi-node.md", "install-matrix.md", "export-for-serving.md"]
# One intra-op thread as in the rest of the suite; a scratch HOME-independent, quiet environment.
ENV = {"OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "PYTHONWARNINGS": "ignore"}
# Options a test appends to a page's training command: same code path, a few steps only.
SHORT = [
    "--trainer.max_epochs", "1", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar", "false",
]  # fmt: skip


def _blocks(page: str) -> list[Block]:
    return parse_blocks((HOWTO / page).read_text())


def page_commands(page: str) -> list[str]:
    """Every command line of the page's ``bash`` blocks (comments and ``#SBATCH`` lines dropped)."""
    lines = []
    for block in _blocks(page):
        if block.lang != "bash":
            continue
        for line in block.code.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _command(page: str, text: str) -> list[str]:
    assert text in page_commands(page), f"{page} no longer shows the command {text!r}; update the test"
    return shlex.split(text)


def _block_starting(page: str, first_line: str) -> Block:
    found = [b for b in _blocks(page) if b.code.splitlines()[0] == first_line]
    assert len(found) == 1, f"{page}: expected one block starting with {first_line!r}, found {len(found)}"
    return found[0]


def _run(argv: list[str], cwd: Path, timeout: float = 240, env: dict[str, str] | None = None) -> str:
    """Run a command of a page; ``lightrec`` means this interpreter's ``python -m lightrec.cli``."""
    if argv[0] == "lightrec":
        argv = [sys.executable, "-m", "lightrec.cli", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def _check_page(page: str, workdir: Path) -> None:
    result = run_page(HOWTO / page, workdir, timeout=300, env=ENV | {"MASTER_PORT": str(free_port())})
    problems = result.problems(python_blocks(HOWTO / page))
    assert not problems, "\n\n".join(problems)


# ------------------------------------------------------------------------------------ every page
@pytest.mark.parametrize("page", PAGES)
def test_page_fences_are_closed_and_known(page: str) -> None:
    langs = {b.lang for b in _blocks(page)}
    assert langs <= {"python", "text", "bash", "yaml"}, f"{page}: unexpected fence languages {langs}"


def test_every_recipe_command_of_the_guides_parses(tmp_path: Path) -> None:
    """GPU and multi-node commands cannot run here; their options must still be the recipes' options."""
    replays: list[list[str]] = []
    for page in PAGES:
        for line in page_commands(page):
            argv = shlex.split(line)
            while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value prefixes
                argv = argv[1:]
            if argv[:1] == ["srun"]:
                argv = argv[1:]
            if argv[:2] == ["lightrec", "run"]:
                replays.append(["lightrec", *argv[1:]])
            elif argv[:1] == ["torchrun"]:
                module = argv[argv.index("-m") + 1]
                replays.append([module, *argv[argv.index("-m") + 2 :]])
    assert len(replays) >= 8, f"expected the guides' recipe commands, found {replays}"
    script = (
        "import importlib, sys, json\n"
        "from lightrec.cli import main\n"
        "failed = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        if argv[0] == 'lightrec':\n"
        "            main([*argv[1:], '--print_config'])\n"
        "        else:\n"
        "            importlib.import_module(argv[0]).main([*argv[1:], '--print_config'])\n"
        "    except SystemExit as exit:\n"
        "        if exit.code not in (0, None):\n"
        "            failed.append(argv)\n"
        "print('FAILED', json.dumps(failed))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(replays)],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED ")]
    assert proc.returncode == 0 and last, proc.stderr[-4000:]
    failed = json.loads(last[-1][len("FAILED ") :])
    # own-data's `lightrec run dlrm --config my_dlrm/configs/clicks.yaml` needs the files the page
    # writes first; test_own_data_recipe_runs_on_the_converted_file runs it for real.
    failed = [f for f in failed if "my_dlrm/configs/clicks.yaml" not in f]
    assert not failed, f"these commands do not parse:\n{failed}\n{proc.stderr[-4000:]}"


# ------------------------------------------------------------------------------------ own data
def _own_data_files(workdir: Path) -> None:
    """Run the page's python blocks (clicks.csv, clicks_npy/), `lightrec cp`, and save its two files."""
    _check_page("own-data.md", workdir)
    _run(_command("own-data.md", "lightrec cp dlrm my_dlrm"), workdir)
    for first_line in ("# my_dlrm/click_data.py", "# my_dlrm/configs/clicks.yaml"):
        (workdir / first_line[2:]).write_text(_block_starting("own-data.md", first_line).code)


@pytest.mark.slow  # a Criteo-format file converted, then a recipe run on it: ~55 s on 2 shared cores
def test_own_data_recipe_runs_on_the_converted_file(tmp_path: Path) -> None:
    _own_data_files(tmp_path)
    one_rank = "python my_dlrm/dlrm.py fit --config my_dlrm/configs/clicks.yaml --trainer.devices 1 --data.init_args.batch_size 512"
    out = _run(_command("own-data.md", one_rank) + SHORT, tmp_path)
    assert "lightrec recipe finished" in out and "test: " in out, out
    assert list((tmp_path / "lightning_logs" / "clicks").glob("version_*/events.out.tfevents.*"))


@pytest.mark.slow
def test_own_data_on_two_ranks_and_through_lightrec_run(tmp_path: Path) -> None:
    _own_data_files(tmp_path)
    out = _run(
        _command("own-data.md", "python my_dlrm/dlrm.py fit --config my_dlrm/configs/clicks.yaml") + SHORT,
        tmp_path,
    )
    assert "lightrec recipe finished" in out, out
    argv = _command(
        "own-data.md", "PYTHONPATH=my_dlrm lightrec run dlrm --config my_dlrm/configs/clicks.yaml"
    )
    out = _run([*argv[1:], *SHORT], tmp_path, env={"PYTHONPATH": str(tmp_path / "my_dlrm")})
    assert "lightrec recipe finished" in out, out


# ------------------------------------------------------------------------------------ planning
def test_plan_a_big_model_blocks(tmp_path: Path) -> None:
    _check_page("plan-a-big-model.md", tmp_path)
    assert (tmp_path / "plan.json").exists() and (tmp_path / "big_plan.json").exists()


def test_lightrec_plan_command_prints_what_the_page_explains(tmp_path: Path) -> None:
    import json

    command = next(c for c in page_commands("plan-a-big-model.md") if c.startswith("lightrec plan dlrm"))
    out = _run(_command("plan-a-big-model.md", command), tmp_path)
    assert "26 tables on 16 ranks (cuda)" in out, out
    assert "t_cat_0(TWRW)" in out, out  # the page's reading of this plan
    assert (tmp_path / "plan.png").stat().st_size > 0
    # The page says the file names the collection by its RecModule path, the one RecStrategy sees.
    assert list(json.loads((tmp_path / "plan.json").read_text())["plan"]) == [
        "model.sparse_arch.embedding_bag_collection"
    ]


# ------------------------------------------------------------------------------------ install
def test_install_check_block(tmp_path: Path) -> None:
    from lightrec._fbgemm import fbgemm_available

    if not fbgemm_available():  # LIGHTREC_BLOCK_FBGEMM=1, or a torch other than fbgemm 1.8's 2.13
        pytest.skip("the page shows the output of a healthy install: torch 2.13 with fbgemm 1.8")
    _check_page("install-matrix.md", tmp_path)


def test_install_matrix_matches_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((HOWTO.parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    text = (HOWTO / "install-matrix.md").read_text()
    for name in ("cpu", "cuda"):
        pins = json.dumps(extras[name])  # the fbgemm release and the torch it is built for
        assert f"{name} = {pins}" in text, (
            f"the page quotes a different [{name}] extra than pyproject's {pins}"
        )
        assert f".[{name}]" in text
    torch_pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    assert torch_pin.replace("torch", "") in text, f"the page must quote the torch pin {torch_pin}"


# ------------------------------------------------------------------------------------ export
EXPORT = "export-for-serving.md"
CHECKPOINT = "lightning_logs/dlrm/version_0/checkpoints/last.ckpt"


def _recipe_run_with_export(workdir: Path) -> Path:
    """The page's `lightrec run dlrm --recipe.export true`, on one rank and a few steps."""
    out = _run(
        [*_command(EXPORT, "lightrec run dlrm --recipe.export true"), "--devices", "1", *SHORT], workdir
    )
    version = workdir / "lightning_logs" / "dlrm" / "version_0"
    assert (version / "export" / "model_int8.pt").exists(), out
    assert (workdir / CHECKPOINT).is_dir()  # RecStrategy writes a sharded checkpoint folder
    return version


@pytest.mark.slow  # a recipe run, the page's export and a fresh process: ~35 s on 2 shared cores
def test_export_for_serving_blocks_and_serving_without_lightrec(tmp_path: Path) -> None:
    _recipe_run_with_export(tmp_path)
    _check_page(EXPORT, tmp_path)
    # The serving block again, in a process where lightrec cannot be imported.
    serve = _block_starting(
        EXPORT, "# serve.py: needs torch (and fbgemm_gpu when the artifact uses it), not lightrec"
    )
    program = (
        "import sys\nsys.modules['lightrec'] = None  # import lightrec fails from here on\n" + serve.code
    )
    printed = _run([sys.executable, "-c", program], tmp_path)
    assert "torch.Size([2])" in printed


@pytest.mark.slow
def test_export_commands(tmp_path: Path) -> None:
    version = _recipe_run_with_export(tmp_path)
    _run(_command(EXPORT, f"lightrec export {CHECKPOINT}"), tmp_path)
    assert (version / "checkpoints" / "last_int8.pt").exists()
    assert (version / "checkpoints" / "last_int8.pt.meta.json").exists()
    _run(_command(EXPORT, f"lightrec export {CHECKPOINT} --out serving/dlrm_int4.pt --dtype int4"), tmp_path)
    assert (tmp_path / "serving" / "dlrm_int4.pt").exists()
    _run(_command(EXPORT, f"lightrec consolidate {CHECKPOINT} dlrm_full.ckpt"), tmp_path)
    assert (tmp_path / "dlrm_full.ckpt").is_file()


# ------------------------------------------------------------------------------------ multi-node
@pytest.mark.slow
def test_torchrun_on_one_machine(tmp_path: Path) -> None:
    command = "torchrun --standalone --nproc_per_node 2 -m lightrec.recipes.dlrm fit --config dlrm --trainer.devices 2"
    argv = _command("multi-node.md", command)
    out = _run([sys.executable, "-m", "torch.distributed.run", *argv[1:], *SHORT], tmp_path)
    assert "lightrec recipe finished" in out, out


@pytest.mark.slow
def test_slurm_job_simulated_on_one_machine(tmp_path: Path) -> None:
    """Two processes with the variables srun gives two tasks of one node; Lightning must take them."""
    line = next(c for c in page_commands("multi-node.md") if c.startswith("srun lightrec run"))
    argv = shlex.split(line)[1:]  # drop srun
    # the page's job has 2 nodes x 8 GPUs; here: 1 node x 2 CPU tasks, same recipe and config
    args = [sys.executable, "-m", "lightrec.cli", "run", "dlrm", "--config", "dlrm", "--accelerator", "cpu",
            "--devices", "2", "--num-nodes", "1", *SHORT]  # fmt: skip
    assert argv[:3] == ["lightrec", "run", "dlrm"]
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ, **ENV, "MASTER_PORT": str(port), "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_NNODES": "1", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "dlrm", "SLURM_NODELIST": "127.0.0.1",
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-4000:]
    # Had Lightning not taken the SLURM variables, each task would have launched its own second rank.
    assert "lightrec recipe finished" in outs[0][0]
