-- Seeding for bench/ui.py: a large install, set-based (generate_series), never row by row.
-- $1 = jobs, $2 = executions. Jobs job-000001 ... ; 90% of the executions belong to the
-- first 1,000 jobs (busy jobs: ~900 runs each, on the first Jobs and Timeline pages), the
-- rest spread over every job; scheduled over the last 7 days.

-- name: seed_jobs
INSERT INTO job_definitions (
    job_id, name, type, schedule, interval_seconds, timezone, depends_on, trigger_rule, handler,
    params, max_retries, retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority,
    queue, concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, created_by,
    created_at, next_execution_at, updated_at, definition)
SELECT j.job_id, 'Job number ' || j.i, j.type, j.schedule, j.interval_seconds, j.timezone, '{}',
       'ALL_SUCCESS', 'noop', jsonb_build_object('n', j.i), 0, 10, 3600, 3600, 'normal', j.queue,
       'ALLOW', 'FIRE_ONCE', 60, j.i % 50 <> 0, 'bench', now(),
       now() + (j.i % 3600) * interval '1 second', now(),
       jsonb_strip_nulls(jsonb_build_object(
           'schema_version', 1, 'job_id', j.job_id, 'name', 'Job number ' || j.i, 'type', j.type,
           'schedule', j.schedule, 'interval_seconds', j.interval_seconds, 'timezone', j.timezone,
           'handler', 'noop', 'params', jsonb_build_object('n', j.i), 'queue', j.queue,
           'enabled', j.i % 50 <> 0))
FROM (SELECT i, 'job-' || lpad(i::text, 6, '0') AS job_id,
             CASE WHEN i % 3 = 0 THEN 'CRON' ELSE 'INTERVAL' END AS type,
             CASE WHEN i % 3 = 0 THEN (i % 60) || ' ' || (i % 24) || ' * * *' END AS schedule,
             CASE WHEN i % 3 <> 0 THEN 60 * (1 + i % 120) END AS interval_seconds,
             CASE WHEN i % 5 = 0 THEN 'Europe/Berlin' ELSE 'UTC' END AS timezone,
             'q' || (i % 8) AS queue
      FROM generate_series(1, $1::int) AS i) j;

-- name: seed_executions
INSERT INTO job_executions (
    execution_id, job_id, run_id, status, scheduled_at, queued_at, started_at, completed_at,
    worker_id, attempt_number, delivery, error_message, result, progress, priority, queue,
    last_event, updated_at, reason)
SELECT gen_random_uuid(), x.job_id, gen_random_uuid(), x.status, x.at, x.at,
       x.at + interval '20 milliseconds',
       CASE WHEN x.status IN ('QUEUED', 'RUNNING') THEN NULL
            ELSE x.at + (50 + x.n % 5000) * interval '1 millisecond' END,
       'w' || (x.n % 16), 1, 1, CASE WHEN x.status = 'FAILED' THEN 'boom ' || x.n END,
       CASE WHEN x.status = 'COMPLETED' THEN jsonb_build_object('rows', x.n % 100) END,
       CASE WHEN x.status = 'RUNNING' THEN (x.n % 100)::real END, 'normal', 'q0', x.status,
       x.at, 'SCHEDULE'
FROM (SELECT n,
             CASE WHEN n % 10 < 9 THEN 'job-' || lpad((1 + n % 1000)::text, 6, '0')
                  ELSE 'job-' || lpad((1 + n % $1::int)::text, 6, '0') END AS job_id,
             CASE WHEN n % 100 < 95 THEN 'COMPLETED' WHEN n % 100 < 99 THEN 'FAILED'
                  ELSE 'SKIPPED' END AS status,
             now() - (n % 604800) * interval '1 second' - interval '1 minute' AS at
      FROM generate_series(1, $2::int) AS n) x;

-- name: seed_active
-- What is live: RUNNING, QUEUED and AWAITING_APPROVAL executions of the busy jobs.
INSERT INTO job_executions (
    execution_id, job_id, run_id, status, scheduled_at, queued_at, started_at, worker_id,
    attempt_number, delivery, progress, progress_message, priority, queue, last_event, updated_at,
    reason)
SELECT gen_random_uuid(), 'job-' || lpad((1 + n % 1000)::text, 6, '0'), gen_random_uuid(),
       s.status, now() - n * interval '1 second', now() - n * interval '1 second',
       CASE WHEN s.status = 'RUNNING' THEN now() END, 'w' || (n % 16), 1, 1,
       CASE WHEN s.status = 'RUNNING' THEN (n % 100)::real END, 'step ' || n, 'normal', 'q0',
       s.status, now(), 'SCHEDULE'
FROM (VALUES ('RUNNING', 200), ('QUEUED', 2000), ('AWAITING_APPROVAL', 20)) AS s(status, count),
     LATERAL generate_series(1, s.count) AS n;

-- name: seed_events
-- One event per execution (the audit log the Execution page reads).
INSERT INTO execution_events (
    event_id, execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
    occurred_at, worker_id, kafka_partition, kafka_offset)
SELECT gen_random_uuid(), e.execution_id, e.job_id, e.run_id, e.status, 1, 1, e.scheduled_at,
       e.updated_at, e.worker_id, 0, row_number() OVER ()
FROM job_executions e;

-- name: seed_workers
INSERT INTO workers (worker_id, hostname, status, last_heartbeat, running, capacity, queues, updated_at)
SELECT 'w' || n, 'host-' || n, 'ACTIVE', now(), '{}', 8, '{q0}', now()
FROM generate_series(0, 15) AS n;

-- name: seed_alerts
INSERT INTO alerts (alert_id, kind, severity, state, job_id, summary, fired_at, updated_at,
                    kafka_partition, kafka_offset)
SELECT gen_random_uuid(), 'EXECUTION_PERMANENTLY_FAILED', 'error',
       CASE WHEN n % 3 = 0 THEN 'FIRING' ELSE 'RESOLVED' END, 'job-' || lpad((1 + n % 1000)::text, 6, '0'),
       'alert ' || n, now() - n * interval '1 minute', now(), 0, n
FROM generate_series(1, 5000) AS n;

-- name: analyze
ANALYZE;

-- name: sample_ids
SELECT (SELECT execution_id FROM job_executions WHERE job_id = 'job-000001' ORDER BY scheduled_at DESC LIMIT 1) AS execution_id,
       (SELECT run_id FROM job_executions WHERE job_id = 'job-000001' ORDER BY scheduled_at DESC LIMIT 1) AS run_id;
