"""The ``runcontrol`` command (``[project.scripts]``): runcontrol's CLI with the Ray runtime
handed in for the commands that run on it (``up``, ``hosts``, ``worker --transport ray``).

runcontrol never imports ``actors``: this is where the two meet, as ``serve_app.py`` is for
Serve. Ray is imported only when one of those commands starts (``actors/cluster.py``).
"""

from __future__ import annotations

import sys

from runcontrol.cli import main as cli_main
from runcontrol.cli.cluster import Cluster


def ray_cluster() -> Cluster:
    from .cluster import RayCluster

    return RayCluster()


def main(argv: list[str] | None = None) -> int:
    return cli_main(argv, cluster=ray_cluster)


if __name__ == "__main__":
    sys.exit(main())
