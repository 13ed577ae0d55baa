"""The real Prometheus and the real Alertmanager as tests meet them: child processes on loopback.

- :class:`Prometheus` scrapes one target (a :class:`~tests.support.gpu_exporter.GpuExporter` or
  Triton's ``/metrics``), evaluates an optional rule file, and pushes alerts to an Alertmanager;
- :class:`Alertmanager` routes every alert to one webhook receiver, ``controlplane``, which
  authenticates with a bearer token read from a file (a token never appears on a command line);
- :func:`overload_rule` is the rule file the overload watcher is written against.

Each server gets a free port, a config generated into the test's directory, and a log file
there. Entering the context manager returns only once the server answers ``/-/ready`` (polled
with a deadline); a server that exits early or is not ready in time fails the test with the
tail of its log, and is never left running. Leaving stops it: SIGTERM, then SIGKILL.

Nothing is reached beyond loopback: clustering is off, and external URLs are set explicitly so
neither server derives one from the host name.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
import yaml

from devtools.launcher import free_port
from tests.support.polling import eventually

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
RECEIVER = "controlplane"
OVERLOAD_ALERT = "GpuOverload"

_READY_TIMEOUT = 30.0
_STOP_TIMEOUT = 10.0
_LOG_TAIL = 4000


def overload_rule(
    threshold: float = 0.95,
    window: str = "10s",
    for_: str = "10s",
    labels: dict[str, str] | None = None,
) -> str:
    """A rule file with one alert, ``GpuOverload``: mean GPU utilisation over ``window`` above
    ``threshold`` for ``for_``. ``labels`` go on the alert (the daemon reads ``model`` there)."""
    rule: dict[str, Any] = {
        "alert": OVERLOAD_ALERT,
        "expr": f"avg_over_time(nv_gpu_utilization[{window}]) > {threshold}",
        "for": for_,
        "labels": dict(labels or {}),
        "annotations": {
            "summary": (
                f"GPU {{{{ $labels.gpu_uuid }}}} averaged {{{{ $value }}}} over {window}"
                f" (threshold {threshold})"
            ),
        },
    }
    return yaml.safe_dump({"groups": [{"name": "controlplane", "rules": [rule]}]}, sort_keys=False)


class _Server:
    """One child process with a log file in ``dir``, ready once ``/-/ready`` answers 200."""

    name = "server"

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.port = free_port()
        self.log_path = dir / f"{self.name}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write the config files; runs before the process starts."""

    def log(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def __enter__(self) -> Self:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            eventually(self._ready, _READY_TIMEOUT, f"{self.name} ready on {self.url}", every=0.1)
        except AssertionError as exc:
            self.stop()
            tail = self.log()[-_LOG_TAIL:]
            raise AssertionError(f"{exc}; its log ({self.log_path}):\n{tail}") from exc
        return self

    def _ready(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self._process.returncode}")
        try:
            ready = httpx.get(f"{self.url}/-/ready", timeout=1.0, trust_env=False)
            # Another server may hold the port (ours then exits, but maybe not yet): the
            # answer counts only if it comes from a server running our config.
            return ready.status_code == 200 and self._runs_our_config()
        except (httpx.HTTPError, ValueError, LookupError, TypeError):
            # Not answering yet, or something that is not our kind of server.
            return False

    def _runs_our_config(self) -> bool:
        raise NotImplementedError

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL; the exit code (None if never started). Idempotent."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=5.0, trust_env=False)
        response.raise_for_status()
        return response.json()


class Alertmanager(_Server):
    """Alertmanager with one route to one webhook receiver, ``controlplane``, at ``webhook_url``.

    ``send_resolved`` is on, so the receiver also hears when an alert ends. The short default
    timings make a firing alert reach the webhook at once and repeat every few seconds. Alerts
    are grouped by ``group_by`` (``("...",)``: one notification per alert).
    """

    name = "alertmanager"

    def __init__(
        self,
        dir: Path,
        *,
        webhook_url: str,
        bearer_token: str,
        group_wait: str = "0s",
        group_interval: str = "1s",
        repeat_interval: str = "2s",
        group_by: Sequence[str] = ("alertname",),
    ) -> None:
        super().__init__(dir)
        self.webhook_url = webhook_url
        self._token = bearer_token
        self._route = {
            "receiver": RECEIVER,
            "group_by": list(group_by),
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        }
        self.config_path = dir / "alertmanager.yml"
        self.token_path = dir / "webhook.token"

    def _prepare(self) -> None:
        # Created 0600 from the start, not chmod-ed after: the token is never world-readable.
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as token_file:
            token_file.write(self._token)
        receiver = {
            "name": RECEIVER,
            "webhook_configs": [
                {
                    "url": self.webhook_url,
                    "send_resolved": True,
                    "http_config": {
                        "authorization": {
                            "type": "Bearer",
                            "credentials_file": str(self.token_path),
                        }
                    },
                }
            ],
        }
        config = {"route": self._route, "receivers": [receiver]}
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def _command(self) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={self.config_path}",
            f"--storage.path={self.dir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.external-url={self.url}",
            # Empty: no gossip listener, no peers (the default binds 0.0.0.0:9094).
            "--cluster.listen-address=",
        ]

    def _runs_our_config(self) -> bool:
        status = self._get_json("/api/v2/status")
        return str(self.token_path) in status["config"]["original"]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds now (``GET /api/v2/alerts``)."""
        alerts: list[dict[str, Any]] = self._get_json("/api/v2/alerts")
        return alerts


class Prometheus(_Server):
    """Prometheus scraping one target (job ``job``: ``triton`` unless told) and alerting to
    ``alertmanager_url``.

    ``rules`` is the text of a rule file; it is checked with ``promtool`` before the start, so
    a bad rule fails the test with promtool's words rather than as a server that never fires.

    Ready is not scraping: Prometheus hands new targets to the scraper (and Alertmanagers to
    the notifier) at most every 5 s, so the first sample lands about 5 s after ``/-/ready``.
    :meth:`wait_for_scrape` waits for it.
    """

    name = "prometheus"

    def __init__(
        self,
        dir: Path,
        *,
        scrape_url: str,
        alertmanager_url: str | None,
        rules: str | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        job: str = "triton",
    ) -> None:
        super().__init__(dir)
        self.job = job
        self.scrape_url = scrape_url
        self.alertmanager_url = alertmanager_url
        self._rules = rules
        self._intervals = {
            "scrape_interval": scrape_interval,
            "evaluation_interval": evaluation_interval,
        }
        self.config_path = dir / "prometheus.yml"
        self.rules_path = dir / "rules.yml"

    def _prepare(self) -> None:
        target = urlsplit(self.scrape_url)
        config: dict[str, Any] = {
            "global": dict(self._intervals),
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "scheme": target.scheme,
                    "metrics_path": target.path or "/metrics",
                    "static_configs": [{"targets": [target.netloc]}],
                }
            ],
        }
        if self._rules is not None:
            self.rules_path.write_text(self._rules, encoding="utf-8")
            check = subprocess.run(
                [PROMTOOL, "check", "rules", str(self.rules_path)],
                capture_output=True,
                text=True,
                check=False,
            )
            if check.returncode != 0:
                raise AssertionError(
                    f"promtool rejected the rule file:\n{check.stdout}{check.stderr}"
                    f"\n--- {self.rules_path}:\n{self._rules}"
                )
            config["rule_files"] = [str(self.rules_path)]
        if self.alertmanager_url is not None:
            manager = urlsplit(self.alertmanager_url)
            alertmanager: dict[str, Any] = {
                "scheme": manager.scheme,
                "static_configs": [{"targets": [manager.netloc]}],
            }
            if manager.path.strip("/"):
                alertmanager["path_prefix"] = manager.path
            config["alerting"] = {"alertmanagers": [alertmanager]}
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def _command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.dir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # Otherwise derived from the host name: it ends up in every alert's generatorURL.
            f"--web.external-url={self.url}",
        ]

    def _runs_our_config(self) -> bool:
        flags = self._get_json("/api/v1/status/flags")
        return bool(flags["data"]["config.file"] == str(self.config_path))

    def wait_for_scrape(self, timeout: float = _READY_TIMEOUT) -> float:
        """Wait until the target has been scraped once (up or not); return how long it took."""
        return eventually(
            lambda: bool(self.query(f'up{{job="{self.job}"}}')),
            timeout,
            "a first scrape",
            every=0.2,
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant-vector result of ``promql`` now (``GET /api/v1/query``)."""
        body = self._get_json("/api/v1/query", {"query": promql})
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
