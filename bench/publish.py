"""Publish to serve: time from a release's SHA256SUMS upload to the release answering.

One daemon on an S3 store (moto's S3 and SQS servers over loopback HTTP) with the default poll
interval (10 s) and `store.notifications.sqs_queue_url` set. The bucket notification (as AWS
users configure it: QueueConfigurations, s3:ObjectCreated:*, prefix and suffix filter) covers
the model `sqs-m` only, so in the same run and on the same daemon and Triton a release of
`sqs-m` is heard through SQS while one of `poll-m` waits for the next poll. Runs alternate
between the two; each uploads a new release (files, then SHA256SUMS last) with auto_deploy on
and times from just before the SHA256SUMS upload to the first inference that answers with the
new release's value. Reported: the median of each, the ratio polling / SQS, and the deploy's own
fetch + load steps, which bound what an event can save.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.hot_swap import cache_dir
from bench.report import README, machine, run_main, write_section
from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release
from tests.support.s3 import MANIFEST, aws_env, moto_server, s3_client, sqs_client

BUCKET, PREFIX = "models", "prod"
HEARD, POLLED = "sqs-m", "poll-m"
POLL_INTERVAL = 10.0  # the default store.poll_interval_seconds
BEGIN, END = "<!-- publish:begin -->", "<!-- publish:end -->"
INTRO_ROW = (
    "| `publish.py` | time from a release's `SHA256SUMS` upload to the release answering "
    "inference, heard through S3 event notifications on SQS against polling at the default "
    "interval (10 s), alternating on one daemon in the same run: medians, their ratio, and "
    "the deploy's fetch + load steps |"
)


@dataclass(frozen=True)
class Run:
    model: str
    seconds: float  # SHA256SUMS upload -> first answer from the new release
    fetch_load: float  # the deploy's fetch + load steps, as the operation records them
    steps: float  # all of the deploy's steps
    heard: float  # SHA256SUMS upload -> the deploy's operation created


@dataclass
class Bench:
    triton: RunningTriton
    daemon: Daemon
    s3: Any
    root: Path


def notify_heard_model_only(s3: Any, sqs: Any) -> str:
    url: str = sqs.create_queue(QueueName="releases")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    rules = [
        {"Name": "prefix", "Value": f"{PREFIX}/{HEARD}/"},
        {"Name": "suffix", "Value": MANIFEST},
    ]
    s3.put_bucket_notification_configuration(
        Bucket=BUCKET,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": rules}},
                }
            ]
        },
    )
    return url


@contextlib.contextmanager
def started(root: Path) -> Iterator[Bench]:
    (root / "repository").mkdir()
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(moto_server())
        s3, sqs = s3_client(endpoint), sqs_client(endpoint)
        stack.callback(s3.close)
        stack.callback(sqs.close)
        s3.create_bucket(Bucket=BUCKET)
        url = notify_heard_model_only(s3, sqs)
        triton = stack.enter_context(
            launch_triton(root / "repository", cache_dir=cache_dir(), log_path=root / "triton.log")
        )
        daemon = start_daemon(
            triton=triton,
            store=root,
            workdir=root,
            store_uri=f"s3://{BUCKET}/{PREFIX}",
            extra_env=aws_env(endpoint),
            config=f"store:\n  notifications:\n    sqs_queue_url: {url}\n"
            "model_defaults:\n  auto_deploy: true\n  retire_after_seconds: 0\n",
        )
        stack.callback(daemon.stop)
        yield Bench(triton, daemon, s3, root)


def answers(client: grpcclient.InferenceServerClient, model: str, expected: float) -> bool:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    try:
        result = client.infer(model, [tensor], client_timeout=5.0)
    except Exception:  # not loaded yet
        return False
    output = result.as_numpy("OUTPUT0")
    return output is not None and float(output[0]) == expected


def publish(bench: Bench, model: str, number: int, timeout: float = 60.0) -> Run:
    """Upload release r<number> of ``model`` (k = number) and time it until it answers."""
    release = f"r{number}"
    built = write_scale_release(bench.root / "releases", model, release, k=float(number))
    files = sorted(p for p in built.rglob("*") if p.is_file() and p.name != MANIFEST)
    for path in files:
        key = f"{PREFIX}/{model}/{release}/{path.relative_to(built).as_posix()}"
        bench.s3.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    manifest = (built / MANIFEST).read_bytes()
    client = grpcclient.InferenceServerClient(bench.triton.grpc_url)
    try:
        one_slot_loaded(client, model, timeout)
        if model == POLLED:  # at a random point of the watcher's beat, as a publisher would
            time.sleep(random.uniform(0, POLL_INTERVAL))
        uploaded = time.time()
        start = time.monotonic()
        bench.s3.put_object(
            Bucket=BUCKET, Key=f"{PREFIX}/{model}/{release}/{MANIFEST}", Body=manifest
        )
        while not answers(client, model, float(number)):
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{model} {release} did not answer within {timeout} s")
            time.sleep(0.01)
        seconds = time.monotonic() - start
    finally:
        client.close()
    return Run(model, seconds, *step_times(bench.daemon, model, release, uploaded))


def one_slot_loaded(client: grpcclient.InferenceServerClient, model: str, timeout: float) -> None:
    """Wait until the release before has retired (its slot unloaded), so that a deploy does
    not first free a slot kept warm for rollback, as with releases published minutes apart."""
    deadline = time.monotonic() + timeout
    while True:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        ready = [
            m for m in index if m["name"].startswith(f"{model}__") and m.get("state") == "READY"
        ]
        if len(ready) <= 1:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model}: the previous slot was not unloaded within {timeout} s")
        time.sleep(0.05)


def step_times(
    daemon: Daemon, model: str, release: str, uploaded: float
) -> tuple[float, float, float]:
    """The deploy's fetch + load steps, all of its steps, and upload -> operation (s)."""
    with httpx.Client(base_url=daemon.url, timeout=30) as http:
        listed = http.get(f"/v1/operations?model={model}&limit=5").json()["operations"]
        found = next(op for op in listed if op["release"] == release)
        operation = daemon.wait_operation(found["id"])
    steps = {step["name"]: step["duration_seconds"] or 0.0 for step in operation["steps"]}
    created = datetime.fromisoformat(operation["created_at"]).timestamp()
    return float(steps["fetch"] + steps["load"]), float(sum(steps.values())), created - uploaded


def median(runs: Sequence[Run], model: str, key: str = "seconds") -> float:
    return float(statistics.median(getattr(run, key) for run in runs if run.model == model))


def spread(runs: Sequence[Run], model: str) -> str:
    values = [run.seconds for run in runs if run.model == model]
    return f"{min(values):.2f} to {max(values):.2f}"


def table(runs: Sequence[Run]) -> str:
    sqs, poll = median(runs, HEARD), median(runs, POLLED)
    rows = [
        ("SQS: upload -> answers, median (s)", f"{sqs:.2f}", spread(runs, HEARD)),
        ("polling every 10 s: upload -> answers, median (s)", f"{poll:.2f}", spread(runs, POLLED)),
        ("**ratio polling / SQS**", f"{poll / sqs:.1f}", ""),
        (
            "SQS: the deploy's fetch + load steps, median (s)",
            f"{median(runs, HEARD, 'fetch_load'):.2f}",
            "",
        ),
        (
            "SQS: beyond fetch + load, median (s)",
            f"{sqs - median(runs, HEARD, 'fetch_load'):.2f}",
            "",
        ),
        ("SQS: upload -> deploy started, median (s)", f"{median(runs, HEARD, 'heard'):.2f}", ""),
        (
            "polling: upload -> deploy started, median (s)",
            f"{median(runs, POLLED, 'heard'):.2f}",
            "",
        ),
        ("SQS: all the deploy's steps, median (s)", f"{median(runs, HEARD, 'steps'):.2f}", ""),
    ]
    lines = ["| metric | value | min to max run |", "|---|---:|---:|"]
    lines += [f"| {label} | {value} | {span} |" for label, value, span in rows]
    return "\n".join(lines)


def verdict(runs: Sequence[Run]) -> str:
    beyond = median(runs, HEARD) - median(runs, HEARD, "fetch_load")
    return (
        f"Result: SQS within fetch + load + 1 s: **{'met' if beyond < 1.0 else 'missed'}** "
        f"({beyond:.2f} s beyond the deploy's fetch and load, median; the event itself is "
        f"heard {median(runs, HEARD, 'heard'):.2f} s after the upload, the rest is the deploy's "
        "verify, place, preflight and switch). Polling finds a release at the watcher's next "
        f"beat, up to {POLL_INTERVAL:.0f} s later, about half of it on average: each polled "
        "upload is made at a random point of the beat."
    )


def section(args: argparse.Namespace, summary: str, runs: Sequence[Run]) -> str:
    return f"""{BEGIN}
## publish

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: {args.runs} runs each, alternating SQS and polling
  (`.venv/bin/python bench/publish.py --runs {args.runs} --write-readme`)
- Setup: one daemon, `store.poll_interval_seconds: 10` (the default) and
  `store.notifications.sqs_queue_url`; moto's S3 and SQS servers on loopback, whose bucket
  notification (prefix `{PREFIX}/{HEARD}/`, suffix `SHA256SUMS`) covers `{HEARD}` only, so
  `{POLLED}` is found by polling. Model: Python backend, `OUTPUT0 = INPUT0 * k`, one CPU
  instance, auto_deploy, blue-green with `retire_after_seconds: 0`: each run waits until the
  release before has been unloaded, so that no deploy first frees a slot kept warm for
  rollback (as with releases published minutes apart). Each run uploads a new release (files,
  then `SHA256SUMS`) and times from just before the `SHA256SUMS` upload to the first inference
  (polled every 10 ms) that answers with its `k`.

{verdict(runs)}

{table(runs)}
{END}"""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="runs of each (default 5)")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run of each")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="publish-") as tmp, started(Path(tmp)) as bench:
        summary = machine(bench.triton)
        print(f"{summary}\n", flush=True)
        for model in (HEARD, POLLED):  # the first release of each: a model to replace
            publish(bench, model, 1)
        runs = []
        for number in range(2, args.runs + 2):
            for model in (HEARD, POLLED) if number % 2 else (POLLED, HEARD):
                run = publish(bench, model, number)
                print(f"  {model} r{number}: {run.seconds:.2f} s", flush=True)
                runs.append(run)
    print(f"\n{verdict(runs)}\n\n{table(runs)}")
    if args.write_readme:
        write_section(
            section(args, summary, runs), begin=BEGIN, end=END, script="publish.py", row=INTRO_ROW
        )
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
