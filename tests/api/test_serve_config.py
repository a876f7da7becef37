"""serve-config.yaml is a valid `serve deploy` config for the deployment in serve_app.py."""

from __future__ import annotations

from pathlib import Path

import yaml
from ray.serve.schema import ServeDeploySchema

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_is_valid_and_names_the_deployment() -> None:
    config = ServeDeploySchema.model_validate(
        yaml.safe_load((ROOT / "serve-config.yaml").read_text())
    )
    (app,) = config.applications
    assert app.import_path == "serve_app:app"
    (deployment,) = app.deployments
    assert deployment.name == "RunControlApi"
    assert deployment.max_ongoing_requests == 4256

    import serve_app

    assert serve_app.RunControlApi.name == deployment.name
    assert serve_app.app is not None


def test_every_deployment_config_starts_ray_with_the_fast_ingress() -> None:
    """ray-cluster.yaml and rayservice.yaml set actors/ingress.py's variables (the fast ingress
    and Serve's control loop interval) where Ray starts (every node), and every Serve config
    turns access logs off."""
    from actors.ingress import CLUSTER_VARIABLES

    cluster = yaml.safe_load((ROOT / "ray-cluster.yaml").read_text())
    for commands in (cluster["head_start_ray_commands"], cluster["worker_start_ray_commands"]):
        (start,) = [c for c in commands if "ray start" in c]
        for name, value in CLUSTER_VARIABLES.items():
            assert f"{name}={value}" in start.split(), (name, start)

    service = yaml.safe_load((ROOT / "rayservice.yaml").read_text())
    spec = service["spec"]["rayClusterConfig"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert CLUSTER_VARIABLES.items() <= env.items(), container["name"]

    for config in (
        yaml.safe_load((ROOT / "serve-config.yaml").read_text()),
        yaml.safe_load(service["spec"]["serveConfigV2"]),
    ):
        deploy = ServeDeploySchema.model_validate(config)
        assert deploy.logging_config is not None
        assert deploy.logging_config.enable_access_log is False
        for app in deploy.applications:
            assert app.logging_config is not None
            assert app.logging_config.enable_access_log is False
