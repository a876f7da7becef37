"""Console fixtures: one service per session, started as ``make run`` starts it, with an OAuth2
provider of its own configured for the console's sign-in; one headless Chromium per session.

The browser tests skip, saying why, only when Debian's ``chromium``/``chromium-driver`` are not
installed; with ``RUNCONTROL_REQUIRE_BROWSER=1`` (``.ci/run``, which installs them) they fail
instead, so CI cannot be green with every console test skipped.
``RUNCONTROL_CONSOLE_SCREENSHOTS=DIR`` saves a screenshot of each page there
(``docs/console/`` holds the ones in ``docs/console.md``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_harness import Console, Service, chromium_missing, free_port
from oauth_provider import Provider, ProviderServer

OAUTH_CLIENT_ID = "runcontrol-console"
OAUTH_SUBJECT = "dana"


# Module-scoped: one module uses them, and the service stops when it ends, not at the end of
# the session (an idle cluster costs ~15 % of a core, shared with every later test).
@pytest.fixture(scope="module")
def oauth_provider() -> Iterator[ProviderServer]:
    """The identity provider the service's console is configured with (``oauth_provider.py``);
    it signs in ``dana`` once the service is up (``service`` gives it its key)."""
    server = ProviderServer(Provider(OAUTH_CLIENT_ID, OAUTH_SUBJECT), free_port())
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def service(oauth_provider: ProviderServer) -> Iterator[Service]:
    started = Service(
        free_port(),
        free_port(),
        env={
            "RUNCONTROL_CONSOLE__OAUTH_AUTHORIZE_URL": f"{oauth_provider.url}/authorize",
            "RUNCONTROL_CONSOLE__OAUTH_TOKEN_URL": f"{oauth_provider.url}/token",
            "RUNCONTROL_CONSOLE__OAUTH_CLIENT_ID": OAUTH_CLIENT_ID,
        },
    )
    try:
        started.wait_up()
        # dana is a Reviewer of demo/demo, signed with the service's (dev) key
        oauth_provider.provider.mint = lambda subject: started.token(subject, "Reviewer")
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def browser(service: Service) -> Iterator[Console]:
    missing = chromium_missing()
    if missing and os.environ.get("RUNCONTROL_REQUIRE_BROWSER") == "1":
        pytest.fail(f"the console tests drive headless Chromium, required here: {missing}")
    if missing:
        pytest.skip(f"the console tests drive headless Chromium: {missing}")
    shots = os.environ.get("RUNCONTROL_CONSOLE_SCREENSHOTS")
    console = Console(service.url, Path(shots) if shots else None)
    try:
        yield console
    finally:
        console.close()
