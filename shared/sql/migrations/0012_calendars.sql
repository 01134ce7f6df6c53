-- cronstream projection, version 12: named calendars and their history, and the timing
-- fields a definition gained with them (docs/decisions/0055).

-- Every accepted record of `calendars`, numbered per calendar from 1 in the order of the
-- topic, as job_definition_versions numbers a job's (decision 0036): a change, a re-apply,
-- a delete (definition NULL) and a re-create each make the next version.
CREATE TABLE calendar_versions (
    calendar_id  text NOT NULL,
    version      integer NOT NULL,
    definition   jsonb,
    created_by   text,
    recorded_at  timestamptz NOT NULL,
    kafka_offset bigint NOT NULL,
    projected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (calendar_id, version)
);
-- A record projected twice (after a crash) is one version.
CREATE UNIQUE INDEX calendar_versions_offset ON calendar_versions (calendar_id, kafka_offset);

-- The current calendars (a deleted one keeps its row, definition NULL, until re-created):
-- what `cronstream calendars` lists and the dashboard's timeline evaluates.
CREATE TABLE calendars (
    calendar_id text PRIMARY KEY,
    timezone    text,
    definition  jsonb,
    version     integer NOT NULL,
    created_by  text,
    updated_at  timestamptz NOT NULL,
    deleted_at  timestamptz
);

ALTER TABLE job_definitions ADD COLUMN calendar text;
ALTER TABLE job_definitions ADD COLUMN on_excluded text NOT NULL DEFAULT 'SKIP';
ALTER TABLE job_definitions ADD COLUMN jitter_seconds integer NOT NULL DEFAULT 0;
ALTER TABLE job_definitions ADD COLUMN max_runs integer;
-- The jobs of a calendar: what its change re-plans (their next run).
CREATE INDEX job_definitions_calendar ON job_definitions (calendar) WHERE calendar IS NOT NULL;
