"""S3 download: the store's parallel fetch against the boto3 loop a user would write.

A deploy from an S3 store starts with `S3Store.fetch`, which lists the release and downloads
it with its own thread pool: whole objects below `multipart_threshold`, ranged parts above it,
hashed while written, with bounded memory. That machinery only earns its place if it is at
least as fast as the obvious alternative and does not cost more memory. This bench measures
both against a real S3 API (moto's server, on loopback):

* the store: `S3Store(uri, client=...).fetch(listing, dest, manifest=...)`, listing included;
* the baseline: list the release, then `client.download_file(bucket, key, path)` for each
  object, one after the other, with boto3's default `TransferConfig` (10 threads, 8 MiB parts);
* the matched baseline: the same loop with the store's threads, threshold and part size. moto
  reads a whole object for every GET, ranged or not, so on moto the part size alone moves the
  throughput a lot; this row tells what the store's own machinery adds or costs.

Each method runs in a fresh child process (this script with a hidden `--child`), so its peak
RSS (VmHWM) is its own and no method inherits another's heap; the moto server runs in a process
of its own, so its memory and CPU are not charged to any client. Every child imports the same
modules and builds its client before the clock starts; the methods take turns going first.

Machines are noisy, so the numbers are medians over runs, and the store is judged by its ratio
to the baseline measured in the same run (target: throughput ratio >= 0.9). Every downloaded
file is checked against the sha256 it was uploaded with, outside the timed window; the target
for mismatches is 0.

Run from the repo root: `.venv/bin/python bench/s3_download.py [--quick] [--write-readme]`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import inspect
import json
import os
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]

from bench.report import run_main
from bench.s3_report import Params, machine, section, table, verdict, write_readme
from controlplane.adapters.stores.s3 import S3Store
from controlplane.domain.checksums import decode_manifest

BUCKET, PREFIX, MODEL, RELEASE = "bench", "models", "bench", "r1"
REGION = "us-east-1"
MiB = 1024 * 1024
READ_TIMEOUT = 300.0  # moto reads a whole object for every ranged GET: first bytes can be slow
METHODS = ("store", "baseline", "matched")

# The moto server, in its own process: it prints its port, then serves until stdin closes. Its
# listen backlog is werkzeug's 128 unless argv[1] says more (a thousand clients at once).
SERVER = """\
import sys
from moto.server import ThreadedMotoServer
from werkzeug.serving import BaseWSGIServer
if len(sys.argv) > 1:
    BaseWSGIServer.request_queue_size = int(sys.argv[1])
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
"""


# --- the S3 server and the release ---------------------------------------------------------


def _read_line(stream: IO[bytes], deadline: float) -> bytes:
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError("the moto server did not say which port it listens on")
    return stream.readline()


def _answers(host: str, port: int) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=2)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


@dataclass(frozen=True)
class MotoProcess:
    endpoint: str  # http://127.0.0.1:<port>
    pid: int  # the server's process, whose CPU time a bench may read


@contextlib.contextmanager
def moto_process(log: Path, timeout: float = 60.0) -> Iterator[str]:
    """Run moto's S3 server in a child process; yield its endpoint; stop it however we leave."""
    with moto_server_process(log, timeout) as server:
        yield server.endpoint


@contextlib.contextmanager
def moto_server_process(
    log: Path, timeout: float = 60.0, *, backlog: int | None = None
) -> Iterator[MotoProcess]:
    """:func:`moto_process`, yielding its process id too; ``backlog``: its listen queue."""
    extra = [] if backlog is None else [str(backlog)]
    with log.open("wb") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + timeout
        line = _read_line(server.stdout, deadline).strip()
        if not line.isdigit():
            raise RuntimeError(f"the moto server did not start; see {log}")
        port = int(line)
        while not _answers("127.0.0.1", port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the moto server on port {port} does not answer; see {log}")
            time.sleep(0.05)
        yield MotoProcess(f"http://127.0.0.1:{port}", server.pid)
    finally:
        with contextlib.suppress(OSError):
            if server.stdin is not None:
                server.stdin.close()  # its stdin.read() returns and it exits
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


@dataclass(frozen=True)
class Workload:
    medium_files: int
    medium_mib: int
    large_mib: int

    def files(self) -> list[tuple[str, int]]:
        """(path below the release, size) of every file but SHA256SUMS."""
        files = [("config.pbtxt", 2048)]
        files += [(f"1/shard-{i:02d}.bin", self.medium_mib * MiB) for i in range(self.medium_files)]
        return [*files, ("1/model.bin", self.large_mib * MiB)]


def _write_random(path: Path, size: int) -> str:
    """`size` random bytes into `path` (incompressible, like weights); their sha256."""
    sha = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        left = size
        while left:
            chunk = os.urandom(min(left, 4 * MiB))
            sha.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    return sha.hexdigest()


def publish(endpoint: str, workload: Workload, scratch: Path) -> dict[str, str]:
    """Upload the release, SHA256SUMS last; returns the sha256 of every object (by path)."""
    from tests.support.s3 import s3_client  # the parent only: it imports moto

    expected = {rel: _write_random(scratch / rel, size) for rel, size in workload.files()}
    sums = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(expected.items())).encode()
    client = s3_client(endpoint, read_timeout=READ_TIMEOUT)
    try:
        client.create_bucket(Bucket=BUCKET)
        for rel, _ in workload.files():  # large files go up multipart, as the AWS CLI would
            client.upload_file(str(scratch / rel), BUCKET, f"{PREFIX}/{MODEL}/{RELEASE}/{rel}")
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{MODEL}/{RELEASE}/SHA256SUMS", Body=sums)
    finally:
        client.close()
    shutil.rmtree(scratch)
    expected["SHA256SUMS"] = hashlib.sha256(sums).hexdigest()
    return expected


def mismatches(dest: Path, expected: dict[str, str]) -> int:
    """Files missing, different, or not expected at all (temp files left behind, say)."""
    found = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    bad = len(set(found) - set(expected))
    for rel, digest in expected.items():
        path = found.get(rel)
        if path is None:
            bad += 1
            continue
        sha = hashlib.sha256()
        with path.open("rb") as stream:
            while chunk := stream.read(4 * MiB):
                sha.update(chunk)
        bad += sha.hexdigest() != digest
    return bad


# --- one measurement, in a child process ---------------------------------------------------


def _status_kib(field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return None


def peak_rss_kib() -> int:
    """This process's peak RSS. VmHWM, not `ru_maxrss`: on Linux a spawned child's
    `ru_maxrss` starts at its parent's peak (exec folds the old mm's high-water mark into it),
    so it would charge the bench's own memory to whichever method it measures."""
    hwm = _status_kib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if hwm is None else hwm


def _download_loop(client: Any, dest: Path, config: Any) -> int:
    """List the release, then `download_file` each object, one after the other; bytes."""
    base = f"{PREFIX}/{MODEL}/{RELEASE}/"
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=base):
        for entry in page.get("Contents", []):
            path = dest / entry["Key"][len(base) :]
            path.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, entry["Key"], str(path), Config=config)
            total += int(entry["Size"])
    return total


def child(args: argparse.Namespace) -> int:
    """Download the release once with `args.child`'s method; write the numbers to `args.out`."""
    session = boto3.session.Session(  # moto's dummy credentials, as tests/support/s3.py
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106
        region_name=REGION,
    )
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=False)
    knobs = json.loads(args.knobs)
    settings = store_defaults() | knobs
    if args.child == "store":
        # What S3Store builds for itself, plus the endpoint: botocore's retries off.
        config = botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=settings["max_concurrency"] + 4,
            read_timeout=READ_TIMEOUT,
        )
        client = session.client("s3", endpoint_url=args.endpoint, config=config)
    else:  # as a user would write it: a default client
        client = session.client("s3", endpoint_url=args.endpoint)
    transfer = TransferConfig()  # boto3's defaults: 10 threads, 8 MiB parts above 8 MiB
    if args.child == "matched":  # the same loop with the store's settings
        transfer = TransferConfig(
            multipart_threshold=settings["multipart_threshold"],
            multipart_chunksize=settings["part_size"],
            max_concurrency=settings["max_concurrency"],
        )
    before = _status_kib("VmRSS") or 0
    start = time.perf_counter()
    if args.child == "store":
        store = S3Store(f"s3://{BUCKET}/{PREFIX}", client=client, **knobs)
        marker = store.read_marker_files(MODEL, RELEASE).manifest
        manifest = decode_manifest(marker, RELEASE) if marker is not None else None
        listing = store.list_files(MODEL, RELEASE)
        total = store.fetch(listing, dest, manifest=manifest).bytes_total
    else:
        total = _download_loop(client, dest, transfer)
    seconds = time.perf_counter() - start
    peak = peak_rss_kib()
    client.close()
    numbers = {"seconds": seconds, "bytes": total, "peak_kib": peak, "before_kib": before}
    Path(args.out).write_text(json.dumps(numbers), encoding="utf-8")
    return 0


def store_defaults() -> dict[str, int]:
    """S3Store's own transfer defaults, read from its signature so the report cannot lie."""
    names = ("max_concurrency", "multipart_threshold", "part_size")
    parameters = inspect.signature(S3Store.__init__).parameters
    return {name: int(parameters[name].default) for name in names}


def measure(
    method: str, endpoint: str, dest: Path, knobs: dict[str, int], timeout: float
) -> dict[str, float]:
    out = dest.with_suffix(".json")
    command = [sys.executable, __file__, "--child", method, "--endpoint", endpoint]
    command += ["--dest", str(dest), "--out", str(out), "--knobs", json.dumps(knobs)]
    subprocess.run(command, check=True, timeout=timeout)
    numbers: dict[str, float] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return numbers


# --- runs ----------------------------------------------------------------------------------


def run_once(
    run: int, endpoint: str, root: Path, expected: dict[str, str], args: argparse.Namespace
) -> dict[str, float]:
    result: dict[str, float] = {}
    shift = (run - 1) % len(METHODS)  # each method takes each place in turn
    order = METHODS[shift:] + METHODS[:shift]
    for method in order:
        dest = root / f"run{run}-{method}"
        left = args.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the bench ran past its --timeout")
        numbers = measure(method, endpoint, dest, args.store_knobs, left)
        bad = mismatches(dest, expected)
        shutil.rmtree(dest)
        mbps = numbers["bytes"] / numbers["seconds"] / 1e6
        result |= {
            f"{method}_mbps": mbps,
            f"{method}_s": numbers["seconds"],
            f"{method}_peak_mib": numbers["peak_kib"] / 1024,
            f"{method}_growth_mib": (numbers["peak_kib"] - numbers["before_kib"]) / 1024,
            f"{method}_mismatches": bad,
        }
        print(
            f"run {run} {method:>8}: {numbers['seconds']:6.1f} s, {mbps:6.1f} MB/s, peak RSS "
            f"{numbers['peak_kib'] / 1024:.0f} MiB (+{result[f'{method}_growth_mib']:.0f} "
            f"during the download), {bad} sha256 mismatch(es)",
            flush=True,
        )
    result["ratio"] = result["store_mbps"] / result["baseline_mbps"]
    result["matched_ratio"] = result["store_mbps"] / result["matched_mbps"]
    result["rss_ratio"] = result["store_peak_mib"] / result["baseline_peak_mib"]
    result["mismatches"] = sum(result[f"{method}_mismatches"] for method in METHODS)
    return result


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are over runs")
    parser.add_argument("--medium-files", type=int, default=8, help="medium files (default 8)")
    parser.add_argument("--medium-mib", type=int, default=32, help="their size (default 32)")
    parser.add_argument("--large-mib", type=int, default=256, help="one large file (default 256)")
    parser.add_argument("--store-concurrency", type=int, help="S3Store max_concurrency")
    parser.add_argument("--store-part-mib", type=int, help="S3Store part_size, MiB")
    parser.add_argument("--store-threshold-mib", type=int, help="S3Store multipart_threshold")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many s")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 x 8 + 72 MiB, 1 run")
    hidden = argparse.SUPPRESS  # the child mode: one download, numbers as JSON
    parser.add_argument("--child", choices=METHODS, help=hidden)
    for name in ("--endpoint", "--dest", "--out"):
        parser.add_argument(name, help=hidden)
    parser.add_argument("--knobs", default="{}", help=hidden)
    args = parser.parse_args(argv)
    if args.child:
        return args
    if args.quick:
        args.runs, args.medium_files, args.medium_mib, args.large_mib = 1, 2, 8, 72
    if min(args.runs, args.medium_mib, args.large_mib) < 1 or args.medium_files < 0:
        parser.error("--runs and the sizes must be at least 1")
    if min(v for v in (args.store_concurrency, args.store_part_mib, 1) if v is not None) < 1:
        parser.error("--store-concurrency and --store-part-mib must be at least 1")
    knobs = [  # only what the command line sets: the rest are the store's defaults
        ("max_concurrency", args.store_concurrency, 1),
        ("part_size", args.store_part_mib, MiB),
        ("multipart_threshold", args.store_threshold_mib, MiB),
    ]
    args.store_knobs = {name: value * unit for name, value, unit in knobs if value is not None}
    args.deadline = time.monotonic() + args.timeout
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child(args)
    workload = Workload(args.medium_files, args.medium_mib, args.large_mib)
    store = store_defaults() | args.store_knobs
    params = Params(
        runs=args.runs,
        files=workload.files(),
        store=store,
        changed=sorted(args.store_knobs),
        quick=args.quick,
    )
    summary = machine()
    print(f"{summary}\n{params.describe()}\n", flush=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="s3-download-") as tmp:
        root = Path(tmp)
        with moto_process(root / "moto.log") as endpoint:
            began = time.monotonic()
            expected = publish(endpoint, workload, root / "upload")
            print(f"uploaded the release in {time.monotonic() - began:.1f} s\n", flush=True)
            for run in range(1, args.runs + 1):
                runs.append(run_once(run, endpoint, root, expected, args))
    print(f"\n{verdict(runs)}\n\n{table(runs)}")
    if args.write_readme:
        write_readme(section(params, summary, runs))
        print("\nwrote bench/README.md")
    return 0 if sum(r["mismatches"] for r in runs) == 0 else 1


if __name__ == "__main__":
    run_main(main)
