"""The service as ``make run`` starts it, and headless Chromium driving its console.

``Service`` runs ``runcontrol up --dev`` (what ``make run`` runs) in a child process on free
ports with an embedded PostgreSQL of its own, reads the URL and the tokens it prints, and mints
more with ``runcontrol token``. ``Console`` is a Selenium session of Debian's ``chromium`` and
``chromium-driver`` on the console's pages.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx

STARTUP_S = 600.0  # a cold start of PostgreSQL, Ray and Serve on a loaded 2-core machine
STARTUP_TRIES = 3
RAY_STARTUP_GAVE_UP = "The current node timed out during startup"
WAIT_S = 120.0  # what a page may take to show a change the service has made
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

DEMO_RUN = {
    "workflowId": "demo-review",
    "releaseAlias": "latest",
    "modelProfileId": "code-agent",
    "input": {"repository": "example/repo", "revision": "a1b2c3d"},
    "limits": {"maxCostUsd": 12, "maxMinutes": 45},
}


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (apt-get install -y {package})"
    return None


class Service:
    """``runcontrol up --dev`` on ``port`` (HTTP) and ``grpc_port``, until ``stop``."""

    def __init__(self, port: int, grpc_port: int, env: dict[str, str] | None = None) -> None:
        self.root = tempfile.mkdtemp(prefix="rc-console-", dir="/tmp")  # short: PG's socket
        # Neither this session's settings nor its Ray's ports (HAProxy's stats and metrics
        # listeners, replica port windows): `make run` picks free ones (actors/ingress.py).
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("RUNCONTROL_", "RAY_"))
        }
        self.env.update(env or {})
        self.env["RUNCONTROL_DATA_DIR"] = os.path.join(self.root, "pg")
        self.url = f"http://127.0.0.1:{port}"
        self.printed: dict[str, str] = {}
        self.log = Path(self.root) / "up.log"  # a file, not a pipe: Ray's children inherit it
        self._args = ["--port", str(port), "--grpc-port", str(grpc_port)]
        self._proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "w", encoding="utf-8") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "actors.cli", "up", "--dev", *self._args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> list[str]:
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def wait_up(self) -> None:
        """Until it prints its last ``export`` line (it is up then), or fail with its output.

        Started again (up to ``STARTUP_TRIES`` times) when Ray's own startup gives up: Ray
        waits a fixed 30 s for its raylet, which a machine under heavy load can exceed."""
        deadline = time.monotonic() + STARTUP_S
        tries = 1
        while "WORKER_TOKEN" not in self.printed:
            if self._proc.poll() is not None:
                if tries < STARTUP_TRIES and any(RAY_STARTUP_GAVE_UP in x for x in self.output()):
                    tries += 1
                    self._proc = self._start()
                    continue
                raise AssertionError(self._failure("exited during startup"))
            if time.monotonic() > deadline:
                raise AssertionError(self._failure("did not come up"))
            time.sleep(0.5)
            for line in self.output():
                if line.startswith("export ") and "=" in line:
                    name, value = line.removeprefix("export ").split("=", 1)
                    self.printed[name] = value
        assert self.printed["RC"] == self.url, self.printed["RC"]

    def _failure(self, what: str) -> str:
        tail = "\n".join(self.output()[-40:])
        return f"runcontrol up --dev {what}; its output:\n{tail}"

    def token(self, subject: str, roles: str, project: str = "demo") -> str:
        """``runcontrol token`` for tenant demo (signed with this service's dev secret)."""
        out = subprocess.run(
            [sys.executable, "-m", "runcontrol.cli", "token", "--tenant", "demo"]
            + ["--project", project, "--sub", subject, "--roles", roles],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def submit(self, token: str, run: dict[str, Any] | None = None) -> str:
        """A run of the demo workflow (or ``run``), as any API client submits it; its id."""
        answer = httpx.post(
            f"{self.url}/factory/runs",
            json=run or DEMO_RUN,
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid4())},
            timeout=60,
        )
        assert answer.status_code == 202, answer.text
        run_id: str = answer.json()["runId"]
        return run_id

    def get(self, path: str, token: str) -> Any:
        answer = httpx.get(
            f"{self.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def stop(self) -> None:
        """As Ctrl-C stops ``make run``: workers drain, Serve, Ray and PostgreSQL stop."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if not os.environ.get("RUNCONTROL_CONSOLE_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)


class Console:
    """One headless Chromium tab on the console of ``base_url``."""

    def __init__(self, base_url: str, shots: Path | None) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
            options.add_argument(arg)
        options.add_argument("--window-size=1280,1000")
        self.driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
        self.base_url = base_url
        self.shots = shots

    def close(self) -> None:
        self.driver.quit()

    def open(self, fragment: str) -> None:
        self.driver.get(f"{self.base_url}/console/{fragment}")

    def wait(self, condition: Callable[[], Any], what: str) -> Any:
        """``condition``'s first truthy answer (exceptions of a page being redrawn count as
        not yet)."""
        from selenium.common.exceptions import (
            NoSuchElementException,
            StaleElementReferenceException,
        )
        from selenium.webdriver.support.ui import WebDriverWait

        def check(_: Any) -> Any:
            try:
                return condition()
            except (NoSuchElementException, StaleElementReferenceException):
                return None

        return WebDriverWait(self.driver, WAIT_S).until(check, f"the console never showed {what}")

    def text(self, selector: str, what: str) -> str:
        """The non-empty text of what ``selector`` names, read again when a live redraw
        replaced the element between finding and reading it."""
        return str(self.wait(lambda: self.css(selector).text, what))

    def texts(self, selector: str, what: str) -> list[str]:
        """The texts of every element ``selector`` names (at least one), read in one go."""
        return list(self.wait(lambda: [e.text for e in self.all(selector)] or None, what))

    def attributes(self, selector: str, name: str, what: str) -> list[str]:
        """Attribute ``name`` of every element ``selector`` names (at least one), read in one
        go inside the wait (a live redraw between finding and reading is "not yet")."""
        return list(
            self.wait(lambda: [e.get_attribute(name) for e in self.all(selector)] or None, what)
        )

    def click(self, selector: str) -> None:
        """Click what ``selector`` names, found again when a live redraw replaced it."""

        def clicked() -> bool:
            self.css(selector).click()
            return True

        self.wait(clicked, f"{selector} to click")

    def css(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def sign_in(self, token: str) -> None:
        """Sign out whoever is signed in, paste ``token`` on the login page, land on Runs."""
        self.open("#/login")
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.refresh()
        field = self.wait(lambda: self.css("#token-input"), "the login form")
        field.send_keys(token)
        self.css("#use-token").click()
        self.wait(lambda: self.css("table#runs"), "the runs list after signing in")

    def mark_page(self) -> None:
        """Tag the loaded document: ``same_page`` is true until the browser loads another."""
        self.driver.execute_script("window.consoleTestMark = 'unchanged'")

    def same_page(self) -> bool:
        return bool(self.driver.execute_script("return window.consoleTestMark === 'unchanged'"))

    def shot(self, name: str) -> None:
        """A screenshot for docs/console.md, when RUNCONTROL_CONSOLE_SCREENSHOTS names a dir."""
        if self.shots is not None:
            self.shots.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(self.shots / f"{name}.png"))


def free_port() -> int:
    """A port to listen on (``actors.ingress.free_port``: never an ephemeral one)."""
    from actors.ingress import free_port as pick

    return pick()
