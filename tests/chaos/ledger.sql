-- The chaos suite's ledger queries (named blocks, like shared/sql/queries.sql).

-- name: executions_of_jobs
SELECT execution_id, job_id, scheduled_at, status, attempt_number, delivery, error_message,
       completed_at, worker_id
FROM job_executions
WHERE job_id = ANY($1::text[]);

-- name: terminal_count
SELECT count(*)
FROM job_executions
WHERE execution_id = ANY($1::uuid[])
  AND status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED', 'SKIPPED');

-- name: terminal_events_not_once
-- Every execution reaches exactly one terminal status: count the terminal events each has.
SELECT execution_id, count(*) AS terminal, array_agg(status ORDER BY occurred_at) AS statuses
FROM execution_events
WHERE execution_id = ANY($1::uuid[])
  AND status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED', 'SKIPPED')
GROUP BY execution_id
HAVING count(*) <> 1;

-- name: ran_twice_at_one_delivery
SELECT execution_id, delivery, count(*) AS running, array_agg(worker_id) AS workers
FROM execution_events
WHERE job_id = ANY($1::text[]) AND status = 'RUNNING'
GROUP BY execution_id, delivery
HAVING count(*) > 1;

-- name: event_ids
SELECT event_id FROM execution_events;

-- name: requeues
SELECT execution_id, delivery, worker_id, occurred_at, error_message
FROM execution_events
WHERE job_id = ANY($1::text[]) AND status = 'REQUEUED'
ORDER BY occurred_at;

-- name: first_start_per_job
-- For each job, the first start of any of its executions after `$2` (a fault's end): its
-- partition moves again, whatever backlog the fault left in front of its new fires.
SELECT job_id, min(started_at) AS first_started
FROM job_executions
WHERE job_id = ANY($1::text[]) AND started_at > $2
GROUP BY job_id;

-- name: first_completion_per_job
-- For each job, the first start and the first completion of a fire scheduled after `$2`
-- (a fault's end).
SELECT job_id, min(completed_at) AS first_completed, min(started_at) AS first_started
FROM job_executions
WHERE job_id = ANY($1::text[]) AND scheduled_at > $2 AND status = 'COMPLETED'
  AND attempt_number = 1
GROUP BY job_id;

-- name: running_on_worker_at
-- What a worker was running at an instant: its RUNNING events before it, with no terminal
-- or REQUEUED event of the same or a later delivery before it.
SELECT r.execution_id, r.delivery
FROM execution_events r
WHERE r.job_id = ANY($1::text[]) AND r.status = 'RUNNING' AND r.worker_id = $2
  AND r.occurred_at <= $3
  AND NOT EXISTS (
      SELECT 1 FROM execution_events e
      WHERE e.execution_id = r.execution_id AND e.delivery >= r.delivery AND e.occurred_at <= $3
        AND e.status IN ('COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'PERMANENTLY_FAILED',
                         'SKIPPED', 'REQUEUED'));

-- name: kept_log_lines
-- What a worker's deliveries of these executions printed, as projected.
SELECT execution_id, delivery, line, at
FROM execution_logs
WHERE execution_id = ANY($1::uuid[]) AND worker_id = $2 AND stream = 'stdout'
ORDER BY execution_id, delivery, seq;

-- name: first_requeue_after
SELECT execution_id, min(occurred_at) AS requeued_at
FROM execution_events
WHERE execution_id = ANY($1::uuid[]) AND status = 'REQUEUED' AND occurred_at > $2
GROUP BY execution_id;

-- name: run_spans
-- From start to end, every execution of the jobs that ran to an end: what ran at once.
SELECT job_id, started_at, completed_at
FROM job_executions
WHERE job_id = ANY($1::text[]) AND started_at IS NOT NULL AND completed_at IS NOT NULL;

-- name: executions_that_waited
-- How many executions of the jobs were held back (WAITING) at some point.
SELECT count(DISTINCT execution_id)
FROM execution_events
WHERE job_id = ANY($1::text[]) AND status = 'WAITING';

-- name: statuses_of
SELECT execution_id, status
FROM job_executions
WHERE execution_id = ANY($1::uuid[]);
