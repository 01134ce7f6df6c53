-- Named queries; `-- name: x` starts a block. Loaded by cronstream.shared.db.

-- name: create_staging
-- Per connection (the monitor's pool creates them on each): a batch's events and patches
-- are COPYed here, then moved into the tables by the statements below, in its transaction.
-- ON COMMIT DELETE ROWS empties them at the commit (a rollback takes its rows with it).
-- Binary COPY costs a third of what one array parameter per column did, Python and
-- PostgreSQL together (docs/decisions/0015).
CREATE TEMP TABLE IF NOT EXISTS staged_events (
    event_id uuid, execution_id uuid, job_id text, run_id uuid, status text,
    attempt_number int, delivery int, scheduled_at timestamptz, occurred_at timestamptz,
    worker_id text, started_at timestamptz, completed_at timestamptz, error_message text,
    result jsonb, progress real, progress_message text, kafka_partition int,
    kafka_offset bigint, trace_id text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS staged_executions (
    execution_id uuid, job_id text, run_id uuid, status text, scheduled_at timestamptz,
    queued_at timestamptz, started_at timestamptz, completed_at timestamptz, worker_id text,
    attempt_number int, delivery int, error_message text, result jsonb, progress real,
    progress_message text, priority text, queue text, last_event text, updated_at timestamptz,
    reason text, idempotency_key text, job jsonb, approved_by text, rejected_by text,
    cancelled_by text, trace_id text, traceparent text, triggered_by text,
    definition_offset bigint, waiting_reason text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS staged_log_lines (
    execution_id uuid, delivery int, seq int, job_id text, attempt_number int,
    at timestamptz, stream text, level text, line text, worker_id text, trace_id text
) ON COMMIT DELETE ROWS;

-- name: insert_log_lines
-- A batch whose straight COPY found lines projected already (services/monitor/store.py).
INSERT INTO execution_logs (execution_id, delivery, seq, job_id, attempt_number, at, stream,
                            level, line, worker_id, trace_id)
SELECT execution_id, delivery, seq, job_id, attempt_number, at, stream, level, line,
       worker_id, trace_id
FROM staged_log_lines
ON CONFLICT (execution_id, delivery, seq) DO NOTHING;

-- name: insert_log_ends
INSERT INTO execution_log_ends (execution_id, delivery, lines, ended_at)
SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[])
ON CONFLICT (execution_id, delivery) DO NOTHING;

-- name: log_states
-- What the deliveries ($1, $2) of a batch's log lines hold where they are kept, their
-- ends, and their executions as projected ($3: the terminal statuses), for the bounds of
-- services/monitor/log_bounds.py. One row per delivery; index lookups only.
SELECT k.execution_id, k.delivery, s.handler_bytes, s.note_bytes, s.next_seq, s.cut,
       e.lines AS end_lines,
       coalesce(je.status = ANY ($3::text[]), false) AS terminal,
       je.delivery AS execution_delivery,
       EXISTS (SELECT 1 FROM execution_log_ends x
               WHERE x.execution_id = je.execution_id AND x.delivery = je.delivery)
           AS execution_ended
FROM unnest($1::uuid[], $2::int[]) AS k(execution_id, delivery)
LEFT JOIN execution_log_sizes s ON s.execution_id = k.execution_id AND s.delivery = k.delivery
LEFT JOIN execution_log_ends e ON e.execution_id = k.execution_id AND e.delivery = k.delivery
LEFT JOIN job_executions je ON je.execution_id = k.execution_id;

-- name: kept_log_seqs
-- Which of these lines ($1 execution, $2 delivery, $3 seq) the log holds already.
SELECT l.execution_id, l.delivery, l.seq
FROM unnest($1::uuid[], $2::int[], $3::int[]) AS k(execution_id, delivery, seq)
JOIN execution_logs l ON l.execution_id = k.execution_id AND l.delivery = k.delivery
                     AND l.seq = k.seq;

-- name: upsert_log_sizes
-- What the deliveries hold after a batch (absolute: only the monitor that holds their
-- partition, fenced, writes them).
INSERT INTO execution_log_sizes (execution_id, delivery, handler_bytes, note_bytes, next_seq, cut)
SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::bigint[], $5::int[], $6::bool[])
ON CONFLICT (execution_id, delivery) DO UPDATE
SET handler_bytes = EXCLUDED.handler_bytes, note_bytes = EXCLUDED.note_bytes,
    next_seq = EXCLUDED.next_seq, cut = EXCLUDED.cut;

-- name: insert_events
INSERT INTO execution_events (
    event_id, execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
    occurred_at, worker_id, started_at, completed_at, error_message, result, progress,
    progress_message, kafka_partition, kafka_offset, trace_id)
SELECT event_id, execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
       occurred_at, worker_id, started_at, completed_at, error_message, result, progress,
       progress_message, kafka_partition, kafka_offset, trace_id
FROM staged_events
ON CONFLICT (event_id) DO NOTHING;

-- name: upsert_executions
-- Each row is the fold of one batch's events for one execution (projection.py). The
-- WHERE clause is the transition guard: terminal rows are final, older deliveries stale.
-- A newer delivery (after a requeue) replaces the run fields instead of merging them.
-- The definition version a run used is the version of the record its snapshot names (one
-- projected later is resolved then: resolve_definition_versions).
INSERT INTO job_executions AS je (
    execution_id, job_id, run_id, status, scheduled_at, queued_at, started_at, completed_at,
    worker_id, attempt_number, delivery, error_message, result, progress, progress_message,
    priority, queue, last_event, updated_at, reason, idempotency_key, job, approved_by,
    rejected_by, cancelled_by, trace_id, traceparent, triggered_by, definition_offset,
    definition_version, waiting_reason)
SELECT p.execution_id, p.job_id, p.run_id, p.status, p.scheduled_at, p.queued_at, p.started_at,
       p.completed_at, p.worker_id, p.attempt_number, p.delivery, p.error_message, p.result,
       p.progress, p.progress_message, p.priority, p.queue, p.last_event, p.updated_at,
       p.reason, p.idempotency_key, p.job, p.approved_by, p.rejected_by, p.cancelled_by,
       p.trace_id, p.traceparent, p.triggered_by, p.definition_offset, v.version,
       p.waiting_reason
FROM staged_executions AS p
LEFT JOIN job_definition_versions AS v
       ON v.job_id = p.job_id AND v.kafka_offset = p.definition_offset
ORDER BY p.execution_id  -- rows are locked in one order by every monitor
ON CONFLICT (execution_id) DO UPDATE SET
    status = EXCLUDED.status,
    delivery = EXCLUDED.delivery,
    last_event = EXCLUDED.last_event,
    queued_at = COALESCE(EXCLUDED.queued_at, je.queued_at),
    started_at = CASE WHEN EXCLUDED.delivery > je.delivery THEN EXCLUDED.started_at
                      ELSE COALESCE(EXCLUDED.started_at, je.started_at) END,
    worker_id = CASE WHEN EXCLUDED.delivery > je.delivery THEN EXCLUDED.worker_id
                     ELSE COALESCE(EXCLUDED.worker_id, je.worker_id) END,
    progress = CASE WHEN EXCLUDED.delivery > je.delivery THEN EXCLUDED.progress
                    ELSE COALESCE(EXCLUDED.progress, je.progress) END,
    progress_message = CASE WHEN EXCLUDED.delivery > je.delivery THEN EXCLUDED.progress_message
                            ELSE COALESCE(EXCLUDED.progress_message, je.progress_message) END,
    completed_at = COALESCE(EXCLUDED.completed_at, je.completed_at),
    error_message = COALESCE(EXCLUDED.error_message, je.error_message),
    result = COALESCE(EXCLUDED.result, je.result),
    priority = COALESCE(EXCLUDED.priority, je.priority),
    queue = COALESCE(EXCLUDED.queue, je.queue),
    reason = COALESCE(EXCLUDED.reason, je.reason),
    idempotency_key = COALESCE(EXCLUDED.idempotency_key, je.idempotency_key),
    job = COALESCE(EXCLUDED.job, je.job),
    approved_by = COALESCE(EXCLUDED.approved_by, je.approved_by),
    rejected_by = COALESCE(EXCLUDED.rejected_by, je.rejected_by),
    cancelled_by = COALESCE(EXCLUDED.cancelled_by, je.cancelled_by),
    trace_id = COALESCE(je.trace_id, EXCLUDED.trace_id),
    traceparent = COALESCE(EXCLUDED.traceparent, je.traceparent),
    triggered_by = COALESCE(EXCLUDED.triggered_by, je.triggered_by),
    definition_offset = COALESCE(EXCLUDED.definition_offset, je.definition_offset),
    definition_version = COALESCE(EXCLUDED.definition_version, je.definition_version),
    waiting_reason = COALESCE(EXCLUDED.waiting_reason, je.waiting_reason),
    updated_at = EXCLUDED.updated_at
WHERE je.status NOT IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED',
                        'SKIPPED')
  AND EXCLUDED.delivery >= je.delivery;

-- name: upsert_workers
INSERT INTO workers AS w (worker_id, hostname, status, last_heartbeat, running, capacity, queues,
                          updated_at)
-- running and queues arrive comma-joined: unnest cannot carry one array per row.
SELECT h.worker_id, h.hostname, h.status, h.last_heartbeat,
       COALESCE(string_to_array(NULLIF(h.running, ''), ',')::uuid[], '{}'), h.capacity,
       COALESCE(string_to_array(NULLIF(h.queues, ''), ','), '{}'), now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[], $6::int[],
            $7::text[]) AS h(worker_id, hostname, status, last_heartbeat, running, capacity, queues)
ON CONFLICT (worker_id) DO UPDATE SET
    hostname = EXCLUDED.hostname,
    status = EXCLUDED.status,
    last_heartbeat = EXCLUDED.last_heartbeat,
    running = EXCLUDED.running,
    capacity = EXCLUDED.capacity,
    queues = EXCLUDED.queues,
    updated_at = EXCLUDED.updated_at
WHERE EXCLUDED.last_heartbeat >= w.last_heartbeat;

-- name: upsert_definition
INSERT INTO job_definitions AS d (
    job_id, name, type, schedule, interval_seconds, run_at, timezone, start_at, end_at,
    depends_on, trigger_rule, condition, requires_approval, handler, params, max_retries,
    retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority, queue,
    concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, created_by, created_at,
    deleted_at, next_execution_at, updated_at, definition, version, definition_offset,
    calendar, on_excluded, jitter_seconds, max_runs)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::jsonb, $16, $17, $18,
        $19, $20, $21, $22, $23, $24, $25, $26, $27, NULL, $28, $29, $30::jsonb, $31, $32,
        $33, $34, $35, $36)
ON CONFLICT (job_id) DO UPDATE SET
    name = EXCLUDED.name, type = EXCLUDED.type, schedule = EXCLUDED.schedule,
    interval_seconds = EXCLUDED.interval_seconds, run_at = EXCLUDED.run_at,
    timezone = EXCLUDED.timezone, start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at,
    depends_on = EXCLUDED.depends_on, trigger_rule = EXCLUDED.trigger_rule,
    condition = EXCLUDED.condition, requires_approval = EXCLUDED.requires_approval,
    handler = EXCLUDED.handler, params = EXCLUDED.params, max_retries = EXCLUDED.max_retries,
    retry_delay_seconds = EXCLUDED.retry_delay_seconds,
    max_retry_delay_seconds = EXCLUDED.max_retry_delay_seconds,
    timeout_seconds = EXCLUDED.timeout_seconds, priority = EXCLUDED.priority,
    queue = EXCLUDED.queue, concurrency_policy = EXCLUDED.concurrency_policy,
    misfire_policy = EXCLUDED.misfire_policy,
    misfire_grace_seconds = EXCLUDED.misfire_grace_seconds, enabled = EXCLUDED.enabled,
    created_by = EXCLUDED.created_by, created_at = COALESCE(EXCLUDED.created_at, d.created_at),
    deleted_at = NULL, next_execution_at = EXCLUDED.next_execution_at,
    updated_at = EXCLUDED.updated_at, definition = EXCLUDED.definition,
    version = COALESCE(EXCLUDED.version, d.version), definition_offset = EXCLUDED.definition_offset,
    calendar = EXCLUDED.calendar, on_excluded = EXCLUDED.on_excluded,
    jitter_seconds = EXCLUDED.jitter_seconds, max_runs = EXCLUDED.max_runs;

-- name: delete_definition
UPDATE job_definitions SET deleted_at = $2, next_execution_at = NULL, updated_at = $2,
                           version = COALESCE($3, version)
WHERE job_id = $1 AND deleted_at IS NULL;

-- name: insert_definition_version
-- The next version of job $1 from the record at offset $5: a definition ($2), or a delete
-- ($2 NULL) of a job whose latest version is not a delete already. Returns the version, or
-- nothing (a delete of nothing; the record projected already).
WITH latest AS (
    SELECT version, definition IS NULL AS deleted FROM job_definition_versions
    WHERE job_id = $1 ORDER BY version DESC LIMIT 1
)
INSERT INTO job_definition_versions (job_id, version, definition, created_by, recorded_at,
                                     kafka_offset)
SELECT $1, COALESCE((SELECT version FROM latest), 0) + 1, $2::jsonb, $3, $4, $5
WHERE $2::jsonb IS NOT NULL OR EXISTS (SELECT 1 FROM latest WHERE NOT deleted)
ON CONFLICT (job_id, kafka_offset) DO NOTHING
RETURNING version;

-- name: resolve_version_of_executions
-- Executions of job $1 projected before the version $3 of the record at offset $2.
UPDATE job_executions SET definition_version = $3
WHERE job_id = $1 AND definition_offset = $2 AND definition_version IS NULL;

-- name: unresolved_definition_versions
-- Executions whose definition version was projected in a transaction that overlapped
-- theirs (two monitors): what resolve_version_of_executions could not see yet.
SELECT e.execution_id, v.version
FROM job_executions e
JOIN job_definition_versions v ON v.job_id = e.job_id AND v.kafka_offset = e.definition_offset
WHERE e.definition_version IS NULL AND e.definition_offset IS NOT NULL
LIMIT 10000;

-- name: set_definition_versions
UPDATE job_executions e SET definition_version = u.version
FROM unnest($1::uuid[], $2::int[]) AS u(execution_id, version)
WHERE e.execution_id = u.execution_id AND e.definition_version IS NULL;

-- name: delete_dependencies
DELETE FROM job_dependencies WHERE downstream_job_id = $1;

-- name: insert_dependencies
INSERT INTO job_dependencies (downstream_job_id, upstream_job_id)
SELECT $1, u FROM unnest($2::text[]) AS u
ON CONFLICT DO NOTHING;

-- name: load_offsets
SELECT topic, partition, next_offset FROM consumer_offsets WHERE consumer = $1;

-- name: store_offsets
INSERT INTO consumer_offsets (consumer, topic, partition, next_offset)
SELECT $1, o.topic, o.partition, o.next_offset
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS o(topic, partition, next_offset)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset;

-- name: recent_executions
SELECT execution_id, job_id, status, scheduled_at, started_at, completed_at, worker_id,
       attempt_number, progress, progress_message, error_message
FROM job_executions
WHERE ($1::text IS NULL OR job_id = $1)
ORDER BY scheduled_at DESC, job_id
LIMIT $2;

-- name: workers_overview
SELECT worker_id, hostname, status, last_heartbeat, cardinality(running) AS running, capacity,
       queues
FROM workers ORDER BY worker_id;

-- name: lock_migrations
SELECT pg_advisory_lock($1);

-- name: unlock_migrations
SELECT pg_advisory_unlock($1);

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
SELECT version FROM schema_migrations;

-- name: record_migration
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);

-- name: grant_roles
-- After every migration run: the roles of least privilege get what they need of every
-- table, those a later migration added included (migration 0008).
SELECT cronstream_grant_roles();

-- name: executions_at
SELECT scheduled_at FROM job_executions
WHERE job_id = $1 AND attempt_number = 1 AND scheduled_at = ANY($2::timestamptz[]);

-- name: execution_by_id
SELECT execution_id, job_id, run_id, status, scheduled_at, attempt_number, delivery
FROM job_executions WHERE execution_id = $1;

-- name: dag_downstreams
SELECT d.job_id, d.definition, d.definition_offset
FROM job_dependencies dep
JOIN job_definitions d ON d.job_id = dep.downstream_job_id
WHERE dep.upstream_job_id = $1 AND d.deleted_at IS NULL AND d.enabled;

-- name: run_states
-- The latest attempt of each of the given jobs in one run.
SELECT DISTINCT ON (job_id) job_id, execution_id, status, result, traceparent
FROM job_executions
WHERE run_id = $1 AND job_id = ANY($2::text[])
ORDER BY job_id, attempt_number DESC, updated_at DESC;

-- name: claim_evaluation
INSERT INTO dag_evaluations (run_id, job_id, execution_id, decision, detail, upstream_executions)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (run_id, job_id) DO NOTHING
RETURNING execution_id;

-- name: awaiting_execution
SELECT execution_id, job_id, run_id, scheduled_at, attempt_number, delivery, idempotency_key, job,
       traceparent, reason, triggered_by
FROM job_executions WHERE execution_id = $1 AND status = 'AWAITING_APPROVAL';

-- name: waiting_execution
-- An execution held back by flow control (decision 0056): a CANCEL ends it here, since no
-- worker has its work record yet.
SELECT execution_id, job_id, run_id, scheduled_at, attempt_number, delivery, idempotency_key, job,
       traceparent, reason, triggered_by, waiting_reason
FROM job_executions WHERE execution_id = $1 AND status = 'WAITING';

-- name: step_upstream
-- The upstream executions DAG step $2 of run $1 saw when it was decided, in its
-- depends_on order, as they are now (final: they do not change).
SELECT u.job_id, u.execution_id, u.status, u.result::text AS result
FROM dag_evaluations ev
CROSS JOIN LATERAL unnest(ev.upstream_executions) WITH ORDINALITY AS x(execution_id, n)
JOIN job_executions u ON u.execution_id = x.execution_id
WHERE ev.run_id = $1 AND ev.job_id = $2
ORDER BY x.n;

-- name: run_first_attempts
-- The first attempts of run $1, among them its root's (the one whose run id its job and
-- scheduled_at derive: advance.py), with the params each ran with.
SELECT job_id, scheduled_at, (job->'params')::text AS params
FROM job_executions WHERE run_id = $1 AND attempt_number = 1;

-- name: dead_workers
SELECT worker_id, last_heartbeat FROM workers
WHERE status <> 'OFFLINE' AND last_heartbeat < now() - make_interval(secs => $1);

-- name: running_on_worker_before
-- RUNNING executions of a fenced worker, except those whose start (the RUNNING event of
-- their current delivery) lies at or past $2, the high watermarks of execution-events
-- (index = partition) read right after the fence: those were started by a process that
-- took the worker's transactional.id after it (housekeeping.py). A start no longer in
-- execution_events (pruned) counts as before.
SELECT e.execution_id, e.job_id, e.run_id, e.scheduled_at, e.attempt_number, e.delivery,
       e.idempotency_key, e.worker_id, e.reason, COALESCE(e.job, d.definition) AS job,
       e.job IS NULL AS from_definition, e.traceparent, e.triggered_by
FROM job_executions e
LEFT JOIN job_definitions d ON d.job_id = e.job_id
WHERE e.status = 'RUNNING' AND e.worker_id = $1
  AND NOT EXISTS (
      SELECT 1 FROM execution_events v
      WHERE v.execution_id = e.execution_id AND v.status = 'RUNNING'
        AND v.delivery = e.delivery
        AND v.kafka_offset >= ($2::bigint[])[v.kafka_partition + 1]);

-- name: mark_workers_offline
UPDATE workers SET status = 'OFFLINE', running = '{}', updated_at = now()
WHERE worker_id = ANY($1::text[]) AND status <> 'OFFLINE';

-- name: due_for_next_execution
-- The columns of schedule.StoredTiming, in its order (after the job_id).
SELECT job_id, type, schedule, interval_seconds, run_at, timezone, start_at, end_at, job_id,
       jitter_seconds, calendar, on_excluded
FROM job_definitions
WHERE deleted_at IS NULL AND enabled AND type <> 'DEPENDENT' AND next_execution_at < now()
LIMIT 10000;

-- name: set_next_execution
UPDATE job_definitions d SET next_execution_at = u.next_at
FROM unnest($1::text[], $2::timestamptz[]) AS u(job_id, next_at)
WHERE d.job_id = u.job_id;

-- name: upsert_queue_depth
INSERT INTO queue_depth (priority, queue, depth, measured_at)
SELECT q.priority, q.queue, q.depth, now()
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS q(priority, queue, depth)
ON CONFLICT (priority, queue) DO UPDATE SET depth = EXCLUDED.depth,
                                            measured_at = EXCLUDED.measured_at;

-- name: ensure_offsets
INSERT INTO consumer_offsets (consumer, topic, partition, next_offset)
SELECT $1, o.topic, o.partition, o.next_offset
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS o(topic, partition, next_offset)
ON CONFLICT (consumer, topic, partition) DO NOTHING;

-- name: lock_offsets
-- Taken first in every projection transaction, in a fixed order: two monitors never
-- project the same partition at once, and a batch read before a rebalance is recognised
-- as stale when the partition's new owner has already gone past its start.
SELECT topic, partition, next_offset FROM consumer_offsets
WHERE consumer = $1 AND (topic, partition) IN (
    SELECT * FROM unnest($2::text[], $3::int[]))
ORDER BY topic, partition
FOR UPDATE;

-- name: upsert_alerts
-- One row per episode: a RESOLVED record closes what FIRING opened; a repeat changes nothing.
INSERT INTO alerts AS a (alert_id, kind, severity, state, job_id, queue, execution_id, run_id,
                         summary, error_message, evidence, fired_at, resolved_at, updated_at,
                         kafka_partition, kafka_offset)
SELECT x.alert_id, x.kind, x.severity, x.state, x.job_id, x.queue, x.execution_id, x.run_id,
       x.summary, x.error_message, x.evidence::jsonb, x.raised_at,
       CASE WHEN x.state = 'RESOLVED' THEN x.raised_at END, now(), x.kafka_partition,
       x.kafka_offset
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::uuid[],
            $8::uuid[], $9::text[], $10::text[], $11::text[], $12::timestamptz[], $13::int[],
            $14::bigint[])
     AS x(alert_id, kind, severity, state, job_id, queue, execution_id, run_id, summary,
          error_message, evidence, raised_at, kafka_partition, kafka_offset)
ON CONFLICT (alert_id) DO UPDATE SET
    state = EXCLUDED.state,
    resolved_at = EXCLUDED.resolved_at,
    evidence = CASE WHEN EXCLUDED.state = 'RESOLVED' THEN a.evidence || EXCLUDED.evidence
                    ELSE a.evidence END,
    updated_at = EXCLUDED.updated_at
WHERE a.state = 'FIRING' AND EXCLUDED.state = 'RESOLVED';

-- name: recent_alerts
SELECT alert_id, kind, severity, state, job_id, queue, execution_id, summary, error_message,
       evidence, fired_at, resolved_at
FROM alerts
WHERE ($1::text IS NULL OR state = $1)
ORDER BY fired_at DESC
LIMIT $2;

-- name: workers_by_status
SELECT status, count(*) AS n FROM workers GROUP BY status;

-- name: lock_run
-- DAG joins: two monitors may make the last upstreams of one run final at the same time,
-- each in its own transaction. Whoever takes this lock second reads run_states after the
-- first committed, so one of them always sees every upstream final (never both skip).
SELECT pg_advisory_xact_lock(hashtextextended($1::text, 7));

-- name: claim_decision
INSERT INTO execution_decisions (execution_id, decision, decided_by)
VALUES ($1, $2, $3)
ON CONFLICT (execution_id) DO NOTHING
RETURNING execution_id;

-- name: retryable_failures
-- Recent FAILED / TIMED_OUT attempts of a job, with what computing their retry needs.
SELECT execution_id, run_id, attempt_number, COALESCE(e.job, d.definition) AS job,
       e.job IS NULL AS from_definition
FROM job_executions e
LEFT JOIN job_definitions d USING (job_id)
WHERE e.job_id = $1 AND e.status IN ('FAILED', 'TIMED_OUT')
ORDER BY e.completed_at DESC
LIMIT 100;

-- name: orphan_candidates
-- RUNNING executions that their (live) worker's latest heartbeat, sent well after they
-- started, does not list: the worker does not run them (housekeeping.py says when that
-- is certain).
SELECT e.execution_id, e.job_id, e.run_id, e.scheduled_at, e.attempt_number, e.delivery,
       e.idempotency_key, e.worker_id, e.reason, COALESCE(e.job, d.definition) AS job,
       e.job IS NULL AS from_definition, e.traceparent, e.triggered_by
FROM job_executions e
JOIN workers w ON w.worker_id = e.worker_id
LEFT JOIN job_definitions d ON d.job_id = e.job_id
WHERE e.status = 'RUNNING' AND w.status <> 'OFFLINE'
  AND w.last_heartbeat > e.started_at + make_interval(secs => $1)
  AND NOT (e.execution_id = ANY(w.running))
LIMIT 10000;

-- name: still_running
SELECT execution_id, delivery FROM job_executions
WHERE execution_id = ANY($1::uuid[]) AND status = 'RUNNING';

-- Reads for the CLI and the SDK (issue 14). Read-only, so they run on any replica.

-- name: list_executions
SELECT execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at, queued_at,
       started_at, completed_at, worker_id, progress, progress_message, error_message,
       result::text AS result, priority, queue, reason, approved_by, rejected_by, cancelled_by,
       updated_at, triggered_by, definition_version, (job->'params')::text AS params,
       waiting_reason
FROM job_executions
WHERE ($1::text IS NULL OR job_id = $1) AND ($2::text IS NULL OR status = $2)
ORDER BY scheduled_at DESC, job_id, attempt_number DESC
LIMIT $3;

-- name: get_execution
SELECT execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at, queued_at,
       started_at, completed_at, worker_id, progress, progress_message, error_message,
       result::text AS result, priority, queue, reason, approved_by, rejected_by, cancelled_by,
       updated_at, triggered_by, definition_version, (job->'params')::text AS params,
       waiting_reason
FROM job_executions WHERE execution_id = $1;

-- name: execution_timeline
SELECT event_id, status, attempt_number, delivery, occurred_at, worker_id, error_message,
       progress, progress_message, kafka_partition, kafka_offset
FROM execution_events WHERE execution_id = $1
ORDER BY occurred_at, kafka_partition, kafka_offset;

-- name: attempt_of
-- The execution of attempt $2 in the run of execution $1 (same job, same run).
SELECT other.execution_id
FROM job_executions this
JOIN job_executions other ON other.job_id = this.job_id AND other.run_id = this.run_id
WHERE this.execution_id = $1 AND other.attempt_number = $2;

-- name: log_lines
-- An execution's log after the line ($2 delivery, $3 seq), in order: every delivery, each
-- from its first line (a requeued execution's earlier deliveries come first).
SELECT execution_id, delivery, seq, attempt_number, at, stream, level, line, worker_id, trace_id
FROM execution_logs
WHERE execution_id = $1 AND (delivery, seq) > ($2, $3)
ORDER BY delivery, seq
LIMIT $4;

-- name: execution_trigger_events
-- Where the records of an event trigger's run are (its projected snapshot's events), in
-- the run's order: topic, partition, offset.
SELECT e->>'topic' AS topic, (e->>'partition')::int AS partition, (e->>'offset')::bigint AS "offset"
FROM job_executions je, jsonb_array_elements(
    CASE WHEN jsonb_typeof(je.job->'events') = 'array' THEN je.job->'events' ELSE '[]'::jsonb END) e
WHERE je.execution_id = $1;

-- name: log_state
-- Where an execution's log stands: its status and delivery, how many lines the latest
-- delivery has, and whether that delivery's log ended (its last batch projected).
SELECT je.status, je.delivery,
       (SELECT count(*) FROM execution_logs l
        WHERE l.execution_id = je.execution_id AND l.delivery = je.delivery) AS lines,
       EXISTS (SELECT 1 FROM execution_log_ends e
               WHERE e.execution_id = je.execution_id AND e.delivery = je.delivery) AS ended
FROM job_executions je WHERE je.execution_id = $1;

-- name: last_traceback
-- The traceback of an execution's latest delivery that has one.
SELECT line FROM execution_logs
WHERE execution_id = $1 AND stream = 'traceback'
ORDER BY delivery DESC, seq DESC LIMIT 1;

-- name: run_executions
-- Every execution of one run (its DAG steps and their attempts), in the order they began.
SELECT execution_id, job_id, status, attempt_number, scheduled_at, completed_at
FROM job_executions WHERE run_id = $1
ORDER BY scheduled_at, job_id, attempt_number;

-- name: get_definition
SELECT definition::text AS definition, next_execution_at, updated_at, version
FROM job_definitions WHERE job_id = $1 AND deleted_at IS NULL;

-- name: job_downstream_ids
SELECT downstream_job_id FROM job_dependencies WHERE upstream_job_id = $1
ORDER BY downstream_job_id;

-- name: jobs_list
SELECT job_id, type, schedule_text AS schedule, timezone, handler, queue, priority, enabled,
       next_execution_at, last_status, last_scheduled_at, finished_24h, succeeded_24h, updated_at
FROM job_overview
ORDER BY job_id;

-- name: alerts_list
SELECT alert_id, kind, severity, state, job_id, queue, execution_id, run_id, summary,
       error_message, evidence::text AS evidence, fired_at, resolved_at
FROM alerts
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR job_id = $2)
ORDER BY fired_at DESC
LIMIT $3;

-- name: dag_upstreams_among
-- Which of these jobs some DEPENDENT job waits for (read in the projection's transaction:
-- every monitor sees the dependencies, whichever of them projected the definitions).
SELECT DISTINCT upstream_job_id FROM job_dependencies WHERE upstream_job_id = ANY($1::text[]);

-- name: postmaster_started
SELECT pg_postmaster_start_time();

-- name: insert_calendar_version
-- The next version of calendar $1 from the record at offset $5: a calendar ($2), or a delete
-- ($2 NULL) of one whose latest version is not a delete already (insert_definition_version).
WITH latest AS (
    SELECT version, definition IS NULL AS deleted FROM calendar_versions
    WHERE calendar_id = $1 ORDER BY version DESC LIMIT 1
)
INSERT INTO calendar_versions (calendar_id, version, definition, created_by, recorded_at,
                               kafka_offset)
SELECT $1, COALESCE((SELECT version FROM latest), 0) + 1, $2::jsonb, $3, $4, $5
WHERE $2::jsonb IS NOT NULL OR EXISTS (SELECT 1 FROM latest WHERE NOT deleted)
ON CONFLICT (calendar_id, kafka_offset) DO NOTHING
RETURNING version;

-- name: upsert_calendar
-- The current form of calendar $1 at version $4 ($3 NULL: deleted at $6).
INSERT INTO calendars AS c (calendar_id, timezone, definition, version, created_by, updated_at,
                            deleted_at)
VALUES ($1, $2, $3::jsonb, $4, $5, $6::timestamptz, CASE WHEN $3::jsonb IS NULL THEN $6::timestamptz END)
ON CONFLICT (calendar_id) DO UPDATE SET
    timezone = COALESCE(EXCLUDED.timezone, c.timezone), definition = EXCLUDED.definition,
    version = EXCLUDED.version, created_by = EXCLUDED.created_by,
    updated_at = EXCLUDED.updated_at, deleted_at = EXCLUDED.deleted_at;

-- name: replan_calendar_jobs
-- The jobs of calendar $1 are due for a new next run (housekeeping computes it): a calendar
-- change re-plans every job that names it.
UPDATE job_definitions SET next_execution_at = '-infinity'
WHERE calendar = $1 AND deleted_at IS NULL AND enabled;

-- name: calendar_documents
-- The current calendars of ids $1 (the definitions' next runs and the timeline need them).
SELECT calendar_id, definition::text AS definition FROM calendars
WHERE calendar_id = ANY($1::text[]) AND definition IS NOT NULL;

-- name: calendars_list
-- Every calendar (deleted ones too: $1), with how many live jobs name it.
SELECT c.calendar_id, c.timezone, c.definition::text AS definition, c.version, c.created_by,
       c.updated_at, c.deleted_at,
       (SELECT count(*) FROM job_definitions d
        WHERE d.calendar = c.calendar_id AND d.deleted_at IS NULL) AS jobs
FROM calendars c
WHERE $1 OR c.deleted_at IS NULL
ORDER BY c.calendar_id;

-- name: pool_usage
-- Per pool, as projected: the slots its executions hold (statuses.HOLDING) and how many
-- wait (WAITING) — what `cronstream pools` shows beside each pool's size.
SELECT job->>'pool' AS pool,
       COALESCE(sum(COALESCE((job->>'pool_slots')::int, 1))
                FILTER (WHERE status IN ('QUEUED', 'RUNNING')), 0)::int AS in_use,
       count(*) FILTER (WHERE status = 'WAITING')::int AS waiting
FROM job_executions
WHERE (status = 'WAITING' OR status IN ('QUEUED', 'RUNNING')) AND job->>'pool' IS NOT NULL
GROUP BY 1;

-- name: calendar_history
-- Every version of a calendar, oldest first (`cronstream calendar history`).
SELECT calendar_id, version, definition::text AS definition, created_by, recorded_at, kafka_offset
FROM calendar_versions WHERE calendar_id = $1
ORDER BY version;

-- name: definition_history
-- Every version of a job's definition kept (docs/reference/operations.md#definition-history: `cronstream history`), oldest first.
SELECT job_id, version, definition::text AS definition, created_by, recorded_at, kafka_offset
FROM job_definition_versions WHERE job_id = $1
ORDER BY version;

-- name: definition_version
SELECT job_id, version, definition::text AS definition, created_by, recorded_at, kafka_offset
FROM job_definition_versions WHERE job_id = $1 AND version = $2;
