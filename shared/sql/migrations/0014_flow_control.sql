-- cronstream projection, version 14: flow control (docs/decisions/0056). Numbered 14, not
-- 13, so that it never clashes with another branch's 13.

-- Why an execution is (or was last) held back: the `waiting_reason` of its WAITING event.
-- Kept after it is admitted (why it started late); `runs` shows it while it waits.
ALTER TABLE job_executions ADD COLUMN waiting_reason text;

-- WAITING joins the live states (statuses.ACTIVE): the partial index follows.
DROP INDEX IF EXISTS job_executions_active;
CREATE INDEX job_executions_active ON job_executions (status)
    WHERE status IN ('WAITING', 'QUEUED', 'RUNNING', 'AWAITING_APPROVAL');
