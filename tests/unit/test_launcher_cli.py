"""npurun's command line: torchrun's spellings, PET_ defaults, SLURM precedence, and the
worker environment and command built from them."""
from __future__ import annotations

import os

import pytest

from launcher import cli
from launcher.procs.env import JobInfo, worker_command, worker_env
from launcher.errors import ConfigError
from launcher.procs.output import Std, std_for
from launcher.procs.proc import LogFiles


@pytest.mark.timeout(10)
def test_dashed_and_underscored_spellings_mean_the_same():
    a = cli.parse_args(["--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1",
                        "--master-addr", "h0", "--master-port", "1234", "--max-restarts", "2",
                        "--monitor-interval", "0.5", "--log-dir", "L", "--run-id", "R",
                        "-r", "3", "-t", "0:1", "train.py", "--lr", "0.1"])
    b = cli.parse_args(["--nproc_per_node=4", "--nnodes=2", "--node_rank=1", "--master_addr=h0",
                        "--master_port=1234", "--max_restarts=2", "--monitor_interval=0.5",
                        "--log_dir=L", "--rdzv_id=R", "--redirects=3", "--tee=0:1",
                        "train.py", "--lr", "0.1"])
    assert vars(a) == vars(b)
    assert a.training_script == "train.py" and a.training_script_args == ["--lr", "0.1"]
    m = cli.parse_args(["-m", "pkg.mod", "-x"])
    assert m.module and m.training_script == "pkg.mod" and m.training_script_args == ["-x"]
    assert cli.parse_args(["--no-python", "prog"]).no_python


@pytest.mark.timeout(10)
def test_defaults_single_node_free_port():
    lay = cli.resolve(cli.parse_args(["s.py"]), {})
    assert (lay.nnodes, lay.node_rank, lay.master_addr, lay.master_port,
            lay.nproc_per_node) == (1, 0, "127.0.0.1", 0, 1)
    lay = cli.resolve(cli.parse_args(["--nnodes", "2:2", "s.py"]), {})
    assert lay.nnodes == 2 and lay.master_port == 29500


@pytest.mark.timeout(10)
def test_pet_variables_give_defaults(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    args = cli.parse_args(["s.py"])
    assert cli.resolve(args, {}).nproc_per_node == 3 and args.max_restarts == 2
    assert cli.resolve(cli.parse_args(["--nproc-per-node", "5", "s.py"]), {}).nproc_per_node == 5


SLURM = {"SLURM_JOB_NODELIST": "gpu[3-4],cpu1", "SLURM_NNODES": "3", "SLURM_NODEID": "1",
         "SLURM_JOB_ID": "20042"}


@pytest.mark.timeout(10)
def test_slurm_gives_the_node_layout_and_flags_win():
    lay = cli.resolve(cli.parse_args(["--nproc-per-node", "2", "s.py"]), SLURM)
    assert (lay.nnodes, lay.node_rank, lay.master_addr, lay.master_port) == (3, 1, "gpu3", 20042)
    assert lay.from_slurm
    lay = cli.resolve(cli.parse_args(["--nnodes", "2", "--node-rank", "0", "--master-addr",
                                      "x", "--master-port", "999", "s.py"]), SLURM)
    assert (lay.nnodes, lay.node_rank, lay.master_addr, lay.master_port) == (2, 0, "x", 999)
    lay = cli.resolve(cli.parse_args(["--standalone", "s.py"]), SLURM)
    assert (lay.nnodes, lay.master_port) == (1, 0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("argv, match", [
    (["--nnodes", "1:4", "s.py"], "elastic"),
    (["--nnodes", "2", "--node-rank", "2", "s.py"], "node-rank"),
    (["--nproc-per-node", "0", "s.py"], ">= 1"),
    (["--nproc-per-node", "tpu", "s.py"], "not an integer"),
])
def test_bad_layouts_are_refused(argv, match):
    with pytest.raises(ConfigError, match=match):
        cli.resolve(cli.parse_args(argv), {})


@pytest.mark.timeout(10)
def test_std_maps():
    assert Std.parse("3") is Std.ALL and Std.parse("0") is Std.NONE
    m = Std.parse("0:3,1:1")
    assert std_for(m, 0) == Std.ALL and std_for(m, 1) == Std.OUT and std_for(m, 2) == Std.NONE
    for bad in ("4", "0:5", "x:1", "0=1"):
        with pytest.raises(ConfigError):
            Std.parse(bad)


@pytest.mark.timeout(10)
def test_worker_env_of_a_rank_on_node_one(tmp_path):
    job = JobInfo(job_id="abc123", run_id="run7", secret="ab" * 32, master_addr="10.0.0.1",
                  master_port=29500, nnodes=2, node_rank=1, nproc_per_node=4, max_restarts=3)
    files = LogFiles(str(tmp_path / "2"))
    env = worker_env({"PATH": "/bin", "RANK": "99"}, job, 2, 1, files, launcher_pid=42)
    expect = {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
              "GROUP_RANK": "1", "ROLE_RANK": "6", "MASTER_ADDR": "10.0.0.1",
              "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "1",
              "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "run7",
              "RANK_ID": "6", "RANK_SIZE": "8", "DEVICE_ID": "2", "ASCEND_DEVICE_ID": "2",
              "NPUSIM_JOB_ID": "abc123", "NPUSIM_JOB_SECRET": "ab" * 32,
              "NPUSIM_NODE_COUNT": "2", "NPUSIM_LAUNCHER_PID": "42", "PYTHONUNBUFFERED": "1",
              "TORCHELASTIC_ERROR_FILE": files.error_file,
              "NPUSIM_STACK_FILE": files.stack_file, "PATH": "/bin", "OMP_NUM_THREADS": "1",
              "NPUSIM_NODE_CORES": str(len(os.sched_getaffinity(0)))}
    assert {k: env[k] for k in expect} == expect


@pytest.mark.timeout(10)
def test_worker_command_never_carries_the_secret():
    assert worker_command("t.py", ["-a"], python="py") == \
        ["py", "-u", "-m", "launcher.worker", "t.py", "-a"]
    assert worker_command("p.m", [], module=True, python="py")[-2:] == ["-m", "p.m"]
    assert worker_command("prog", ["x"], no_python=True, python="py")[-3:] == \
        ["--exec", "prog", "x"]


@pytest.mark.timeout(10)
def test_c10d_rendezvous_on_an_endpoint_maps_to_the_store_address():
    args = cli.parse_args(["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400",
                           "--nnodes", "2", "--node-rank", "1", "s.py"])
    lay = cli.resolve(args, {})
    assert (lay.master_addr, lay.master_port, lay.nnodes, lay.node_rank) == \
        ("localhost", 29400, 2, 1)
    lay = cli.resolve(cli.parse_args(["--rdzv_backend", "c10d", "--rdzv_endpoint", "h1",
                                      "--nnodes", "2", "s.py"]), {})
    assert (lay.master_addr, lay.master_port) == ("h1", 29400)       # torchrun's c10d port
    # explicit --master-* win over the endpoint, as flags win over defaults
    lay = cli.resolve(cli.parse_args(["--rdzv-endpoint", "h1:7", "--master-port", "8", "s.py"]),
                      {})
    assert lay.master_port == 8
    with pytest.raises(ConfigError, match="--rdzv-backend 'etcd'"):
        cli.resolve(cli.parse_args(["--rdzv-backend", "etcd", "s.py"]), {})
    with pytest.raises(ConfigError, match="port 'x' is not a number"):
        cli.resolve(cli.parse_args(["--rdzv-endpoint", "h:x", "s.py"]), {})


@pytest.mark.timeout(10)
def test_rdzv_id_and_conf_are_accepted():
    a = cli.parse_args(["--rdzv-id", "job7", "--rdzv-conf", "join_timeout=5,read_timeout=9",
                        "s.py"])
    assert a.run_id == "job7" and a.rdzv_conf == "join_timeout=5,read_timeout=9"
    assert cli.parse_args(["--rdzv_id=job8", "s.py"]).run_id == "job8"


@pytest.mark.timeout(10)
def test_local_ranks_filter():
    assert cli.ranks_filter(cli.parse_args(["--local-ranks-filter", "0,2", "s.py"])
                            .local_ranks_filter) == {0, 2}
    assert cli.ranks_filter(cli.parse_args(["--local_ranks_filter=1", "s.py"])
                            .local_ranks_filter) == {1}
    assert cli.ranks_filter(None) is None
    with pytest.raises(ConfigError, match="'a' is not a local rank"):
        cli.ranks_filter("0,a")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("word", ["auto", "cpu", "gpu", "npu"])
def test_nproc_per_node_words_mean_the_cpu_count(word):
    import os
    assert cli.resolve(cli.parse_args(["--nproc-per-node", word, "s.py"]), {}) \
        .nproc_per_node == (os.cpu_count() or 1)
    with pytest.raises(ConfigError, match="'tpu' is not an integer"):
        cli.resolve(cli.parse_args(["--nproc-per-node", "tpu", "s.py"]), {})


@pytest.mark.timeout(10)
def test_status_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--status", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-conf",
                 "--local-ranks-filter", "--rdzv-id"):
        assert flag in out, flag
    assert cli.parse_args(["--status"]).status == ""
    assert cli.parse_args(["--status", "123"]).status == "123"
