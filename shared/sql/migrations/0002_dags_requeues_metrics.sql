-- cronstream projection, version 2: what requeues, DAG runs and dashboards need.

-- The JobDue of an execution's current delivery (from its QUEUED event), so that the
-- monitor can re-issue it on a requeue or an approval.
ALTER TABLE job_executions ADD COLUMN reason text;
ALTER TABLE job_executions ADD COLUMN idempotency_key text;
ALTER TABLE job_executions ADD COLUMN job jsonb;
CREATE INDEX job_executions_running_worker ON job_executions (worker_id)
    WHERE status = 'RUNNING';

-- Each DEPENDENT job is evaluated at most once per run: this row is inserted in the same
-- transaction as the projection batch that made its upstreams final.
CREATE TABLE dag_evaluations (
    run_id        uuid NOT NULL,
    job_id        text NOT NULL,
    execution_id  uuid NOT NULL,
    decision      text NOT NULL,   -- RUN, SKIP, AWAIT_APPROVAL
    detail        text,
    decided_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, job_id)
);

-- Queue depth per priority tier and queue: the workers' consumer lag on each work topic.
CREATE TABLE queue_depth (
    priority    text NOT NULL,
    queue       text NOT NULL,
    depth       bigint NOT NULL,
    measured_at timestamptz NOT NULL,
    PRIMARY KEY (priority, queue)
);

-- Success rate and durations per job over the last 24 hours.
CREATE VIEW job_stats_24h AS
SELECT job_id,
       count(*) FILTER (WHERE status IN ('COMPLETED', 'FAILED', 'TIMED_OUT',
                                         'PERMANENTLY_FAILED')) AS finished,
       count(*) FILTER (WHERE status = 'COMPLETED') AS succeeded,
       round(100.0 * count(*) FILTER (WHERE status = 'COMPLETED')
             / NULLIF(count(*) FILTER (WHERE status IN ('COMPLETED', 'FAILED', 'TIMED_OUT',
                                                        'PERMANENTLY_FAILED')), 0), 2)
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

-- How busy each live worker is.
CREATE VIEW worker_utilisation AS
SELECT worker_id, status, cardinality(running) AS running, capacity,
       CASE WHEN capacity > 0 THEN round(100.0 * cardinality(running) / capacity, 1) END
           AS utilisation_percent,
       last_heartbeat
FROM workers;
