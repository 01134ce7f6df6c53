-- Named queries of the web dashboard (`cronstream ui`); loaded by cronstream.shared.db
-- (`query(name, "ui.sql")`). Read-only: only the monitor writes the projection.
-- Every page is bounded: keyset pagination, LIMITs, and index-backed lookups
-- (docs/decisions/0040-web-dashboard.md); bench/ui.py times them on 100,000 jobs and
-- 1,000,000 executions.

-- name: jobs_scan
-- Which jobs a Jobs page shows: keyset on job_id after $1, filtered. The status filter
-- (last status) needs one index probe per job, so at most $6 jobs are scanned per page;
-- the caller continues from scanned_to when the scan ran out before the page filled.
WITH scanned AS (
    SELECT d.job_id FROM job_definitions d
    WHERE d.deleted_at IS NULL AND d.job_id > $1
      AND ($2::text IS NULL OR d.job_id ILIKE $2 OR d.name ILIKE $2)
      AND ($3::text IS NULL OR d.queue = $3)
      AND ($4::boolean IS NULL OR d.enabled = NOT $4)
    ORDER BY d.job_id
    LIMIT $6),
matched AS (
    SELECT s.job_id FROM scanned s
    WHERE $5::text IS NULL
       OR $5 = (SELECT e.status FROM job_executions e WHERE e.job_id = s.job_id
                ORDER BY e.scheduled_at DESC LIMIT 1)
    ORDER BY s.job_id
    LIMIT $7)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT max(job_id) FROM scanned) AS scanned_to,
       ARRAY(SELECT job_id FROM matched ORDER BY job_id) AS job_ids;

-- name: jobs_rows
-- One Jobs page: each job's last 20 runs (the sparkline; the last one is its last
-- status) and its 24 h success rate (job_overview), through the (job_id, scheduled_at) index.
SELECT o.job_id, o.name, o.type, o.schedule, o.interval_seconds, o.run_at, o.timezone,
       o.depends_on, o.queue, o.priority, o.enabled, o.next_execution_at, o.handler,
       recent.statuses, recent.durations, o.finished_24h AS finished, o.succeeded_24h AS succeeded
FROM job_overview o
LEFT JOIN LATERAL (
    SELECT array_agg(r.status ORDER BY r.scheduled_at) AS statuses,
           array_agg(extract(epoch FROM r.completed_at - r.started_at)::float8
                     ORDER BY r.scheduled_at) AS durations
    FROM (SELECT status, scheduled_at, started_at, completed_at FROM job_executions e
          WHERE e.job_id = o.job_id ORDER BY e.scheduled_at DESC LIMIT 20) r) recent ON true
WHERE o.job_id = ANY($1::text[])
ORDER BY o.job_id;

-- name: jobs_count
SELECT count(*) AS n FROM job_definitions WHERE deleted_at IS NULL;

-- name: queues
SELECT DISTINCT queue FROM job_definitions WHERE deleted_at IS NULL ORDER BY queue LIMIT 200;

-- name: job
SELECT job_id, name, type, schedule, interval_seconds, run_at, timezone, start_at, end_at,
       depends_on, trigger_rule, condition, requires_approval, handler, params::text AS params,
       max_retries, retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority,
       queue, concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, created_by,
       created_at, deleted_at, next_execution_at, updated_at, definition::text AS definition,
       version
FROM job_definitions WHERE job_id = $1;

-- name: job_versions
-- A job's latest versions (history), newest first.
SELECT job_id, version, definition::text AS definition, created_by, recorded_at, kafka_offset
FROM job_definition_versions WHERE job_id = $1
ORDER BY version DESC
LIMIT $2;

-- name: job_versions_among
SELECT job_id, version, definition::text AS definition, created_by, recorded_at, kafka_offset
FROM job_definition_versions WHERE job_id = $1 AND version = ANY($2::int[])
ORDER BY version;

-- name: job_runs
-- A job's executions, newest first, keyset on scheduled_at (before $2).
SELECT execution_id, run_id, status, attempt_number, delivery, scheduled_at, started_at,
       completed_at, worker_id, reason, left(error_message, 300) AS error_message,
       progress, progress_message, triggered_by, definition_version
FROM job_executions
WHERE job_id = $1 AND scheduled_at < $2
ORDER BY scheduled_at DESC
LIMIT $3;

-- name: job_durations
-- The typical duration of a job: its last 100 completed runs.
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY d) AS p95,
       count(*) AS n
FROM (SELECT extract(epoch FROM completed_at - started_at)::float8 AS d
      FROM job_executions
      WHERE job_id = $1 AND status = 'COMPLETED' AND started_at IS NOT NULL
      ORDER BY scheduled_at DESC
      LIMIT 100) recent;

-- name: job_alerts
SELECT alert_id, kind, severity, state, execution_id, left(summary, 300) AS summary,
       left(error_message, 300) AS error_message, fired_at, resolved_at
FROM alerts WHERE job_id = $1
ORDER BY fired_at DESC
LIMIT $2;

-- name: job_upstreams
SELECT upstream_job_id FROM job_dependencies WHERE downstream_job_id = $1 ORDER BY 1;

-- name: job_downstreams
SELECT downstream_job_id FROM job_dependencies WHERE upstream_job_id = $1 ORDER BY 1 LIMIT 200;

-- name: active_counts
SELECT status, count(*) AS n FROM job_executions
WHERE status IN ('WAITING', 'QUEUED', 'RUNNING', 'AWAITING_APPROVAL')
GROUP BY status;

-- name: active
-- Executions in one live state (partial index job_executions_active), newest first.
SELECT execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
       queued_at, started_at, completed_at, worker_id, progress,
       left(progress_message, 200) AS progress_message, left(error_message, 200) AS error_message,
       left(waiting_reason, 200) AS waiting_reason
FROM job_executions
WHERE status = $1
ORDER BY scheduled_at DESC
LIMIT $2;

-- name: pool_executions
-- The executions of pooled jobs that hold a slot (statuses.HOLDING) or wait for one
-- (WAITING), oldest first: the Pools page.
SELECT execution_id, job_id, status, attempt_number, scheduled_at, queued_at, started_at,
       worker_id, left(waiting_reason, 200) AS waiting_reason, job->>'pool' AS pool,
       COALESCE((job->>'pool_slots')::int, 1) AS slots
FROM job_executions
WHERE (status = 'WAITING' OR status IN ('QUEUED', 'RUNNING')) AND job->>'pool' IS NOT NULL
ORDER BY scheduled_at
LIMIT $1;

-- name: recent_terminal
-- Executions that ended, latest first (index job_executions_completed, migration 0006).
SELECT execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
       queued_at, started_at, completed_at, worker_id, progress,
       left(progress_message, 200) AS progress_message, left(error_message, 200) AS error_message
FROM job_executions
WHERE completed_at IS NOT NULL
ORDER BY completed_at DESC
LIMIT $1;

-- name: execution
SELECT e.execution_id, e.job_id, e.run_id, e.status, e.attempt_number, e.delivery,
       e.scheduled_at, e.queued_at, e.started_at, e.completed_at, e.worker_id,
       left(e.error_message, 8192) AS error_message, e.progress, e.progress_message,
       e.priority, e.queue, e.reason, e.idempotency_key, e.trace_id, e.approved_by,
       e.rejected_by, e.cancelled_by, e.updated_at,
       left(e.result::text, $2) AS result, length(e.result::text) AS result_chars,
       e.triggered_by, e.definition_version, left((e.job->'params')::text, $2) AS params,
       left(e.waiting_reason, 2000) AS waiting_reason
FROM job_executions e WHERE e.execution_id = $1;

-- name: execution_trigger_records
-- An event trigger's run: its records (the projected snapshot's events), in the run's
-- order, without their values (the handler's ctx.events has them).
SELECT e->>'topic' AS topic, (e->>'partition')::int AS partition, (e->>'offset')::bigint AS "offset",
       (e->>'timestamp')::timestamptz AS written_at, left(e->>'key', 200) AS key
FROM job_executions je, jsonb_array_elements(
    CASE WHEN jsonb_typeof(je.job->'events') = 'array' THEN je.job->'events' ELSE '[]'::jsonb END)
    WITH ORDINALITY AS r(e, n)
WHERE je.execution_id = $1
ORDER BY r.n
LIMIT $2;

-- name: execution_events
SELECT event_id, status, attempt_number, delivery, occurred_at, worker_id,
       left(error_message, 2000) AS error_message, progress, left(progress_message, 300) AS progress_message,
       left(result::text, 500) AS result, kafka_partition, kafka_offset, trace_id
FROM execution_events
WHERE execution_id = $1
ORDER BY kafka_partition, kafka_offset
LIMIT $2;

-- name: execution_log_tail
-- The last $2 lines of an execution's log (its traceback aside), oldest first, each cut for
-- the page; the whole log: `cronstream logs`.
SELECT * FROM (
    SELECT delivery, seq, at, stream, level, left(line, 20000) AS line
    FROM execution_logs
    WHERE execution_id = $1 AND stream <> 'traceback'
    ORDER BY delivery DESC, seq DESC
    LIMIT $2) tail
ORDER BY delivery, seq;

-- name: execution_log_state
-- How many lines an execution's log has, whether its latest delivery's log ended, and its
-- latest traceback.
SELECT e.status,
       (SELECT count(*) FROM execution_logs l
        WHERE l.execution_id = e.execution_id AND l.stream <> 'traceback') AS lines,
       EXISTS (SELECT 1 FROM execution_log_ends x
               WHERE x.execution_id = e.execution_id AND x.delivery = e.delivery) AS ended,
       (SELECT left(line, 70000) FROM execution_logs t
        WHERE t.execution_id = e.execution_id AND t.stream = 'traceback'
        ORDER BY delivery DESC, seq DESC LIMIT 1) AS traceback
FROM job_executions e WHERE e.execution_id = $1;

-- name: run_attempts
-- Every execution of one job in one run (its attempts).
SELECT execution_id, status, attempt_number, scheduled_at, started_at, completed_at, worker_id
FROM job_executions
WHERE run_id = $1 AND job_id = $2
ORDER BY attempt_number
LIMIT 200;

-- name: run_executions
-- The latest attempt of each job in a run, with the number of attempts.
SELECT DISTINCT ON (e.job_id) e.execution_id, e.job_id, e.status, e.attempt_number,
       e.scheduled_at, e.started_at, e.completed_at, e.worker_id,
       left(e.error_message, 500) AS error_message, left(e.result::text, 2000) AS result,
       e.reason, e.approved_by, e.rejected_by, e.cancelled_by,
       count(*) OVER (PARTITION BY e.job_id) AS attempts
FROM job_executions e
WHERE e.run_id = $1
ORDER BY e.job_id, e.attempt_number DESC, e.updated_at DESC
LIMIT 1000;

-- name: run_evaluations
SELECT job_id, execution_id, decision, detail, decided_at
FROM dag_evaluations WHERE run_id = $1
LIMIT 1000;

-- name: dag_of
-- The DAG below a root job: the root and every DEPENDENT job downstream of it (UNION
-- stops at a cycle; the CLI and the scheduler refuse them anyway).
WITH RECURSIVE down(job_id) AS (
    SELECT $1::text
    UNION
    SELECT dep.downstream_job_id FROM job_dependencies dep JOIN down ON dep.upstream_job_id = down.job_id)
SELECT d.job_id, d.type, d.depends_on, d.trigger_rule, d.condition, d.requires_approval,
       d.deleted_at
FROM down JOIN job_definitions d USING (job_id)
LIMIT 500;

-- name: job_types
SELECT job_id, type FROM job_definitions WHERE job_id = ANY($1::text[]);

-- name: workers
SELECT worker_id, hostname, status, last_heartbeat, cardinality(running) AS busy, capacity,
       queues, extract(epoch FROM now() - last_heartbeat)::float8 AS age_seconds
FROM workers
ORDER BY status = 'OFFLINE', worker_id
LIMIT $1;

-- name: queue_depth
SELECT queue, priority, depth, measured_at FROM queue_depth ORDER BY queue, priority LIMIT 500;

-- name: alerts
-- Alerts, newest first, keyset on fired_at (before $2); $1 = FIRING, RESOLVED or NULL.
SELECT alert_id, kind, severity, state, job_id, queue, execution_id, run_id,
       left(summary, 500) AS summary, left(error_message, 500) AS error_message,
       left(evidence::text, 500) AS evidence, fired_at, resolved_at
FROM alerts
WHERE ($1::text IS NULL OR state = $1) AND fired_at < $2
ORDER BY fired_at DESC
LIMIT $3;

-- name: firing_count
SELECT count(*) AS n FROM alerts WHERE state = 'FIRING';

-- name: timeline_jobs
-- The jobs of one Timeline page (keyset on job_id), with what projection needs: the
-- definition, the last scheduled fire (misfire rules) and the typical duration.
SELECT d.job_id, d.definition::text AS definition, d.enabled,
       (SELECT max(e.scheduled_at) FROM job_executions e
        WHERE e.job_id = d.job_id AND e.attempt_number = 1 AND e.reason = 'SCHEDULE'
          AND e.scheduled_at > now() - interval '7 days') AS last_fire,
       typical.p50
FROM job_definitions d
LEFT JOIN LATERAL (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x.d) AS p50
    FROM (SELECT extract(epoch FROM completed_at - started_at)::float8 AS d
          FROM job_executions e
          WHERE e.job_id = d.job_id AND e.status = 'COMPLETED' AND e.started_at IS NOT NULL
          ORDER BY e.scheduled_at DESC
          LIMIT 100) x) typical ON true
WHERE d.deleted_at IS NULL AND d.job_id > $1
  AND ($2::text IS NULL OR d.job_id ILIKE $2 OR d.name ILIKE $2)
  AND ($3::text IS NULL OR d.queue = $3)
ORDER BY d.job_id
LIMIT $4;

-- name: timeline_past
-- Past runs of the page's jobs in the window, folded into $4 buckets per job: when the
-- runs of a bucket started and ended, how many, and whether any failed.
SELECT job_id,
       width_bucket(extract(epoch FROM scheduled_at), extract(epoch FROM $2::timestamptz),
                    extract(epoch FROM $3::timestamptz), $4) AS bucket,
       count(*) AS n,
       min(COALESCE(started_at, scheduled_at)) AS first_start,
       max(COALESCE(completed_at, now())) AS last_end,
       bool_or(status IN ('FAILED', 'TIMED_OUT', 'PERMANENTLY_FAILED')) AS failed,
       bool_or(status IN ('WAITING', 'QUEUED', 'RUNNING', 'AWAITING_APPROVAL')) AS active
FROM job_executions
WHERE job_id = ANY($1::text[]) AND scheduled_at >= $2 AND scheduled_at < $3
GROUP BY job_id, bucket;

-- name: calendar_documents
-- The current calendars of ids $1: the timeline and a job's next fires apply them.
SELECT calendar_id, definition::text AS definition FROM calendars
WHERE calendar_id = ANY($1::text[]) AND definition IS NOT NULL;

-- name: ping
SELECT 1;
