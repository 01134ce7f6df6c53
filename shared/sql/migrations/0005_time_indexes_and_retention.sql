-- cronstream projection, version 5: time indexes for dashboards and retention.

-- Every time-range panel over all jobs (Grafana's $__timeFilter on scheduled_at) and the
-- retention sweep (oldest first) read job_executions by time: without this index both
-- scan the whole table (issue 11). Per-job panels use job_executions_job.
CREATE INDEX job_executions_scheduled ON job_executions (scheduled_at);

-- The finished executions of a time range, by completion (throughput and duration panels).
-- (The same index as 0006_ui: whichever of the two a database applies first creates it.)
CREATE INDEX IF NOT EXISTS job_executions_completed ON job_executions (completed_at)
    WHERE completed_at IS NOT NULL;

-- Retention of DAG evaluations and offline workers, oldest first.
CREATE INDEX dag_evaluations_decided ON dag_evaluations (decided_at);
CREATE INDEX workers_offline ON workers (last_heartbeat) WHERE status = 'OFFLINE';
