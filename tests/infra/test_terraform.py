"""Offline infra checks. Every .tf parses and is `terraform fmt`-clean; every root and module whose
providers are in the offline mirror passes `terraform validate`; our own rules hold, and each rule
has a fixture that breaks it (a one-line edit of a copy of the repo) and is caught; checkov passes
with only the documented skips. No cloud is needed.

The rules: MLflow authenticated (basic-auth app, credentials from Kubernetes
secrets, jobs' credential in the Ray pods' environment); NetworkPolicies (namespace default-deny,
MLflow 5000 from Ray pods only, Ray ports among Ray pods and the operator's 8265) and their
enforcement (the VPC CNI's network-policy agent); GPU groups that scale from zero (cluster-autoscaler,
NVIDIA device plugin, ASG template tags, a CPU group for drivers and parsing actors, a head with no
CPUs for tasks); one bucket (no bucket literal in the presets, models and corpora read-only to
jobs, and the preflight's S3 calls allowed by the job role's policy); teardown switches as
variables with safe defaults; two roots (AWS, then Kubernetes from the first's remote state); the
READMEs' order of commands.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import hcl2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
TF_FILES = sorted(p for p in (INFRA / "terraform").rglob("*.tf") if ".terraform" not in p.parts)
WORLD = {"0.0.0.0/0", "::/0"}
SENSITIVE_PORTS = {6379, 8265, 10001, 5000, 5432, 22}
RAY_LABEL = {"app.kubernetes.io/part-of": "sieve-ray"}


def unquote(x):
    """python-hcl2 8 keeps HCL string quotes (and marks blocks): normalise to plain values."""
    if isinstance(x, dict):
        return {unquote(k): unquote(v) for k, v in x.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(x, list):
        return [unquote(v) for v in x]
    if isinstance(x, str) and len(x) >= 2 and x[0] == x[-1] == '"':
        return x[1:-1]
    return x


def parse(path: Path) -> dict:
    with open(path) as fh:
        return unquote(hcl2.load(fh))


def all_docs(root: Path = INFRA / "terraform") -> dict[Path, dict]:
    return {p: parse(p) for p in sorted(root.rglob("*.tf")) if ".terraform" not in p.parts}


def resources(docs: dict[Path, dict], rtype: str) -> list[tuple[str, dict]]:
    out = []
    for doc in docs.values():
        for block in doc.get("resource", []):
            for t, named in block.items():
                if t == rtype:
                    out += list(named.items())
    return out


def resource(docs: dict[Path, dict], rtype: str, name: str) -> dict | None:
    return dict(resources(docs, rtype)).get(name)


def variables(docs: dict[Path, dict]) -> dict[str, dict]:
    return {n: v for doc in docs.values() for block in doc.get("variable", []) for n, v in block.items()}


def tf(repo: Path, *parts: str) -> dict[Path, dict]:
    return all_docs(repo.joinpath("infra", "terraform", *parts))


def world_open_ingress(docs: dict[Path, dict]) -> list[str]:
    """No security group ingress (inline or rule resource) open to the world, on any port."""
    bad = []

    def cidrs(block: dict) -> set[str]:
        vals = []
        for key in ("cidr_blocks", "ipv6_cidr_blocks", "cidr_ipv4", "cidr_ipv6"):
            v = block.get(key)
            vals += v if isinstance(v, list) else [v] if v else []
        return set(vals)

    for name, sg in resources(docs, "aws_security_group"):
        for ing in sg.get("ingress", []) or []:
            if cidrs(ing) & WORLD:
                bad.append(f"aws_security_group.{name} ports {ing.get('from_port')}-{ing.get('to_port')}")
    for rtype in ("aws_security_group_rule", "aws_vpc_security_group_ingress_rule"):
        for name, rule in resources(docs, rtype):
            if rule.get("type", "ingress") == "ingress" and cidrs(rule) & WORLD:
                bad.append(f"{rtype}.{name} ports {rule.get('from_port')}-{rule.get('to_port')}")
    return bad


def default_groups(repo: Path) -> tuple[list[dict], dict]:
    """The Ray GPU worker groups and the CPU worker group as the k8s root applies them by default."""
    k8s = variables(tf(repo, "envs", "prod", "k8s"))
    return k8s["ray_gpu_worker_groups"]["default"], k8s["ray_cpu_worker_group"]["default"]


# KubeRay's default readiness and liveness probe of every Ray pod (ray-operator/controllers/ray/utils/constant.go,
# BaseWgetHealthCommand; v1.4.2: "wget -T 2 -q -O- http://localhost:%d/%s | grep success"). grep is one of
# Ubuntu's Essential packages, in every image; the rest must be installed.
KUBERAY_PROBE = "wget -T 2 -q -O- http://localhost:%d/%s | grep success"
ESSENTIAL = {"grep"}


def rule_probe_binaries_in_the_image(repo: Path) -> list[str]:
    """Every program KubeRay's default probes run is installed by infra/Dockerfile: a probe that cannot run
    fails, and the pods never become Ready."""
    docker = (repo / "infra" / "Dockerfile").read_text()
    installed = {
        pkg
        for m in re.finditer(r"apt-get install -y --no-install-recommends ([^\\&\n]+)", docker)
        for pkg in m.group(1).split()
    }
    programs = {part.split()[0] for part in KUBERAY_PROBE.split("|")}
    return [
        f"infra/Dockerfile installs no {p} (KubeRay's probes run it)"
        for p in sorted(programs - installed - ESSENTIAL)
    ]


def rule_autoscaler_has_the_token(repo: Path) -> list[str]:
    """With token auth on, the in-tree autoscaler sidecar carries the token the Ray containers carry (the pinned
    KubeRay gives it none): refused by the GCS, it never asks for a worker pod and a cluster at zero stays there."""
    spec = ray_template(repo)["spec"]
    if not spec.get("enableInTreeAutoscaling"):
        return []
    head_env = env_of(spec["headGroupSpec"]["template"])
    env = {e["name"]: e for e in (spec.get("autoscalerOptions") or {}).get("env", [])}
    bad = []
    if env.get("RAY_AUTH_MODE", {}).get("value") != "token":
        bad.append("the autoscaler sidecar's env does not set RAY_AUTH_MODE=token")
    if env.get("RAY_AUTH_TOKEN", {}).get("valueFrom") != head_env.get("RAY_AUTH_TOKEN", {}).get("valueFrom"):
        bad.append("the autoscaler sidecar's env does not carry the Ray containers' RAY_AUTH_TOKEN")
    return bad


def rule_crds_applied_before_their_manifests(repo: Path) -> list[str]:
    """A ``kubernetes_manifest`` needs its kind's CRD when it is planned; where the CRD comes from a Helm release of
    the same root (the RayCluster's from the KubeRay operator), infra/README.md applies that release alone
    (``-target=``) before the root's first plan, or the first apply fails."""
    k8s = tf(repo, "envs", "prod", "k8s")
    modules = {
        name: Path(block["source"]).name
        for doc in k8s.values()
        for entry in doc.get("module", [])
        for name, block in entry.items()
    }
    readme = (repo / "infra" / "README.md").read_text().splitlines()
    start = next(
        (i for i, line in enumerate(readme) if line.startswith("cd infra/terraform/envs/prod/k8s")), 0
    )
    first_plan = next(
        (i for i in range(start, len(readme)) if readme[i].startswith("terraform plan")), len(readme)
    )
    bad = []
    for module, folder in modules.items():
        for name, manifest in resources(tf(repo, "modules", folder), "kubernetes_manifest"):
            for dep in manifest.get("depends_on", []):
                release = re.fullmatch(r"\$\{(helm_release\.\w+)\}", dep)
                target = f"-target=module.{module}.{release.group(1)}" if release else None
                if target and not any(target in line for line in readme[start:first_plan]):
                    bad.append(
                        f"infra/README.md: no `terraform apply {target}` before the first plan ({name})"
                    )
    return bad


def rule_gpu_sweeps_set_their_concurrency(repo: Path) -> list[str]:
    """A sweep left to derive its concurrency reads the nodes up when it starts - on a cluster scaled to zero,
    one trial at a time. Every GPU sweep preset sets ``sweep.max_concurrent_trials``, which the default GPU
    groups hold at their maximum."""
    gpu_groups, _ = default_groups(repo)
    gpus = sum(int(g["max"]) * int(g["gpus"]) for g in gpu_groups)
    bad = []
    for path in sorted((repo / "configs").glob("*_sweep/*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        base = yaml.safe_load((repo / doc["base"]).read_text()) if doc.get("base") else {}
        scaling = (base or {}).get("scaling") or {}
        if not scaling.get("use_gpu"):
            continue
        n, workers = (doc.get("sweep") or {}).get("max_concurrent_trials"), int(scaling.get("num_workers", 1))
        where = path.relative_to(repo)
        if n is None:
            bad.append(
                f"{where}: a GPU sweep without sweep.max_concurrent_trials (one trial at a time from zero)"
            )
        elif n * workers > gpus:
            bad.append(f"{where}: {n} trials × {workers} GPUs, but the default GPU groups reach {gpus} GPUs")
    return bad


def rule_presets_fit_the_worker_pods(repo: Path) -> list[str]:
    """Every GPU preset's worker (``scaling.cpus_per_worker`` CPUs + 1 GPU) fits a pod of a default Ray GPU
    worker group, which offers the CPUs of its container limit: a worker no pod can hold leaves Ray Train
    waiting for a placement group that never comes, and retrying for ever."""
    gpu_groups, _ = default_groups(repo)
    bad = []
    for path in sorted((repo / "configs").rglob("*.yaml")):
        scaling = (yaml.safe_load(path.read_text()) or {}).get("scaling") or {}
        if not scaling.get("use_gpu"):
            continue
        cpus = float(scaling.get("cpus_per_worker", 1))
        if not any(float(g["cpus"]) >= cpus and int(g["gpus"]) >= 1 for g in gpu_groups):
            offered = ", ".join(f"{g['name']}: {g['cpus']} CPUs" for g in gpu_groups)
            bad.append(
                f"{path.relative_to(repo)}: a worker asks {cpus:g} CPUs + 1 GPU; the default pods offer {offered}"
            )
    return bad


def ray_template(repo: Path) -> dict:
    """The RayCluster manifest rendered with the k8s root's default groups, its first GPU group alone
    (Terraform's templatefile, by hand)."""
    text = (repo / "infra" / "k8s" / "raycluster.yaml.tftpl").read_text()
    loop = re.search(r"%\{ for g in gpu_groups ~\}\n(.*?)%\{ endfor ~\}\n", text, re.S)
    gpu, cpu = default_groups(repo)
    gpu = gpu[0]
    body = text.replace(loop.group(0), loop.group(1)) if loop else text
    for prefix, values in (("g", gpu), ("cpu_group", cpu)):
        for k, v in values.items():
            body = body.replace("${" + f"{prefix}.{k}" + "}", str(v))
    for k in ("name", "namespace", "image", "token_secret", "tracking_uri", "mlflow_secret", "storage_uri"):
        body = body.replace("${" + k + "}", f"x-{k}")
    return yaml.safe_load(body)


def pod_specs(manifest: dict) -> list[tuple[str, dict, dict]]:
    """(group, rayStartParams, pod template) for the head and every worker group."""
    spec = manifest["spec"]
    out = [("head", spec["headGroupSpec"]["rayStartParams"], spec["headGroupSpec"]["template"])]
    out += [(g["groupName"], g.get("rayStartParams") or {}, g["template"]) for g in spec["workerGroupSpecs"]]
    return out


def env_of(template: dict) -> dict[str, dict]:
    return {e["name"]: e for e in template["spec"]["containers"][0].get("env", [])}


# ---------------------------------------------------------------- the rules (repo root → problems)
def rule_mlflow_authenticated(repo: Path) -> list[str]:
    bad = []
    docs = tf(repo, "modules", "mlflow")
    dep = resource(docs, "kubernetes_deployment_v1", "mlflow")
    container = dep["spec"][0]["template"][0]["spec"][0]["container"][0]
    if "/app/infra/mlflow/serve.py" not in json.dumps(container.get("command")):
        bad.append("MLflow does not start through infra/mlflow/serve.py (the basic-auth entrypoint)")
    # the credential variables: a dynamic env block over local.secret_env, each a secret_key_ref
    from_secrets = [
        d["env"]
        for d in container.get("dynamic", [])
        if "env" in d and "secret_key_ref" in json.dumps(d["env"]["content"])
    ]
    secret_env = (
        {}
        if not from_secrets or from_secrets[0]["for_each"] != "${local.secret_env}"
        else next(
            (b["secret_env"] for doc in docs.values() for b in doc.get("locals", []) if "secret_env" in b), {}
        )
    )
    plain = {e["name"] for e in container.get("env", [])}
    for name in (
        "MLFLOW_AUTH_ADMIN_USERNAME",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
        "SIEVE_JOBS_USERNAME",
        "SIEVE_JOBS_PASSWORD",
    ):
        ref = secret_env.get(name, {})
        if name in plain or not str(ref.get("secret", "")).startswith("${kubernetes_secret_v1."):
            bad.append(f"MLflow's {name} does not come from a Kubernetes secret")
    serve = (repo / "infra" / "mlflow" / "serve.py").read_text()
    if '"basic-auth"' not in serve:
        bad.append("serve.py does not run MLflow's basic-auth app")
    for group, _, template in pod_specs(ray_template(repo)):
        env = env_of(template)
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "RAY_AUTH_TOKEN"):
            if "secretKeyRef" not in env.get(name, {}).get("valueFrom", {}):
                bad.append(f"Ray group {group}: {name} is not read from a secret")
        if env.get("RAY_AUTH_MODE", {}).get("value") != "token":
            bad.append(f"Ray group {group}: token auth is off")
    return bad


def rule_network_policies(repo: Path) -> list[str]:
    bad = []
    k8s = tf(repo, "envs", "prod", "k8s")
    deny = [
        p
        for _, p in resources(k8s, "kubernetes_network_policy_v1")
        if p["spec"][0]["pod_selector"] == [{}]
        and not p["spec"][0].get("ingress")
        and "Ingress" in p["spec"][0].get("policy_types", [])
    ]
    if not deny:
        bad.append("no default-deny ingress policy in the namespace")
    pol = resource(tf(repo, "modules", "mlflow"), "kubernetes_network_policy_v1", "mlflow")
    if pol is None:
        bad.append("no NetworkPolicy selects MLflow")
    else:
        spec = pol["spec"][0]
        rules = spec.get("ingress", [])
        ports = [p["port"] for r in rules for p in r.get("ports", [])]
        froms = [f for r in rules for f in r.get("from", [])]
        if spec["pod_selector"] != [{"match_labels": {"app": "mlflow"}}] or len(rules) != 1:
            bad.append("the MLflow policy must select app=mlflow with one ingress rule")
        if ports != ["${tostring(local.port)}"]:
            bad.append(f"the MLflow policy admits ports {ports}, not 5000 alone")
        if not froms or any(set(f) != {"pod_selector"} for f in froms):
            bad.append("the MLflow policy admits more than pods")
        mod = tf(repo, "modules", "mlflow")
        part_of = variables(mod).get("client_part_of", {}).get("default")
        if part_of != RAY_LABEL["app.kubernetes.io/part-of"]:
            bad.append(f"the MLflow policy admits part-of={part_of}, not the Ray pods' label")
    ray = resource(tf(repo, "modules", "ray"), "kubernetes_network_policy_v1", "ray")
    if ray is None:
        bad.append("no NetworkPolicy selects the Ray pods")
    else:
        for r in ray["spec"][0].get("ingress", []):
            for f in r.get("from", []):
                ok = f.get("pod_selector") == [{"match_labels": RAY_LABEL}] or (
                    f.get("namespace_selector")
                    == [{"match_labels": {"kubernetes.io/metadata.name": "kuberay-system"}}]
                    and [p["port"] for p in r.get("ports", [])] == ["8265"]
                )
                if not ok or "ip_block" in f:
                    bad.append(f"the Ray policy admits {f}")
    for group, _, template in pod_specs(ray_template(repo)):
        if template["metadata"]["labels"].get("app.kubernetes.io/part-of") != "sieve-ray":
            bad.append(f"Ray group {group} lacks the label the policies select")
    addon = resource(tf(repo, "modules", "eks"), "aws_eks_addon", "vpc_cni")
    if addon is None or 'enableNetworkPolicy = "true"' not in addon.get("configuration_values", ""):
        bad.append("nothing enforces NetworkPolicies (vpc-cni's enableNetworkPolicy is off)")
    return bad


def rule_gpu_from_zero(repo: Path) -> list[str]:
    bad = []
    helm = dict(resources(tf(repo, "modules", "cluster_addons"), "helm_release"))
    for name, chart in (
        ("cluster_autoscaler", "cluster-autoscaler"),
        ("nvidia_device_plugin", "nvidia-device-plugin"),
    ):
        rel = helm.get(name)
        if rel is None or rel.get("chart") != chart:
            bad.append(f"{chart} is not installed")
        elif not str(rel.get("version", "")).startswith("${var."):
            bad.append(f"{chart}'s chart version is not pinned by a variable")
    addon_vars = variables(tf(repo, "modules", "cluster_addons"))
    for v in ("cluster_autoscaler_chart_version", "nvidia_device_plugin_chart_version"):
        if not re.fullmatch(r"\d+\.\d+\.\d+", str(addon_vars.get(v, {}).get("default", ""))):
            bad.append(f"{v} has no exact default version")
    eks = tf(repo, "modules", "eks")
    locals_ = json.dumps([b for doc in eks.values() for b in doc.get("locals", [])])
    for tag in (
        "node-template/resources/nvidia.com/gpu",
        "node-template/label/sieve/role",
        "node-template/taint/nvidia.com/gpu",
    ):
        if tag not in locals_:
            bad.append(f"no scale-from-zero ASG tag {tag}")
    if resource(eks, "aws_autoscaling_group_tag", "scale_from_zero") is None:
        bad.append("the scale-from-zero tags are not applied to the ASGs")
    cpu = resource(eks, "aws_eks_node_group", "cpu")
    if cpu is None or cpu.get("labels", {}).get("sieve/role") != "cpu":
        bad.append("no CPU node group labelled sieve/role=cpu")
    for name in ("gpu", "cpu"):
        ng = resource(eks, "aws_eks_node_group", name) or {}
        if "desired_size" not in json.dumps(ng.get("lifecycle", [])):
            bad.append(f"node group {name}: Terraform would reset the autoscaler's desired size")
    groups = variables(eks).get("gpu_node_groups", {}).get("default", {})
    if any(g.get("min_size") != 0 for g in groups.values()):
        bad.append("a default GPU node group does not start from zero")
    groups = {g: (params, t) for g, params, t in pod_specs(ray_template(repo))}
    if str(groups["head"][0].get("num-cpus")) != "0":
        bad.append("the Ray head takes tasks (num-cpus is not 0)")
    cpu_groups = [
        g for g, (_, t) in groups.items() if t["spec"].get("nodeSelector", {}).get("sieve/role") == "cpu"
    ]
    if not cpu_groups:
        bad.append("no Ray worker group on the CPU nodes")
    for g, (_, t) in groups.items():
        if g.startswith("gpu-"):
            tol = t["spec"].get("tolerations", [])
            gpus = t["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
            if not any(x.get("key") == "nvidia.com/gpu" for x in tol) or not gpus:
                bad.append(f"Ray group {g} neither tolerates the GPU taint nor asks for a GPU")
    return bad


def bucket_access(repo: Path) -> dict[str, dict[str, list[str]]]:
    return variables(tf(repo, "modules", "eks"))["bucket_access"]["default"]


def rule_one_bucket(repo: Path) -> list[str]:
    bad = []
    access = bucket_access(repo)
    ray = access.get("ray", {})
    for prefix in ("models/", "corpora/"):
        if any(fnmatch.fnmatch(prefix + "x", p) for p in ray.get("read_write", [])):
            bad.append(f"jobs may write {prefix}")
        if not any(fnmatch.fnmatch(prefix + "x", p) for p in ray.get("read_only", [])):
            bad.append(f"jobs may not read {prefix}")
    if ray.get("read_write") != ["runs/*"]:
        bad.append(f"jobs write {ray.get('read_write')}, not runs/ alone")
    if access.get("mlflow", {}).get("read_write") != ["mlflow/*"]:
        bad.append("the MLflow server's prefix is not mlflow/ alone")
    for p in sorted((repo / "configs").rglob("*.yaml")):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"s3://(?!\$\{SIEVE_STORAGE\})", line.split("#")[0]):
                bad.append(f"{p.relative_to(repo)}:{i} names a bucket instead of ${{SIEVE_STORAGE}}")
    template = (repo / "infra" / "k8s" / "raycluster.yaml.tftpl").read_text()
    if "name: SIEVE_STORAGE" not in template:
        bad.append("the Ray pods do not get SIEVE_STORAGE")
    return bad


def rule_teardown_switches(repo: Path) -> list[str]:
    bad = []
    aws = variables(tf(repo, "envs", "prod", "aws"))
    for name, safe in (("deletion_protection", True), ("force_destroy", False)):
        v = aws.get(name)
        if v is None or v.get("type") not in ("bool", "${bool}") or v.get("default") is not safe:
            bad.append(f"variable {name} (bool, default {safe}) missing in the aws root")
    db = resource(tf(repo, "modules", "mlflow_db"), "aws_db_instance", "this") or {}
    if db.get("deletion_protection") != "${var.deletion_protection}":
        bad.append(
            f"the database's deletion_protection is {db.get('deletion_protection')!r}, not the variable"
        )
    bucket = resource(tf(repo, "modules", "storage"), "aws_s3_bucket", "this") or {}
    if bucket.get("force_destroy") != "${var.force_destroy}":
        bad.append(f"the bucket's force_destroy is {bucket.get('force_destroy')!r}, not the variable")
    readme = (repo / "infra" / "README.md").read_text()
    order = [
        readme.find(s)
        for s in (
            "terraform -chdir=infra/terraform/envs/prod/k8s destroy",
            "force_destroy=true",
            "terraform -chdir=infra/terraform/envs/prod/aws destroy",
        )
    ]
    if -1 in order or order != sorted(order):
        bad.append("infra/README.md does not tear down k8s, then switch protection off, then aws")
    return bad


def providers_of(docs: dict[Path, dict]) -> set[str]:
    return {
        name
        for doc in docs.values()
        for t in doc.get("terraform", [])
        for block in t.get("required_providers", [])
        for name in block
    }


def module_sources(root_docs: dict[Path, dict]) -> list[str]:
    return [
        m["source"] for doc in root_docs.values() for block in doc.get("module", []) for m in block.values()
    ]


def rule_two_roots(repo: Path) -> list[str]:
    bad = []
    envs = repo / "infra" / "terraform" / "envs" / "prod"
    aws, k8s = all_docs(envs / "aws"), all_docs(envs / "k8s")
    if providers_of(aws) != {"aws"}:
        bad.append(f"the aws root needs providers {sorted(providers_of(aws))}, not aws alone")
    if "aws" in providers_of(k8s) or any(
        "aws" in block for d in k8s.values() for block in d.get("provider", [])
    ):
        bad.append("the k8s root configures the aws provider")
    if not any("terraform_remote_state" in json.dumps(d.get("data", [])) for d in k8s.values()):
        bad.append("the k8s root does not read the aws root's remote state")
    for root, docs, forbidden in (("aws", aws, ("kubernetes_", "helm_")), ("k8s", k8s, ("aws_",))):
        for src in module_sources(docs):
            mod = all_docs((envs / root / src).resolve())
            types = {t for doc in mod.values() for block in doc.get("resource", []) for t in block}
            if any(t.startswith(forbidden) for t in types):
                bad.append(
                    f"the {root} root's module {src} has {sorted(t for t in types if t.startswith(forbidden))}"
                )
    return bad


def rule_readme_local_ray(repo: Path) -> list[str]:
    bad = []
    text = (repo / "README.md").read_text()
    start = text.find("ray start --head")
    export = text.find("export RAY_AUTH_MODE=token")
    if start == -1 or export == -1 or export > start:
        bad.append("README: RAY_AUTH_MODE=token is not exported before `ray start`")
    line = text[start : text.find("\n", start)] if start != -1 else ""
    if "--node-ip-address=127.0.0.1" not in line or "--dashboard-host=127.0.0.1" not in line:
        bad.append(f"README: `{line}` does not bind to 127.0.0.1")
    return bad


RULES: dict[str, Callable[[Path], list[str]]] = {
    "mlflow_authenticated": rule_mlflow_authenticated,
    "network_policies": rule_network_policies,
    "gpu_from_zero": rule_gpu_from_zero,
    "one_bucket": rule_one_bucket,
    "teardown_switches": rule_teardown_switches,
    "two_roots": rule_two_roots,
    "readme_local_ray": rule_readme_local_ray,
    "presets_fit_the_worker_pods": rule_presets_fit_the_worker_pods,
    "probe_binaries_in_the_image": rule_probe_binaries_in_the_image,
    "autoscaler_has_the_token": rule_autoscaler_has_the_token,
    "crds_applied_before_their_manifests": rule_crds_applied_before_their_manifests,
    "gpu_sweeps_set_their_concurrency": rule_gpu_sweeps_set_their_concurrency,
}

# (rule, file, text, replacement): each edit alone breaks the rule and must be caught.
BREAKS = [
    (
        "gpu_sweeps_set_their_concurrency",
        "configs/tsdae_sweep/paper.yaml",
        "max_concurrent_trials: 4",
        "num_samples: 2",
    ),
    (
        "gpu_sweeps_set_their_concurrency",
        "configs/sifter_sweep/paper.yaml",
        "max_concurrent_trials: 4",
        "max_concurrent_trials: 5",
    ),
    (
        "crds_applied_before_their_manifests",
        "infra/README.md",
        'terraform apply -var "image=$IMAGE" -var "state_bucket=$TFSTATE" -target=module.ray.helm_release.kuberay\n',
        "",
    ),
    (
        "autoscaler_has_the_token",
        "infra/k8s/raycluster.yaml.tftpl",
        "      - name: RAY_AUTH_TOKEN\n        valueFrom:\n          secretKeyRef:\n            name: ${token_secret}\n"
        "            key: token\n",
        "",
    ),
    ("probe_binaries_in_the_image", "infra/Dockerfile", "ca-certificates wget", "ca-certificates"),
    (
        "presets_fit_the_worker_pods",
        "configs/sifter_simcse/paper.yaml",
        "cpus_per_worker: 6",
        "cpus_per_worker: 8",
    ),
    (
        "presets_fit_the_worker_pods",
        "infra/terraform/envs/prod/k8s/variables.tf",
        'gpus = 1, cpus = 7, memory = "28Gi"',
        'gpus = 1, cpus = 5, memory = "28Gi"',
    ),
    (
        "mlflow_authenticated",
        "infra/terraform/modules/mlflow/main.tf",
        'command = ["python", "/app/infra/mlflow/serve.py",',
        'command = ["mlflow", "server",',
    ),
    ("mlflow_authenticated", "infra/mlflow/serve.py", '"basic-auth"', '"no-auth"'),
    (
        "mlflow_authenticated",
        "infra/terraform/modules/mlflow/main.tf",
        '    MLFLOW_AUTH_ADMIN_PASSWORD     = { secret = kubernetes_secret_v1.admin.metadata[0].name, key = "password" }\n',
        "",
    ),
    (
        "mlflow_authenticated",
        "infra/k8s/raycluster.yaml.tftpl",
        "              - name: MLFLOW_TRACKING_PASSWORD\n                valueFrom:\n                  secretKeyRef:\n"
        "                    name: ${mlflow_secret}\n                    key: password\n",
        "",
    ),
    (
        "network_policies",
        "infra/terraform/envs/prod/k8s/main.tf",
        'policy_types = ["Ingress"]',
        'policy_types = ["Egress"]',
    ),
    (
        "network_policies",
        "infra/terraform/modules/mlflow/main.tf",
        "port     = tostring(local.port)",
        'port     = "1-65535"',
    ),
    ("network_policies", "infra/terraform/modules/mlflow/variables.tf", '"sieve-ray"', '"sieve-any"'),
    ("network_policies", "infra/terraform/modules/ray/main.tf", 'port     = "8265"', 'port     = "6379"'),
    (
        "network_policies",
        "infra/terraform/modules/eks/main.tf",
        'enableNetworkPolicy = "true"',
        'enableNetworkPolicy = "false"',
    ),
    (
        "network_policies",
        "infra/k8s/raycluster.yaml.tftpl",
        "      template:\n        metadata:\n          labels:\n            app.kubernetes.io/part-of: sieve-ray\n",
        "      template:\n        metadata:\n          labels:\n            app: other\n",
    ),
    (
        "gpu_from_zero",
        "infra/terraform/modules/cluster_addons/main.tf",
        'chart            = "nvidia-device-plugin"',
        'chart            = "something-else"',
    ),
    (
        "gpu_from_zero",
        "infra/terraform/modules/eks/main.tf",
        "node-template/resources/nvidia.com/gpu",
        "node-template/gpu",
    ),
    ("gpu_from_zero", "infra/k8s/raycluster.yaml.tftpl", 'num-cpus: "0"', 'num-cpus: "4"'),
    (
        "gpu_from_zero",
        "infra/k8s/raycluster.yaml.tftpl",
        "            sieve/role: cpu\n",
        "            sieve/role: system\n",
    ),
    (
        "gpu_from_zero",
        "infra/terraform/modules/eks/main.tf",
        'labels = { "sieve/role" = "cpu" }',
        'labels = { "sieve/role" = "gpu" }',
    ),
    (
        "one_bucket",
        "infra/terraform/modules/eks/variables.tf",
        'read_write = ["runs/*"], read_only = ["models/*", "corpora/*"]',
        'read_write = ["runs/*", "models/*"], read_only = ["corpora/*"]',
    ),
    ("one_bucket", "configs/simcse/paper.yaml", "${SIEVE_STORAGE}/models", "s3://sieve-models"),
    (
        "teardown_switches",
        "infra/terraform/modules/mlflow_db/main.tf",
        "deletion_protection                 = var.deletion_protection",
        "deletion_protection                 = true",
    ),
    (
        "teardown_switches",
        "infra/terraform/modules/storage/main.tf",
        "force_destroy = var.force_destroy",
        "force_destroy = false",
    ),
    (
        "teardown_switches",
        "infra/terraform/envs/prod/aws/variables.tf",
        "  default     = false\n",
        "  default     = true\n",
    ),
    (
        "two_roots",
        "infra/terraform/envs/prod/aws/versions.tf",
        'aws = { source = "hashicorp/aws"',
        'kubernetes = { source = "hashicorp/kubernetes", version = "~> 2.35" }\n    aws = { source = "hashicorp/aws"',
    ),
    (
        "two_roots",
        "infra/terraform/envs/prod/k8s/main.tf",
        'source              = "../../../modules/cluster_addons"',
        'source              = "../../../modules/eks"',
    ),
    ("readme_local_ray", "README.md", "--node-ip-address=127.0.0.1", "--node-ip-address=0.0.0.0"),
]


def repo_copy(tmp: Path) -> Path:
    """The parts of the repository the rules read."""
    for part in ("infra", "configs"):
        shutil.copytree(ROOT / part, tmp / part, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    shutil.copy(ROOT / "README.md", tmp / "README.md")
    return tmp


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_holds(rule):
    assert RULES[rule](ROOT) == []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return repo_copy(tmp_path_factory.mktemp("repo"))


@pytest.mark.parametrize(
    ("rule", "path", "old", "new"), BREAKS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BREAKS)]
)
def test_each_rule_catches_its_breaking_fixture(rule, path, old, new, pristine, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(pristine, repo)
    target = repo / path
    text = target.read_text()
    assert text.count(old) >= 1, f"{path}: the fixture's text is gone - update the fixture"
    target.write_text(text.replace(old, new, 1))
    assert RULES[rule](repo), f"{rule} missed: {path}: {old!r} -> {new!r}"


def test_every_rule_has_a_breaking_fixture():
    assert {b[0] for b in BREAKS} == set(RULES)


# ---------------------------------------------------------------- the preflight under the job role's policy
def allowed_by_policy(operation: str, params: dict, access: dict[str, list[str]]) -> bool:
    """What the ray role's bucket policy (infra/terraform/modules/eks, aws_iam_role_policy.bucket)
    grants: ListBucket when s3:prefix matches a pattern (IAM's StringLike: `*` also matches nothing),
    GetObject on read-write or read-only keys, writes on read-write keys, nothing else."""
    rw, ro = access["read_write"], access["read_only"]
    match = lambda key, patterns: any(fnmatch.fnmatchcase(key, p) for p in patterns)  # noqa: E731
    if operation in ("ListObjectsV2", "ListObjects"):
        return match(params.get("Prefix", ""), rw + ro)
    if operation in ("GetObject", "HeadObject"):
        return match(params["Key"], rw + ro)
    if operation in (
        "PutObject",
        "DeleteObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
        "CopyObject",
    ):
        return match(params["Key"], rw)
    return False  # HeadBucket, GetBucketLocation, ...: not granted


def test_preflight_s3_calls_are_allowed_by_the_job_role(s3_bucket, tiny_bert_dir, monkeypatch, tmp_path):
    """The preflight's S3 calls, recorded from a real S3-compatible endpoint, checked against the
    policy the infra grants the Ray pods: the run storage under runs/ and a source model under
    models/ pass; a run storage at the bucket root is refused (listing "" matches no prefix),
    which the test proves the checker sees."""
    from orchestrator import storage
    from orchestrator.models import resolve_model_source

    calls: list[tuple[str, dict]] = []
    real = storage.s3_client

    def recording():
        client = real()
        client.meta.events.register(
            "provide-client-params.s3.*", lambda params, model, **_: calls.append((model.name, dict(params)))
        )
        return client

    monkeypatch.setattr(storage, "s3_client", recording)
    bucket = s3_bucket.removeprefix("s3://").split("/")[0]
    storage.put_dir(str(tiny_bert_dir), f"s3://{bucket}/models/tiny-bert")
    calls.clear()
    storage.check_access(f"s3://{bucket}/runs")
    resolve_model_source(f"s3://{bucket}/models/tiny-bert", cache_dir=tmp_path / "cache")
    access = bucket_access(ROOT)["ray"]
    assert calls and {op for op, _ in calls} <= {"ListObjectsV2", "GetObject", "HeadObject"}, calls
    denied = [(op, p) for op, p in calls if not allowed_by_policy(op, p, access)]
    assert denied == [], denied
    calls.clear()
    storage.check_access(f"s3://{bucket}")
    assert [op for op, p in calls if not allowed_by_policy(op, p, access)] == ["ListObjectsV2"]


# ---------------------------------------------------------------- the original security rules
def test_every_tf_file_parses():
    assert len(TF_FILES) >= 25
    for p in TF_FILES:
        parse(p)


def test_no_ingress_open_to_the_world():
    assert world_open_ingress(all_docs()) == []


def test_rule_catches_a_deliberately_opened_dashboard(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "main.tf").write_text("""
resource "aws_security_group" "ray" {
  name = "ray"
  ingress {
    from_port   = 8265
    to_port     = 8265
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}
resource "aws_vpc_security_group_ingress_rule" "gcs" {
  security_group_id = "sg-1"
  cidr_ipv6         = "::/0"
  from_port         = 6379
  to_port           = 6379
  ip_protocol       = "tcp"
}
""")
    assert world_open_ingress(all_docs(bad)) == [
        "aws_security_group.ray ports 8265-8265",
        "aws_vpc_security_group_ingress_rule.gcs ports 6379-6379",
    ]


def test_sensitive_ports_only_from_inside():
    for name, rule in resources(all_docs(), "aws_vpc_security_group_ingress_rule"):
        if rule.get("from_port") in SENSITIVE_PORTS:
            assert "referenced_security_group_id" in rule, (
                f"{name}: a sensitive port must come from a security group"
            )


def test_bucket_private_encrypted_tls_only_versioned():
    docs = all_docs()
    ((_, pab),) = resources(docs, "aws_s3_bucket_public_access_block")
    assert all(
        pab[k] is True
        for k in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets")
    )
    ((_, sse),) = resources(docs, "aws_s3_bucket_server_side_encryption_configuration")
    default = sse["rule"][0]["apply_server_side_encryption_by_default"][0]
    assert default["sse_algorithm"] == "aws:kms" and "kms_master_key_id" in default
    ((_, ver),) = resources(docs, "aws_s3_bucket_versioning")
    assert ver["versioning_configuration"][0]["status"] == "Enabled"
    ((_, pol),) = resources(docs, "aws_s3_bucket_policy")
    assert "aws:SecureTransport" in json.dumps(pol) and "Deny" in json.dumps(pol)
    ((_, lc),) = resources(docs, "aws_s3_bucket_lifecycle_configuration")
    assert any(r.get("expiration") for r in lc["rule"])


def test_database_encrypted_private_and_password_never_in_state():
    docs = all_docs()
    ((_, db),) = resources(docs, "aws_db_instance")
    assert db["storage_encrypted"] is True and db["publicly_accessible"] is False and "kms_key_id" in db
    assert "password_wo" in db and "password" not in db  # write-only: the password never reaches the state
    ((_, secret),) = resources(docs, "aws_secretsmanager_secret")
    assert "kms_key_id" in secret
    ((_, version),) = resources(docs, "aws_secretsmanager_secret_version")
    assert "secret_string_wo" in version and "secret_string" not in version


def test_every_variable_has_type_and_description():
    constrained = {
        "cidr_block",
        "az_count",
        "bucket_name",
        "checkpoint_retention_days",
        "kubernetes_version",
        "public_api_cidrs",
        "gpu_node_groups",
        "image",
        "storage_uri",
        "kuberay_chart_version",
        "gpu_worker_groups",
        "bucket_access",
        "vpc_cni_version",
    }
    seen_validated = set()
    for p, doc in all_docs().items():
        for block in doc.get("variable", []):
            for name, v in block.items():
                assert "type" in v, f"{p}: variable {name} has no type"
                assert v.get("description"), f"{p}: variable {name} has no description"
                if v.get("validation"):
                    seen_validated.add(name)
    assert constrained <= seen_validated, constrained - seen_validated


def test_services_are_cluster_internal():
    for name, svc in resources(all_docs(), "kubernetes_service_v1"):
        assert svc["spec"][0]["type"] == "ClusterIP", name
    template = (INFRA / "k8s" / "raycluster.yaml.tftpl").read_text()
    assert "serviceType: ClusterIP" in template
    assert "LoadBalancer" not in template and "NodePort" not in template


def test_helm_charts_pinned_and_eks_private_by_default():
    docs = all_docs()
    for name, helm in resources(docs, "helm_release"):
        assert re.fullmatch(r"\$\{var\.[a-z_]+_chart_version\}", helm["version"]), name
    ((_, eks),) = resources(docs, "aws_eks_cluster")
    assert eks["vpc_config"][0]["endpoint_private_access"] is True
    assert eks["encryption_config"][0]["resources"] == ["secrets"]


# ---------------------------------------------------------------- the terraform binary, where it exists
TERRAFORM = shutil.which("terraform")
MIRROR = Path(os.environ.get("SIEVE_TF_MIRROR", "/opt/tf-plugins"))
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="no terraform binary on this machine")


@needs_terraform
def test_terraform_fmt_check():
    res = subprocess.run(
        [TERRAFORM, "fmt", "-check", "-recursive", "-diff", str(INFRA / "terraform")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]


def mirrored() -> set[str]:
    """``namespace/type`` of every provider in the offline mirror (registry.terraform.io layout)."""
    base = MIRROR / "registry.terraform.io"
    return {f"{ns.name}/{t.name}" for ns in base.iterdir() for t in ns.iterdir()} if base.is_dir() else set()


def required(folder: Path) -> set[str]:
    """Providers a root or module needs: declared ones, plus the implied hashicorp/<prefix> of each resource."""
    docs = all_docs(folder) if folder.is_dir() else {}
    out = {
        b[name]["source"] if isinstance(b[name], dict) else f"hashicorp/{name}"
        for doc in docs.values()
        for t in doc.get("terraform", [])
        for b in t.get("required_providers", [])
        for name in b
    }
    for doc in docs.values():
        for kind in ("resource", "data", "ephemeral"):
            for block in doc.get(kind, []):
                out |= {f"hashicorp/{t.split('_')[0]}" for t in block if t != "terraform_remote_state"}
    for src in module_sources({p: d for p, d in docs.items()}):
        out |= required((folder / src).resolve())
    return {s.lower() for s in out}


TF_DIRS = [INFRA / "terraform" / "envs" / "prod" / r for r in ("aws", "k8s")] + sorted(
    p for p in (INFRA / "terraform" / "modules").iterdir() if p.is_dir()
)


@needs_terraform
@pytest.mark.parametrize("folder", TF_DIRS, ids=[str(p.relative_to(INFRA / "terraform")) for p in TF_DIRS])
def test_terraform_validate_where_the_mirror_has_the_providers(folder, tmp_path, record_property):
    missing = required(folder) - mirrored()
    if missing:
        record_property("validate", "skipped")
        pytest.skip(f"providers not in the offline mirror {MIRROR}: {sorted(missing)}")
    rc = tmp_path / "tfrc"
    rc.write_text(
        f'provider_installation {{\n  filesystem_mirror {{\n    path = "{MIRROR}"\n'
        f'    include = ["registry.terraform.io/*/*"]\n  }}\n  direct {{\n    exclude = ["registry.terraform.io/*/*"]\n  }}\n}}\n'
    )
    work = tmp_path / "work"
    shutil.copytree(INFRA, work / "infra", ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
    target = work / folder.relative_to(ROOT)
    env = {
        **os.environ,
        "TF_CLI_CONFIG_FILE": str(rc),
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "TF_DATA_DIR": str(tmp_path / "data"),
    }
    init = subprocess.run(
        [TERRAFORM, f"-chdir={target}", "init", "-backend=false", "-input=false", "-no-color"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert init.returncode == 0, init.stdout[-2000:] + init.stderr[-2000:]
    res = subprocess.run(
        [TERRAFORM, f"-chdir={target}", "validate", "-no-color"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record_property("validate", "passed")


# ---------------------------------------------------------------- checkov
CHECKOV = ROOT / ".venv-infra" / "bin" / "checkov"


def skip_list() -> list[tuple[str, str]]:
    out = []
    for line in (INFRA / "checkov-skips.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            check, _, reason = line.partition(" ")
            out.append((check, reason.strip()))
    return out


def test_skip_list_is_short_and_reasoned():
    skips = skip_list()
    assert len(skips) <= 8
    for check, reason in skips:
        assert check.startswith(("CKV_", "CKV2_")) and len(reason) > 20, check


@pytest.mark.skipif(
    not CHECKOV.exists() and not shutil.which("checkov"),
    reason="checkov not installed (make test installs it)",
)
def test_checkov_passes_with_documented_skips():
    exe = str(CHECKOV) if CHECKOV.exists() else shutil.which("checkov")
    skips = ",".join(c for c, _ in skip_list())
    res = subprocess.run(
        [
            exe,
            "-d",
            str(INFRA),
            "--quiet",
            "--compact",
            "--skip-download",
            "-o",
            "json",
            "--framework",
            "terraform",
            "kubernetes",
            "dockerfile",
            "--skip-check",
            skips,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = json.loads(res.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(f["check_id"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]]
    assert failed == [], failed
    assert sum(r["summary"]["passed"] for r in reports) > 100
