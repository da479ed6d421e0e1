"""Operators' packaging, checked by real validators: the Kubernetes DaemonSet against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict), the systemd unit with
``systemd-analyze verify``, the Dockerfile's sources against the package layout, the
ClickHouse cluster configs against what ``ranksight.store.local_cluster`` renders (the
same config the cluster tests start), and the TOML files with ranksight's own reader."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ranksight.cli.settings import ConfigError, read_file
from ranksight.store.local_cluster import node_config_xml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _daemonset_docs() -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / "ranksight-agent.yaml").read_text()))


def test_daemonset_passes_the_kubernetes_schemas_strictly():
    docs = _daemonset_docs()
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    bad = {**docs[3], "spec": {**docs[3]["spec"], "hostPid": True}}  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


def test_daemonset_has_what_the_collectors_need(tmp_path):
    config_map, ds = _daemonset_docs()[2:]
    pod = ds["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert "SYS_PTRACE" in agent["securityContext"]["capabilities"]["add"]
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "nvidia.com/gpu" not in str(agent["resources"])  # sees every GPU, takes none
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (
        mounts["/sys"]["readOnly"] and volumes[mounts["/sys"]["name"]]["hostPath"]["path"] == "/sys"
    )
    spool = volumes[mounts["/var/lib/ranksight"]["name"]]["hostPath"]["path"]
    assert (
        env["RANKSIGHT_SPOOL_DIR"].startswith("/var/lib/ranksight")
        and spool == "/var/lib/ranksight"
    )
    toml = tmp_path / "ranksight.toml"
    toml.write_text(config_map["data"]["ranksight.toml"])
    got = read_file(str(toml))
    assert (
        got["store.url"].startswith("clickhouse://")
        and got["agent.spool"] == env["RANKSIGHT_SPOOL_DIR"]
    )


def test_systemd_unit_verifies(tmp_path):
    unit = (DEPLOY / "systemd" / "ranksight-agent.service").read_text()
    exe = shutil.which("ranksight")
    assert exe, "the ranksight console script is installed by pip install -e ."
    assert "ExecStart=/usr/local/bin/ranksight agent" in unit
    path = tmp_path / "ranksight-agent.service"
    path.write_text(unit.replace("/usr/local/bin/ranksight", exe))
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    broken = tmp_path / "broken.service"
    broken.write_text(unit.replace("/usr/local/bin/ranksight", "/nonexistent/ranksight"))
    out = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True)
    assert "nonexistent" in out.stderr  # the verifier does look at the command


def test_dockerfile_copies_every_package_folder():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    copied = {m.group(1) for m in re.finditer(r"^COPY (\S+) \S+$", text, re.M)}
    pyproject = (ROOT / "pyproject.toml").read_text()
    folders = set(re.findall(r'"ranksight[.a-z_]*" = "([a-z_]+)"', pyproject))
    assert folders and folders <= copied, folders - copied
    assert all((ROOT / c).exists() for c in copied), copied
    assert re.search(r"^ENTRYPOINT \[\"ranksight\"\]$", text, re.M) and 'CMD ["agent"]' in text


def test_cluster_configs_are_what_the_tested_cluster_runs():
    layout = [[(f"ch-s{s}r{r}.internal", 9000) for r in (1, 2)] for s in (1, 2)]
    zk = [(f"zk{i}.internal", 2181) for i in (1, 2, 3)]
    for s in (1, 2):
        for r in (1, 2):
            path = DEPLOY / "clickhouse" / "cluster" / f"config.d-s{s}r{r}.xml"
            text = path.read_text()
            assert text == node_config_xml(
                "ranksight", layout, s, r, 9009, zk, f"ch-s{s}r{r}.internal"
            )
            root = ET.fromstring(text)
            assert root.find("macros/shard").text == str(s)
            assert len(root.findall("remote_servers/ranksight/shard")) == 2
            assert len(root.findall("zookeeper/node")) == 3


def test_example_config_file_reads(tmp_path):
    got = read_file(str(DEPLOY / "ranksight.toml"))
    assert got["store.url"].startswith("clickhouse://") and got["agent.buffer_mb"] == 4096
    bad = tmp_path / "bad.toml"
    bad.write_text('[agent]\ninterval_s = "soon"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: agent.interval_s: want float, got 'soon'"):
        read_file(str(bad))
