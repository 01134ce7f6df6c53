-- Retention (services/monitor/retention.py): each statement deletes one bounded batch,
-- oldest first, in a transaction of its own, so the projection never waits long on it.
-- Rows the projection holds right now are skipped (SKIP LOCKED) and taken next time.

-- name: prune_executions
-- Executions scheduled before $1 that are finished (or have not moved since $1), with
-- their events: at most $2 executions.
WITH doomed AS (
    SELECT execution_id FROM job_executions
    WHERE scheduled_at < $1
      AND (status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED',
                      'SKIPPED')
           OR updated_at < $1)
    ORDER BY scheduled_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM execution_events e USING doomed d
    WHERE e.execution_id = d.execution_id
    RETURNING 1
), executions AS (
    DELETE FROM job_executions j USING doomed d
    WHERE j.execution_id = d.execution_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM executions) AS executions, (SELECT count(*) FROM events) AS events;

-- name: prune_alerts
-- Closed episodes and one-shot alerts raised before $1; an episode still FIRING stays.
WITH doomed AS (
    SELECT alert_id FROM alerts
    WHERE fired_at < $1 AND (state = 'RESOLVED' OR kind = 'EXECUTION_PERMANENTLY_FAILED')
    ORDER BY fired_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM alerts a USING doomed d WHERE a.alert_id = d.alert_id;

-- name: prune_dag_evaluations
WITH doomed AS (
    SELECT run_id, job_id FROM dag_evaluations
    WHERE decided_at < $1
    ORDER BY decided_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM dag_evaluations e USING doomed d WHERE e.run_id = d.run_id AND e.job_id = d.job_id;

-- name: prune_workers
-- Workers OFFLINE since before $1 (a worker that comes back re-registers by heartbeat).
WITH doomed AS (
    SELECT worker_id FROM workers
    WHERE status = 'OFFLINE' AND last_heartbeat < $1
    ORDER BY last_heartbeat
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM workers w USING doomed d WHERE w.worker_id = d.worker_id;

-- name: count_prunable
SELECT
    (SELECT count(*) FROM job_executions
     WHERE scheduled_at < $1
       AND (status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED',
                       'SKIPPED')
            OR updated_at < $1)) AS executions,
    (SELECT count(*) FROM alerts
     WHERE fired_at < $1 AND (state = 'RESOLVED' OR kind = 'EXECUTION_PERMANENTLY_FAILED'))
        AS alerts,
    (SELECT count(*) FROM dag_evaluations WHERE decided_at < $1) AS dag_evaluations,
    (SELECT count(*) FROM workers WHERE status = 'OFFLINE' AND last_heartbeat < $1) AS workers;

-- name: try_retention_lock
-- One sweeper at a time across monitors (session lock; released with the connection).
SELECT pg_try_advisory_lock($1);

-- name: retention_unlock
SELECT pg_advisory_unlock($1);
