-- cronstream projection, version 9: run inputs, DAG data flow and definition history
-- (docs/reference/operations.md#definition-history; docs/decisions/0035 and 0036).

-- Every accepted definition of a job, numbered per job from 1 in the order of
-- `job-definitions`: a change, a pause, a delete (definition NULL) and a re-create each
-- make the next version. `created_by` is the definition's (a delete's: the
-- `cronstream-deleted-by` header of its tombstone), `recorded_at` the record's Kafka
-- timestamp. `kafka_offset` names the record an execution's snapshot was taken from
-- (job_executions.definition_offset); NULL for the versions seeded below, projected before
-- history was kept. A version is deleted by retention once a later one was recorded
-- `retention_days` ago; a job's latest version never is.
CREATE TABLE job_definition_versions (
    job_id       text NOT NULL,
    version      integer NOT NULL,
    definition   jsonb,
    created_by   text,
    recorded_at  timestamptz NOT NULL,
    kafka_offset bigint,
    projected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, version)
);
-- A record projected twice (after a crash) is one version.
CREATE UNIQUE INDEX job_definition_versions_offset ON job_definition_versions (job_id, kafka_offset);
CREATE INDEX job_definition_versions_recorded ON job_definition_versions (recorded_at);

-- The current version of each job, and the offset of its live definition.
ALTER TABLE job_definitions ADD COLUMN version integer;
ALTER TABLE job_definitions ADD COLUMN definition_offset bigint;

-- What the jobs projected so far were: their version 1 (and 2, a delete).
INSERT INTO job_definition_versions (job_id, version, definition, created_by, recorded_at)
SELECT job_id, 1, definition, created_by, COALESCE(created_at, updated_at) FROM job_definitions;
INSERT INTO job_definition_versions (job_id, version, definition, created_by, recorded_at)
SELECT job_id, 2, NULL, NULL, deleted_at FROM job_definitions WHERE deleted_at IS NOT NULL;
UPDATE job_definitions SET version = CASE WHEN deleted_at IS NULL THEN 1 ELSE 2 END;

-- Who asked for each run (a trigger's or a backfill's triggered_by), and the definition it
-- ran: the offset its JobDue's snapshot names, and that record's version once projected.
ALTER TABLE job_executions ADD COLUMN triggered_by text;
ALTER TABLE job_executions ADD COLUMN definition_offset bigint;
ALTER TABLE job_executions ADD COLUMN definition_version integer;
-- Executions projected before their definition's version (another monitor projects
-- `job-definitions`): resolved when it comes. Partial: normally empty.
CREATE INDEX job_executions_version_unresolved ON job_executions (job_id, definition_offset)
    WHERE definition_version IS NULL AND definition_offset IS NOT NULL;

-- The upstream executions a DAG step saw when it was decided, so that an approval or a
-- requeue hands the step the same view (services/monitor/advance.py).
ALTER TABLE dag_evaluations ADD COLUMN upstream_executions uuid[];
