"""SLURM host-list parsing and the defaults npurun derives under `srun npurun ...`."""
from __future__ import annotations

import pytest

from launcher.errors import ConfigError
from launcher.slurm import defaults, parse_nodelist


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-04]", ["node01", "node02", "node03", "node04"]),
    ("a[1,3-5],b2", ["a1", "a3", "a4", "a5", "b2"]),
    ("n[001-002]-ib", ["n001-ib", "n002-ib"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"]),
    ("x[08-10]", ["x08", "x09", "x10"]),
    ("h1,h2, h3", ["h1", "h2", "h3"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
])
def test_parse_nodelist(text, hosts):
    assert parse_nodelist(text) == hosts


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", ["", "a[1-2", "a]1[", "a[2-1]", "a[x]", "a[1,,2]", "a[[1]]"])
def test_parse_nodelist_rejects_malformed(bad):
    with pytest.raises(ConfigError):
        parse_nodelist(bad)


SLURM = {"SLURM_JOB_NODELIST": "node[07-10]", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
         "SLURM_JOB_ID": "123456", "SLURM_LOCALID": "0"}


@pytest.mark.timeout(10)
def test_defaults_from_slurm_environment():
    d = defaults(SLURM)
    assert (d.nnodes, d.node_rank, d.master_addr) == (4, 2, "node07")
    assert d.master_port == 20000 + 123456 % 20000
    assert d.job_id == "123456"


@pytest.mark.timeout(10)
def test_no_defaults_outside_slurm_and_one_npurun_per_node():
    assert defaults({}) is None
    assert defaults({"SLURM_JOB_ID": "5"}) is None  # not inside a step on nodes
    with pytest.raises(ConfigError, match="ntasks-per-node=1"):
        defaults(dict(SLURM, SLURM_LOCALID="1"))
