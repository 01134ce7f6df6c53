-- Retention (services/monitor/retention.py): each statement deletes one bounded batch,
-- oldest first, in a transaction of its own, so the projection never waits long on it.
-- Rows the projection holds right now are skipped (SKIP LOCKED) and taken next time.
-- Rows are deleted by `= ANY (ARRAY(...))` of the batch's keys (or tuple ids, locked by the
-- batch's FOR UPDATE within the same statement), never by a join the planner could turn
-- into a scan of the whole table.

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
    -- `= ANY (ARRAY(...))` rather than a join: an index lookup per doomed execution whatever
    -- the planner thinks of the table's size (a hash join would read all of it).
    DELETE FROM execution_events
    WHERE execution_id = ANY (ARRAY(SELECT execution_id FROM doomed))
    RETURNING 1
), logs AS (
    DELETE FROM execution_logs
    WHERE execution_id = ANY (ARRAY(SELECT execution_id FROM doomed))
    RETURNING 1
), log_ends AS (
    DELETE FROM execution_log_ends
    WHERE execution_id = ANY (ARRAY(SELECT execution_id FROM doomed))
    RETURNING 1
), log_sizes AS (
    DELETE FROM execution_log_sizes
    WHERE execution_id = ANY (ARRAY(SELECT execution_id FROM doomed))
), executions AS (
    DELETE FROM job_executions
    WHERE execution_id = ANY (ARRAY(SELECT execution_id FROM doomed))
    RETURNING 1
)
SELECT (SELECT count(*) FROM executions) AS executions, (SELECT count(*) FROM events) AS events,
       (SELECT count(*) FROM logs) AS log_lines, (SELECT count(*) FROM log_ends) AS log_ends;

-- name: prune_alerts
-- Closed episodes and one-shot alerts raised before $1; an episode still FIRING stays.
WITH doomed AS (
    SELECT ctid FROM alerts
    WHERE fired_at < $1 AND (state = 'RESOLVED' OR kind = 'EXECUTION_PERMANENTLY_FAILED')
    ORDER BY fired_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM alerts WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));

-- name: prune_dag_evaluations
WITH doomed AS (
    SELECT ctid FROM dag_evaluations
    WHERE decided_at < $1
    ORDER BY decided_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM dag_evaluations WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));

-- name: prune_definition_versions
-- Versions that stopped being current before $1 (a later version of the job was recorded
-- before $1, so the runs that used them are as old): never a job's latest version.
WITH doomed AS (
    SELECT v.ctid FROM job_definition_versions v
    WHERE v.recorded_at < $1
      AND EXISTS (SELECT 1 FROM job_definition_versions later
                  WHERE later.job_id = v.job_id AND later.version > v.version
                    AND later.recorded_at < $1)
    ORDER BY v.recorded_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM job_definition_versions WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));

-- name: prune_workers
-- Workers OFFLINE since before $1 (a worker that comes back re-registers by heartbeat).
WITH doomed AS (
    SELECT ctid FROM workers
    WHERE status = 'OFFLINE' AND last_heartbeat < $1
    ORDER BY last_heartbeat
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM workers WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed));

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
    (SELECT count(*) FROM workers WHERE status = 'OFFLINE' AND last_heartbeat < $1) AS workers,
    (SELECT count(*) FROM job_definition_versions v
     WHERE v.recorded_at < $1
       AND EXISTS (SELECT 1 FROM job_definition_versions later
                   WHERE later.job_id = v.job_id AND later.version > v.version
                     AND later.recorded_at < $1)) AS definition_versions;

-- name: try_retention_lock
-- One sweeper at a time across monitors (session lock; released with the connection).
SELECT pg_try_advisory_lock($1);

-- name: retention_unlock
SELECT pg_advisory_unlock($1);
