-- cronstream projection, version 10: a success rate per run, and one jobs overview.
-- docs/decisions/0053-success-rate-per-run.md.

-- Per run, not per attempt: a run ends when its last attempt does, COMPLETED or
-- PERMANENTLY_FAILED (statuses.RUN_OUTCOMES). An attempt that FAILED or TIMED_OUT with a
-- retry to come is not an outcome, so a first try that fails and a retry that succeeds
-- is one successful run. CANCELLED and SKIPPED are decisions, not outcomes.
CREATE OR REPLACE VIEW job_stats_24h AS
SELECT job_id,
       count(*) FILTER (WHERE status IN ('COMPLETED', 'PERMANENTLY_FAILED')) AS finished,
       count(*) FILTER (WHERE status = 'COMPLETED') AS succeeded,
       round(100.0 * count(*) FILTER (WHERE status = 'COMPLETED')
             / NULLIF(count(*) FILTER (WHERE status IN ('COMPLETED', 'PERMANENTLY_FAILED')), 0), 2)
           AS success_rate_percent,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at))
           FILTER (WHERE status = 'COMPLETED') AS duration_p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at))
           FILTER (WHERE status = 'COMPLETED') AS duration_p95_seconds,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - started_at))
           FILTER (WHERE status = 'COMPLETED') AS duration_p99_seconds
FROM job_executions
WHERE scheduled_at > now() - interval '24 hours'
GROUP BY job_id;

-- Every live job with its last status and its 24 h runs: what `cronstream jobs`, the
-- dashboard's Jobs page and Grafana's job list show, written once. A filter on job_id
-- reaches the definitions before the two lateral reads run, through the
-- (job_id, scheduled_at) index.
CREATE VIEW job_overview AS
SELECT d.job_id, d.name, d.type,
       COALESCE(d.schedule, d.interval_seconds::text || 's',
                to_char(d.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                array_to_string(d.depends_on, ',')) AS schedule_text,
       d.schedule, d.interval_seconds, d.run_at, d.timezone, d.depends_on, d.handler, d.queue,
       d.priority, d.enabled, d.next_execution_at, d.updated_at,
       last.status AS last_status, last.scheduled_at AS last_scheduled_at,
       COALESCE(stats.finished, 0) AS finished_24h, COALESCE(stats.succeeded, 0) AS succeeded_24h
FROM job_definitions d
LEFT JOIN LATERAL (
    SELECT status, scheduled_at FROM job_executions e
    WHERE e.job_id = d.job_id ORDER BY scheduled_at DESC LIMIT 1) last ON true
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE status IN ('COMPLETED', 'PERMANENTLY_FAILED')) AS finished,
           count(*) FILTER (WHERE status = 'COMPLETED') AS succeeded
    FROM job_executions e
    WHERE e.job_id = d.job_id AND e.scheduled_at > now() - interval '24 hours') stats ON true
WHERE d.deleted_at IS NULL;
