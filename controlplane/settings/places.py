"""Where things live: Triton's model repository, staging, the store, the database.

The repository and staging must share a filesystem (placement is one ``rename(2)``); that is
checked at start-up by the staging adapter, not here, since it needs the directories. Here the
store's URI is checked for its form (``file:///absolute/path`` or ``s3://bucket/prefix``, with
no credentials: S3 takes them from the AWS chain), so a wrong one is refused before anything
starts. The defaults of the staging dir and the database sit beside the repository;
:class:`~controlplane.settings.root.Settings` derives them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from controlplane.domain.notifications import queue_name_problem
from controlplane.settings.group import Group


class RepositorySettings(Group):
    path: Path = Field(
        description="Triton's --model-repository; the daemon places model dirs here.",
    )


class StagingSettings(Group):
    path: Path | None = Field(
        None,
        description="Temp dirs for downloads; must share the repository's filesystem. "
        "Default: 'staging' beside the repository.",
    )
    cache_max_bytes: int = Field(
        10 * 1024**3,
        ge=0,
        description="Bound of the content cache of verified files (staging/cas); files no "
        "placed release uses are evicted beyond it. 0 disables the cache.",
    )
    refuse_python_syntax_errors: bool = Field(
        True,
        description="Refuse a release whose Python sources do not compile (invalid_release, "
        "naming the file and line) before anything is placed. They are compiled with the "
        "daemon's Python: set false if Triton's Python backend runs a newer Python whose "
        "syntax the daemon's does not know (a warning is logged instead).",
    )


class StoreNotificationsSettings(Group):
    sqs_queue_url: str | None = Field(
        None,
        description="S3 store: the URL of an SQS queue that the bucket's event notifications "
        "(s3:ObjectCreated:*, suffix SHA256SUMS) go to. Each member long-polls it and lists a "
        "model as soon as a release's SHA256SUMS is uploaded; a message is deleted once that "
        "listing is done. The watcher still lists the whole store every "
        "store.poll_interval_seconds (every store.full_scan_seconds with queue_per_member), "
        "so a lost event or an unreachable queue delays a release until then, never loses it. "
        "Default none: polling only (or sns_topic_arn).",
    )
    queue_per_member: bool = Field(
        False,
        description="With sqs_queue_url: the queue is this member's alone, subscribed to the "
        "SNS topic of the bucket's events (made by the operator, where members may not make "
        "their own), so it hears every release. Its events then vouch for the models they "
        "do not name: a quiet beat lists nothing, and the whole store is listed every "
        "store.full_scan_seconds rather than every store.poll_interval_seconds. Never set it "
        "for a queue several members read: each event reaches one of them, and the others "
        "would find that release only at their next full scan. Implied by sns_topic_arn. "
        "Default false: a queue given may be shared.",
    )
    sns_topic_arn: str | None = Field(
        None,
        description="S3 store, instead of sqs_queue_url: the ARN of an SNS topic that the "
        "bucket's event notifications go to (releases' SHA256SUMS and changes of the fleet's "
        "desired state, docs/notifications.md). At start each member creates its own SQS queue "
        "(queue_name), lets the topic send to it and subscribes it, so every member hears "
        "every release and every change of the desired state at once (no wake over HTTP "
        "needed). A member that may not (IAM) logs which permission it lacks and polls. "
        "Default none.",
    )
    queue_name: str | None = Field(
        None,
        description="With sns_topic_arn: the name of the SQS queue this member creates and "
        "subscribes (created if missing, reused if there). Default: controlplane-<member "
        "name> (fleet.member, the pod's name in Kubernetes; dots become hyphens).",
    )

    @field_validator("sqs_queue_url")
    @classmethod
    def _check_queue_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(
                f"give the queue's URL (https://sqs.<region>.amazonaws.com/<account>/<name>, "
                f"as GetQueueUrl answers), not {url!r}"
            )
        if "@" in parsed.netloc:
            raise ValueError(
                "a queue URL carries no credentials: SQS takes them from the AWS chain"
            )
        return url

    @field_validator("sns_topic_arn")
    @classmethod
    def _check_topic_arn(cls, arn: str | None) -> str | None:
        if arn is not None and _TOPIC_ARN.fullmatch(arn) is None:
            raise ValueError(
                f"give the topic's ARN (arn:aws:sns:<region>:<account>:<name>), not {arn!r}"
            )
        return arn

    @field_validator("queue_name")
    @classmethod
    def _check_queue_name(cls, name: str | None) -> str | None:
        problem = None if name is None else queue_name_problem(name)
        if problem is not None:
            raise ValueError(f"{problem}: {name!r}")
        return name

    @model_validator(mode="after")
    def _one_way_to_the_queue(self) -> StoreNotificationsSettings:
        if self.sqs_queue_url is not None and self.sns_topic_arn is not None:
            raise ValueError(
                "store.notifications: give sqs_queue_url (a queue already fed by the bucket, "
                "or by the topic) or sns_topic_arn (each member makes and subscribes its own "
                "queue), not both"
            )
        if self.queue_per_member and self.sqs_queue_url is None and self.sns_topic_arn is None:
            raise ValueError(
                "store.notifications.queue_per_member says the queue of "
                "store.notifications.sqs_queue_url is this member's alone: give that queue's "
                "URL too (or sns_topic_arn, whose queues are each member's own), or remove it"
            )
        if self.queue_name is not None and self.sns_topic_arn is None:
            raise ValueError(
                "store.notifications.queue_name names the queue a member makes on the SNS "
                "topic: give store.notifications.sns_topic_arn too, or remove it"
            )
        return self

    @property
    def enabled(self) -> bool:
        """Whether any queue is set: a given one, or this member's on the topic."""
        return self.sqs_queue_url is not None or self.sns_topic_arn is not None

    @property
    def own_queue(self) -> bool:
        """Whether this member's queue is its alone: one it makes on the topic, or one given
        as such (queue_per_member)."""
        return self.sns_topic_arn is not None or (self.enabled and self.queue_per_member)


# arn:<partition>:sns:<region>:<account>:<topic>
_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z]{2}(?:-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}")


class StoreSettings(Group):
    uri: str = Field(
        description="Where releases come from: file:///abs/path or s3://bucket/prefix, with "
        "<model>/<release>/ below it. S3 uses the standard AWS chain (AWS_ENDPOINT_URL_S3, ...).",
    )
    require_checksums: bool = Field(
        True, description="Refuse releases without SHA256SUMS (the publisher's commit marker)."
    )
    poll_interval_seconds: float = Field(
        10.0,
        gt=0,
        description="How often the watcher looks at the store for new releases: a listing of "
        "the whole store, or only of the models the store's events named when those events "
        "can be trusted (store.full_scan_seconds says when).",
    )
    full_scan_seconds: float = Field(
        300.0,
        gt=0,
        description="How often the watcher lists every model even though the store's events "
        "name the ones that changed (between these, a beat lists only those, and a quiet beat "
        "nothing): a local store's filesystem events, or an S3 store's notifications through "
        "a queue of this member's own (store.notifications.sns_topic_arn, or sqs_queue_url "
        "with queue_per_member). The safety net for events lost on the way (an inotify queue "
        "overflow, a bucket notification removed): a release whose event was missed is seen "
        "at the next full scan at the latest, never lost. Where events cannot be trusted (a "
        "network or FUSE filesystem such as NFS, EFS or SMB, where a release published from "
        "another host raises no event; inotify unavailable; a queue the fleet shares, or none) "
        "every beat is a full scan; with a shared queue an event brings a listing of its model "
        "forward. A full scan of S3 is one listing of the whole store (1,000 keys a request).",
    )
    max_concurrency: int = Field(
        8, ge=1, le=64, description="Parallel downloads (objects and ranged parts) from S3."
    )
    multipart_threshold_bytes: int = Field(
        64 * 1024**2,
        ge=0,
        description="S3 objects at least this large are fetched in ranged parts, in parallel.",
    )
    part_size_bytes: int = Field(
        16 * 1024**2, ge=64 * 1024, description="Size of each ranged part of a large S3 object."
    )
    retry_seconds: float = Field(
        120.0,
        gt=0,
        description="How long one S3 request may keep failing transiently (SlowDown, 5xx, "
        "dropped connections, bytes corrupted on the way) before the deploy fails with "
        "store_unavailable; retries back off exponentially with jitter, at most 5 s apart. "
        "120 s outlasts a SlowDown storm or a MinIO pod restart, so a short outage delays a "
        "deploy instead of failing it; a store that is really down is reported that much "
        "later. Scans for new releases retry for at most 5 s (they run again anyway).",
    )
    max_release_bytes: int | None = Field(
        None,
        ge=1,
        description="Largest release (the sum of the sizes the store lists) a deploy accepts; "
        "a larger one is refused with release_too_large before anything is fetched. Default "
        "none: models range from kilobytes to hundreds of gigabytes, so no bound fits all, "
        "and free space in staging is checked before every fetch anyway; set it to catch a "
        "publisher's mistake before it costs a download.",
    )
    notifications: StoreNotificationsSettings = Field(
        default_factory=StoreNotificationsSettings,
        description="S3 store only: sqs_queue_url, the URL of the SQS queue the bucket's "
        "s3:ObjectCreated:* events of SHA256SUMS keys go to, or sns_topic_arn, an SNS topic "
        "they go to, on which each member subscribes a queue of its own (queue_name), so "
        "every member hears every release and change of the desired state "
        "(docs/notifications.md). A member lists a model as soon as its event arrives, rather "
        "than at the next poll. With a queue of its own (sns_topic_arn, or queue_per_member) "
        "a quiet beat lists nothing and the full scans (store.full_scan_seconds) are the safety "
        "net; with a shared one every quiet beat lists the store. Default none: polling only.",
    )

    require_signature: bool = Field(
        False,
        description="Refuse a release without a SHA256SUMS.sig that a key of store.keyring "
        "verifies (signature_missing); a model's own require_signature overrides it. Without "
        "it, a release that has a .sig is still verified when a keyring is set, and refused "
        "when the signature does not verify; an unsigned one deploys. See docs/signatures.md.",
    )
    keyring: Annotated[list[Path] | None, NoDecode] = Field(
        None,
        description="Publisher public keys that may sign releases: a dir of *.pem files (its "
        "retired/ subdir holds keys no longer trusted) or a list of PEM files (JSON list in "
        "an environment variable). Each PEM is an Ed25519 or ECDSA P-256 public key, or an "
        "X.509 certificate whose validity bounds when its key is trusted; a key is named by "
        "its file's stem. Read again at every deploy, so keys rotate without a restart. "
        "Required when any signature is required.",
    )

    @field_validator("keyring", mode="before")
    @classmethod
    def _keyring_paths(cls, value: object) -> object:
        """One path (a dir, or a file) or a list of them; from the environment, a path or a
        JSON list."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"not a JSON list of paths: {exc}") from None
            return [text] if text else None
        if isinstance(value, Path):
            return [value]
        return value

    @field_validator("keyring")
    @classmethod
    def _keyring_not_empty(cls, paths: list[Path] | None) -> list[Path] | None:
        if paths is not None and not paths:
            raise ValueError("name at least one dir or PEM file, or leave store.keyring unset")
        return paths

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
                raise ValueError(f"use file:///absolute/path, not {uri!r}")
        elif parsed.scheme == "s3":
            if not parsed.netloc:
                raise ValueError(f"name the bucket: s3://bucket/prefix, not {uri!r}")
            if "@" in parsed.netloc or ":" in parsed.netloc:
                # Never echoed: what precedes the bucket would be a key and its secret.
                raise ValueError(
                    "an S3 URI names the bucket only (s3://bucket/prefix): give no credentials "
                    "in it, S3 takes them from the AWS chain (AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, a profile, the pod's role)"
                )
        else:
            raise ValueError(
                f"unsupported store URI {uri!r}; use file:///absolute/path or s3://bucket/prefix"
            )
        return uri

    @model_validator(mode="after")
    def _notifications_need_s3(self) -> StoreSettings:
        notifications = self.notifications
        if notifications.enabled and self.scheme != "s3":
            name = "sqs_queue_url" if notifications.sqs_queue_url is not None else "sns_topic_arn"
            raise ValueError(
                f"store.notifications.{name} needs an S3 store (store.uri s3://...): it "
                f"carries S3 event notifications, which {self.uri} never sends; remove it, or "
                "point store.uri at the bucket the queue hears from"
            )
        return self

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme

    @property
    def local_path(self) -> Path:
        return Path(urlparse(self.uri).path)


class DatabaseSettings(Group):
    path: Path | None = Field(
        None,
        description="SQLite file with releases, desired state and operations. "
        "Default: 'controlplane.db' beside the repository.",
    )
