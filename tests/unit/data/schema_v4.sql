-- The schema controlplane 0.1.0 created (schema version 4), kept as it shipped: the upgrade
-- test (tests/unit/test_sqlite.py) starts from a file made with it.
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    active_release TEXT,
    previous_release TEXT,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    model TEXT NOT NULL,
    slot TEXT NOT NULL,
    state TEXT NOT NULL,
    release TEXT,
    trigger TEXT NOT NULL,
    reason TEXT NOT NULL,
    since TEXT NOT NULL,
    PRIMARY KEY (model, slot)
);
CREATE TABLE IF NOT EXISTS releases (
    model TEXT NOT NULL,
    release TEXT NOT NULL,
    complete INTEGER NOT NULL,
    first_seen TEXT NOT NULL,
    last_seen TEXT NOT NULL,
    revision TEXT,
    PRIMARY KEY (model, release)
);
CREATE TABLE IF NOT EXISTS operations (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    release TEXT,
    from_release TEXT,
    trigger TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    error_code TEXT,
    error_message TEXT,
    steps TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS operations_by_model ON operations (model, created_at);
CREATE INDEX IF NOT EXISTS operations_by_status ON operations (status);
CREATE TABLE IF NOT EXISTS rollbacks (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    at TEXT NOT NULL,
    trigger TEXT NOT NULL,
    reason TEXT NOT NULL,
    from_release TEXT,
    to_release TEXT,
    outcome TEXT NOT NULL,
    operations TEXT NOT NULL,
    detail TEXT NOT NULL,
    suppressed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rollbacks_by_model ON rollbacks (model, at);
CREATE TABLE IF NOT EXISTS degraded (
    model TEXT NOT NULL,
    release TEXT NOT NULL,
    at TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (model, release)
);
CREATE TABLE IF NOT EXISTS memory_samples (
    at TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    model TEXT NOT NULL,
    host_bytes INTEGER,
    gpu_bytes INTEGER
);
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    first_received TEXT NOT NULL,
    last_received TEXT NOT NULL,
    receipts INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, starts_at)
);
