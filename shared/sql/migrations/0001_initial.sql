-- cronstream projection, version 1 (docs/reference/projection.md). Written only by the monitor.
-- Times are timestamptz (UTC on the wire); ids of executions and runs are uuid.

CREATE TABLE job_definitions (
    job_id                  text PRIMARY KEY,
    name                    text,
    type                    text NOT NULL,
    schedule                text,
    interval_seconds        integer,
    run_at                  timestamptz,
    timezone                text NOT NULL,
    start_at                timestamptz,
    end_at                  timestamptz,
    depends_on              text[] NOT NULL DEFAULT '{}',
    trigger_rule            text NOT NULL,
    condition               text,
    requires_approval       boolean NOT NULL DEFAULT false,
    handler                 text NOT NULL,
    params                  jsonb NOT NULL DEFAULT '{}',
    max_retries             integer NOT NULL,
    retry_delay_seconds     double precision NOT NULL,
    max_retry_delay_seconds double precision NOT NULL,
    timeout_seconds         double precision NOT NULL,
    priority                text NOT NULL,
    queue                   text NOT NULL,
    concurrency_policy      text NOT NULL,
    misfire_policy          text NOT NULL,
    misfire_grace_seconds   double precision NOT NULL,
    enabled                 boolean NOT NULL,
    created_by              text,
    created_at              timestamptz,
    deleted_at              timestamptz,
    next_execution_at       timestamptz,
    updated_at              timestamptz NOT NULL,
    definition              jsonb NOT NULL
);

CREATE TABLE job_dependencies (
    downstream_job_id text NOT NULL,
    upstream_job_id   text NOT NULL,
    PRIMARY KEY (downstream_job_id, upstream_job_id)
);
CREATE INDEX job_dependencies_upstream ON job_dependencies (upstream_job_id);

-- One row per execution: its current state. Guarded transitions (queries.sql
-- upsert_executions): a terminal status is never overwritten, and an event of an older
-- delivery (a dead worker's late report) never overwrites a newer one.
CREATE TABLE job_executions (
    execution_id     uuid PRIMARY KEY,
    job_id           text NOT NULL,
    run_id           uuid NOT NULL,
    status           text NOT NULL,
    scheduled_at     timestamptz NOT NULL,
    queued_at        timestamptz,
    started_at       timestamptz,
    completed_at     timestamptz,
    worker_id        text,
    attempt_number   integer NOT NULL,
    delivery         integer NOT NULL DEFAULT 1,
    error_message    text,
    result           jsonb,
    progress         real,
    progress_message text,
    priority         text,
    queue            text,
    last_event       text NOT NULL,
    updated_at       timestamptz NOT NULL
);
CREATE INDEX job_executions_job ON job_executions (job_id, scheduled_at DESC);
CREATE INDEX job_executions_run ON job_executions (run_id);
CREATE INDEX job_executions_active ON job_executions (status)
    WHERE status IN ('QUEUED', 'RUNNING', 'AWAITING_APPROVAL');

-- Append-only audit log: every event of execution-events, with its Kafka position.
CREATE TABLE execution_events (
    event_id         uuid PRIMARY KEY,
    execution_id     uuid NOT NULL,
    job_id           text NOT NULL,
    run_id           uuid NOT NULL,
    status           text NOT NULL,
    attempt_number   integer NOT NULL,
    delivery         integer NOT NULL,
    scheduled_at     timestamptz NOT NULL,
    occurred_at      timestamptz NOT NULL,
    worker_id        text,
    started_at       timestamptz,
    completed_at     timestamptz,
    error_message    text,
    result           jsonb,
    progress         real,
    progress_message text,
    kafka_partition  integer NOT NULL,
    kafka_offset     bigint NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX execution_events_execution ON execution_events (execution_id);

CREATE TABLE workers (
    worker_id      text PRIMARY KEY,
    hostname       text NOT NULL,
    status         text NOT NULL,
    last_heartbeat timestamptz NOT NULL,
    running        uuid[] NOT NULL DEFAULT '{}',
    capacity       integer NOT NULL,
    queues         text[] NOT NULL DEFAULT '{}',
    updated_at     timestamptz NOT NULL
);

-- The monitor's consumed positions, written in the same transaction as their effects:
-- this is what makes the projection exactly-once (docs/reference/projection.md).
CREATE TABLE consumer_offsets (
    consumer    text NOT NULL,
    topic       text NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);
