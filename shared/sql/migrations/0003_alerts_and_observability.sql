-- cronstream projection, version 3: alerts, trace ids, and who acted.

-- The `alerts` topic, projected: one row per episode (alert_id), FIRING until a RESOLVED
-- record with the same id arrives. One-shot alerts stay FIRING (they need a person).
CREATE TABLE alerts (
    alert_id      uuid PRIMARY KEY,
    kind          text NOT NULL,
    severity      text NOT NULL,
    state         text NOT NULL,            -- FIRING, RESOLVED
    job_id        text,
    queue         text,
    execution_id  uuid,
    run_id        uuid,
    summary       text,
    error_message text,
    evidence      jsonb NOT NULL DEFAULT '{}'::jsonb,
    fired_at      timestamptz NOT NULL,
    resolved_at   timestamptz,
    updated_at    timestamptz NOT NULL,
    kafka_partition int NOT NULL,
    kafka_offset  bigint NOT NULL
);
CREATE INDEX alerts_recent ON alerts (fired_at DESC);
CREATE INDEX alerts_firing ON alerts (fired_at DESC) WHERE state = 'FIRING';
CREATE INDEX alerts_by_job ON alerts (job_id, fired_at DESC);

-- The W3C trace id of each execution (from the traceparent header of its events), so
-- that a dashboard row or a log line jumps to its trace.
ALTER TABLE job_executions ADD COLUMN trace_id text;
ALTER TABLE execution_events ADD COLUMN trace_id text;

-- Who approved, rejected or cancelled an execution (the `issued_by` of the command).
ALTER TABLE job_executions ADD COLUMN approved_by text;
ALTER TABLE job_executions ADD COLUMN rejected_by text;
ALTER TABLE job_executions ADD COLUMN cancelled_by text;
