-- A realistic projection, built set-based (generate_series; tests/seed.py), for the dashboard test and
-- the dashboard and retention benchmarks. `-- name: x` starts a block.
-- $1 jobs, $2 executions, $3 days the executions span (newest now).
-- Every tenth job is DEPENDENT on the job before it; its executions share their
-- upstream's run (a two-step DAG). 96 % of executions COMPLETED, the rest FAILED,
-- TIMED_OUT, PERMANENTLY_FAILED or SKIPPED; the newest few are QUEUED, RUNNING or
-- AWAITING_APPROVAL.

-- name: seed_definitions
INSERT INTO job_definitions (
    job_id, type, schedule, timezone, depends_on, trigger_rule, requires_approval, handler,
    params, max_retries, retry_delay_seconds, max_retry_delay_seconds, timeout_seconds, priority,
    queue, concurrency_policy, misfire_policy, misfire_grace_seconds, enabled, next_execution_at,
    updated_at, definition)
SELECT 'job-' || lpad(j::text, 4, '0'),
       CASE WHEN j % 10 = 9 THEN 'DEPENDENT' ELSE 'CRON' END,
       CASE WHEN j % 10 = 9 THEN NULL ELSE '*/5 * * * *' END, 'UTC',
       CASE WHEN j % 10 = 9 THEN ARRAY['job-' || lpad((j - 1)::text, 4, '0')] ELSE '{}' END,
       'ALL_SUCCESS', j % 100 = 99, 'noop', '{}', 1, 10, 3600, 3600, 'normal', 'default',
       'ALLOW', 'FIRE_ONCE', 60, true,
       CASE WHEN j % 10 = 9 THEN NULL ELSE date_trunc('hour', now()) + interval '1 hour' END,
       now(),
       jsonb_build_object('job_id', 'job-' || lpad(j::text, 4, '0'), 'handler', 'noop')
       || CASE WHEN j % 10 = 9
               THEN jsonb_build_object('type', 'DEPENDENT', 'requires_approval', j % 100 = 99,
                                       'depends_on', jsonb_build_array('job-' || lpad((j - 1)::text, 4, '0')))
               ELSE jsonb_build_object('type', 'CRON', 'schedule', '*/5 * * * *') END
FROM generate_series(0, $1::int - 1) AS j;

-- name: seed_dependencies
INSERT INTO job_dependencies (downstream_job_id, upstream_job_id)
SELECT job_id, depends_on[1] FROM job_definitions WHERE type = 'DEPENDENT';

-- name: seed_executions
INSERT INTO job_executions (
    execution_id, job_id, run_id, status, scheduled_at, queued_at, started_at, completed_at,
    worker_id, attempt_number, delivery, error_message, result, progress, priority, queue,
    last_event, updated_at, reason)
SELECT md5('exec|' || i)::uuid,
       'job-' || lpad((i % $1::int)::text, 4, '0'),
       md5('run|' || CASE WHEN i % $1::int % 10 = 9 THEN i - 1 ELSE i END)::uuid,
       s.status, t.at, t.at + interval '20 ms',
       CASE WHEN s.status NOT IN ('QUEUED', 'AWAITING_APPROVAL', 'SKIPPED') THEN t.at + interval '80 ms' END,
       CASE WHEN s.status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'PERMANENTLY_FAILED')
            THEN t.at + interval '80 ms' + (i % 97) * interval '50 ms' END,
       CASE WHEN s.status NOT IN ('QUEUED', 'AWAITING_APPROVAL', 'SKIPPED') THEN 'w' || (i % 20) END,
       CASE WHEN i % 100 = 7 THEN 2 ELSE 1 END, 1,
       CASE WHEN s.status IN ('FAILED', 'TIMED_OUT', 'PERMANENTLY_FAILED') THEN 'boom' END,
       CASE WHEN s.status = 'COMPLETED' THEN '{"rows": 10}'::jsonb END,
       CASE WHEN s.status IN ('COMPLETED') THEN 100 END, 'normal', 'default',
       s.status, t.at, 'SCHEDULE'
FROM generate_series(0, $2::int - 1) AS i
CROSS JOIN LATERAL (SELECT now() - (i::double precision / $2::int) * $3::int * interval '1 day' AS at) t
CROSS JOIN LATERAL (SELECT CASE
    WHEN i < 40 THEN (ARRAY['QUEUED', 'RUNNING', 'AWAITING_APPROVAL', 'RUNNING'])[i % 4 + 1]
    -- By the run's number within its job: every job fails now and then, as real ones do.
    WHEN i / $1::int % 50 = 1 THEN 'FAILED'
    WHEN i / $1::int % 100 = 3 THEN 'TIMED_OUT'
    WHEN i / $1::int % 200 = 5 THEN 'PERMANENTLY_FAILED'
    WHEN i / $1::int % 300 = 9 THEN 'SKIPPED'
    ELSE 'COMPLETED' END AS status) s;

-- name: seed_events
-- Three events (QUEUED, RUNNING, its status) for one execution in $1 (1: every one).
INSERT INTO execution_events (
    event_id, execution_id, job_id, run_id, status, attempt_number, delivery, scheduled_at,
    occurred_at, worker_id, started_at, completed_at, kafka_partition, kafka_offset)
SELECT md5('event|' || e.execution_id || '|' || k)::uuid, e.execution_id, e.job_id, e.run_id,
       (ARRAY['QUEUED', 'RUNNING', e.status])[k], e.attempt_number, 1, e.scheduled_at,
       e.scheduled_at + k * interval '40 ms', e.worker_id, e.started_at, e.completed_at, 0, 0
FROM job_executions e
CROSS JOIN generate_series(1, 3) AS k
WHERE $1::int = 1 OR abs(hashtext(e.execution_id::text)) % $1::int = 0;

-- name: seed_logs
-- The log of every failed execution: a printed line, a logged warning, its traceback.
INSERT INTO execution_logs (execution_id, delivery, seq, job_id, attempt_number, at, stream,
                            level, line, worker_id)
SELECT e.execution_id, 1, k - 1, e.job_id, e.attempt_number, e.started_at + k * interval '10 ms',
       (ARRAY['stdout', 'log', 'traceback'])[k], (ARRAY[NULL, 'WARNING', 'ERROR'])[k],
       (ARRAY['processing', 'app: retrying',
              'Traceback (most recent call last):' || chr(10) || 'RuntimeError: boom'])[k],
       e.worker_id
FROM job_executions e
CROSS JOIN generate_series(1, 3) AS k
WHERE e.status IN ('FAILED', 'TIMED_OUT', 'PERMANENTLY_FAILED');

-- name: seed_dag_evaluations
INSERT INTO dag_evaluations (run_id, job_id, execution_id, decision, detail, decided_at)
SELECT run_id, job_id, execution_id, CASE WHEN status = 'SKIPPED' THEN 'SKIP' ELSE 'RUN' END,
       NULL, scheduled_at
FROM job_executions
WHERE job_id IN (SELECT job_id FROM job_definitions WHERE type = 'DEPENDENT');

-- name: seed_alerts
-- $1 jobs, $2 days.
INSERT INTO alerts (alert_id, kind, severity, state, job_id, summary, evidence, fired_at,
                    resolved_at, updated_at, kafka_partition, kafka_offset)
SELECT md5('alert|' || a)::uuid, (ARRAY['SUCCESS_RATE_LOW', 'DURATION_REGRESSION', 'FIRE_LATE',
                                        'EXECUTION_PERMANENTLY_FAILED'])[a % 4 + 1],
       'error', CASE WHEN a % 10 = 0 THEN 'FIRING' ELSE 'RESOLVED' END,
       'job-' || lpad((a % $1::int)::text, 4, '0'), 'seeded', '{}'::jsonb,
       now() - (a::double precision / 5000) * $2::int * interval '1 day',
       CASE WHEN a % 10 <> 0 THEN now() - (a::double precision / 5000) * $2::int * interval '1 day'
                                         + interval '5 minutes' END,
       now(), 0, a
FROM generate_series(0, 4999) AS a;

-- name: seed_workers
INSERT INTO workers (worker_id, hostname, status, last_heartbeat, capacity, updated_at)
SELECT 'w' || w, 'host-' || w, CASE WHEN w < 20 THEN 'ACTIVE' ELSE 'OFFLINE' END,
       now() - CASE WHEN w < 20 THEN interval '1 second' ELSE w * interval '1 day' END, 8, now()
FROM generate_series(0, 59) AS w;

-- name: secondary_indexes
-- Loading a million rows into a table with seven indexes takes minutes; loading it bare and
-- building the indexes afterwards takes seconds. These are the table's indexes as the
-- migrations made them (dropped, then re-created from exactly these definitions).
SELECT i.indexname, i.indexdef FROM pg_indexes i
WHERE i.tablename = $1 AND i.indexname NOT IN (
    SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass)
ORDER BY i.indexname;

-- name: analyze
ANALYZE;
