-- The SQL of every PostgreSQL panel of the Grafana dashboards (deploy/grafana/generate.py
-- puts each block into its panel). `-- name: x` starts a block. Grafana expands the
-- macros ($__timeFilter, $__timeGroupAlias, $__interval) and the variables
-- (${job:sqlstring} is the variable quoted as an SQL string). Every block is run against
-- a database of 1,000 jobs and 1,000,000 executions by tests/integration/test_dashboards.py,
-- which checks its columns and that its plan uses an index.

-- name: overview_alerts_firing
SELECT fired_at AS "time", kind, severity, COALESCE(job_id, 'queue:' || queue) AS subject, summary
FROM alerts
WHERE state = 'FIRING'
ORDER BY fired_at DESC
LIMIT 100;

-- name: overview_jobs
-- Every job with its last status, next run and 24 h success rate per run (the product's
-- job list: the view job_overview, as `cronstream jobs` and the dashboard read it).
SELECT job_id, type, schedule_text AS schedule, enabled, last_status,
       last_scheduled_at AS last_run, next_execution_at AS next_run,
       round(100.0 * succeeded_24h / NULLIF(finished_24h, 0), 1) AS success_rate_24h
FROM job_overview
ORDER BY job_id;

-- name: overview_executions_by_status
SELECT $__timeGroupAlias(scheduled_at, $__interval), status AS metric, count(*) AS value
FROM job_executions
WHERE $__timeFilter(scheduled_at)
GROUP BY 1, 2
ORDER BY 1;

-- name: overview_success_rate
SELECT $__timeGroupAlias(completed_at, $__interval),
       100.0 * count(*) FILTER (WHERE status = 'COMPLETED')
           / NULLIF(count(*) FILTER (WHERE status IN ('COMPLETED', 'PERMANENTLY_FAILED')), 0)
           AS success_rate
FROM job_executions
WHERE $__timeFilter(completed_at) AND completed_at IS NOT NULL
GROUP BY 1
ORDER BY 1;

-- name: overview_duration_percentiles
SELECT $__timeGroupAlias(completed_at, $__interval),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p99
FROM job_executions
WHERE $__timeFilter(completed_at) AND completed_at IS NOT NULL AND status = 'COMPLETED'
GROUP BY 1
ORDER BY 1;

-- name: job_stats
SELECT finished, success_rate_percent, duration_p50_seconds, duration_p95_seconds,
       duration_p99_seconds
FROM job_stats_24h
WHERE job_id = ${job:sqlstring};

-- name: job_next_fire
SELECT next_execution_at AS next_run, type, COALESCE(schedule, interval_seconds::text || 's') AS schedule,
       timezone, enabled, misfire_policy, concurrency_policy
FROM job_definitions
WHERE job_id = ${job:sqlstring};

-- name: job_runs
SELECT scheduled_at AS "time", execution_id, status, attempt_number AS attempt,
       extract(epoch FROM completed_at - started_at) AS duration_seconds,
       extract(epoch FROM started_at - scheduled_at) AS start_lag_seconds, progress,
       progress_message, worker_id, error_message
FROM job_executions
WHERE job_id = ${job:sqlstring} AND $__timeFilter(scheduled_at)
ORDER BY scheduled_at DESC
LIMIT 500;

-- name: job_success_rate
SELECT $__timeGroupAlias(scheduled_at, $__interval),
       100.0 * count(*) FILTER (WHERE status = 'COMPLETED')
           / NULLIF(count(*) FILTER (WHERE status IN ('COMPLETED', 'PERMANENTLY_FAILED')), 0)
           AS success_rate
FROM job_executions
WHERE job_id = ${job:sqlstring} AND $__timeFilter(scheduled_at)
GROUP BY 1
ORDER BY 1;

-- name: job_durations
SELECT $__timeGroupAlias(scheduled_at, $__interval),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at)) AS p95,
       max(attempt_number) AS max_attempt
FROM job_executions
WHERE job_id = ${job:sqlstring} AND $__timeFilter(scheduled_at) AND status = 'COMPLETED'
GROUP BY 1
ORDER BY 1;

-- name: job_last_failure_log
-- The log of the job's latest failed attempt in the time range, its traceback last: what
-- it wrote before it failed (the whole log: `cronstream logs EXECUTION_ID`).
SELECT l.at AS "time", l.execution_id, l.attempt_number AS attempt, l.stream, l.level, l.line
FROM execution_logs l
WHERE l.execution_id = (
    SELECT execution_id FROM job_executions
    WHERE job_id = ${job:sqlstring} AND $__timeFilter(scheduled_at)
      AND status IN ('FAILED', 'TIMED_OUT', 'PERMANENTLY_FAILED')
    ORDER BY completed_at DESC NULLS LAST
    LIMIT 1)
ORDER BY l.delivery, l.seq
LIMIT 1000;

-- name: job_alerts
SELECT fired_at AS "time", kind, state, severity, summary, resolved_at
FROM alerts
WHERE job_id = ${job:sqlstring}
ORDER BY fired_at DESC
LIMIT 50;

-- name: dag_runs
-- Runs of a root job in the time range, with how their downstream steps ended.
SELECT r.scheduled_at AS "time", r.run_id, r.status AS root_status,
       count(s.execution_id) AS steps,
       count(s.execution_id) FILTER (WHERE s.status = 'COMPLETED') AS completed,
       count(s.execution_id) FILTER (WHERE s.status = 'SKIPPED') AS skipped,
       count(s.execution_id) FILTER (WHERE s.status IN ('FAILED', 'TIMED_OUT',
                                                        'PERMANENTLY_FAILED')) AS failed,
       count(s.execution_id) FILTER (WHERE s.status = 'AWAITING_APPROVAL') AS awaiting_approval
FROM job_executions r
LEFT JOIN job_executions s ON s.run_id = r.run_id AND s.job_id <> r.job_id
WHERE r.job_id = ${root:sqlstring} AND r.attempt_number = 1 AND $__timeFilter(r.scheduled_at)
GROUP BY r.scheduled_at, r.run_id, r.status
ORDER BY r.scheduled_at DESC
LIMIT 100;

-- name: dag_steps
-- Each step of one run: its status, and what the DAG evaluation decided and why.
SELECT e.job_id AS step, e.status, e.attempt_number AS attempt, e.scheduled_at, e.started_at,
       e.completed_at, d.decision, d.detail, e.approved_by, e.rejected_by, e.error_message
FROM job_executions e
LEFT JOIN dag_evaluations d ON d.run_id = e.run_id AND d.job_id = e.job_id
WHERE e.run_id = ${run:sqlstring}::uuid
ORDER BY e.scheduled_at, e.job_id;

-- name: dag_awaiting_approval
SELECT scheduled_at AS "time", job_id, run_id, execution_id,
       extract(epoch FROM now() - scheduled_at) AS waiting_seconds
FROM job_executions
WHERE status = 'AWAITING_APPROVAL'
ORDER BY scheduled_at;

-- name: var_jobs
SELECT job_id FROM job_definitions WHERE deleted_at IS NULL ORDER BY job_id;

-- name: var_roots
SELECT DISTINCT d.job_id FROM job_definitions d
JOIN job_dependencies dep ON dep.upstream_job_id = d.job_id
WHERE d.deleted_at IS NULL AND d.type <> 'DEPENDENT'
ORDER BY 1;

-- name: var_runs
SELECT run_id::text FROM job_executions
WHERE job_id = ${root:sqlstring} AND attempt_number = 1
ORDER BY scheduled_at DESC
LIMIT 50;
