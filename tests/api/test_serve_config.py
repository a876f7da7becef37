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
    assert deployment.max_ongoing_requests == 256

    import serve_app

    assert serve_app.RunControlApi.name == deployment.name
    assert serve_app.app is not None
