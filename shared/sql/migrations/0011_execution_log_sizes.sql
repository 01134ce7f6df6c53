-- cronstream projection, version 11: what each delivery's log holds where it is kept
-- (services/monitor/log_bounds.py; docs/decisions/0028).

-- A worker bounds the log it ships, but whoever may write to `execution-logs` can send
-- more: the monitor keeps each delivery's log to the same limit, counting here what it
-- kept, in the transaction that keeps the lines and stores the batch's offsets. A
-- restarted monitor goes on from these counts, never from zero; the row is written once
-- per delivery and batch, never per line.
CREATE TABLE execution_log_sizes (
    execution_id uuid NOT NULL,
    delivery integer NOT NULL,
    -- UTF-8 bytes of the handler's lines kept (stdout, stderr, log): up to the limit.
    handler_bytes bigint NOT NULL,
    -- ...and of the worker's own (cronstream notes, the traceback): an allowance of their own.
    note_bytes bigint NOT NULL,
    -- One past the highest seq kept: a line below it may be a repeat of one kept.
    next_seq integer NOT NULL,
    -- The limit was reached: a "[log cut]" line was kept, nothing more of the handler's is.
    cut boolean NOT NULL,
    PRIMARY KEY (execution_id, delivery)
);

-- The logs kept before this version, counted once.
INSERT INTO execution_log_sizes (execution_id, delivery, handler_bytes, note_bytes, next_seq, cut)
SELECT execution_id, delivery,
       coalesce(sum(octet_length(line)) FILTER (WHERE stream IN ('stdout', 'stderr', 'log')), 0),
       coalesce(sum(octet_length(line)) FILTER (WHERE stream NOT IN ('stdout', 'stderr', 'log')), 0),
       max(seq) + 1, false
FROM execution_logs
GROUP BY execution_id, delivery;
