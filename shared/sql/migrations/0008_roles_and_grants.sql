-- cronstream projection, version 8: what each role of least privilege may do
-- (docs/decisions/0034). The roles are made by `cronstream init --roles` (shared/db_roles.py);
-- the grants are here, in one function that `cronstream init` runs after every migration,
-- so that the tables a later migration adds are granted too, whoever applied it:
--
--   cronstream_owner   owns every object (migrations run as it): the only one with DDL
--   cronstream_writer  the monitor and `cronstream prune`: rows of every table, no DDL
--   cronstream_reader  the dashboard, Grafana, CLI reads: SELECT, every transaction
--                      read-only (ALTER ROLE ... SET default_transaction_read_only)
--
-- A role that does not exist (a database that never ran `init --roles`) is skipped: the
-- next `init` after `init --roles` grants it. Default privileges cover tables created
-- later by the role that ran this and by cronstream_owner, even before the next `init`.

CREATE FUNCTION cronstream_grant_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronstream_writer') THEN
        GRANT USAGE ON SCHEMA public TO cronstream_writer;
        GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO cronstream_writer;
        GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO cronstream_writer;
        -- Which migrations ran is the owner's record: a writer that could add a row to it
        -- could make the next `init` skip a migration.
        REVOKE INSERT, UPDATE, DELETE ON schema_migrations FROM cronstream_writer;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public
            GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO cronstream_writer;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public
            GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO cronstream_writer;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronstream_reader') THEN
        GRANT USAGE ON SCHEMA public TO cronstream_reader;
        GRANT SELECT ON ALL TABLES IN SCHEMA public TO cronstream_reader;
        ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO cronstream_reader;
    END IF;
    -- Tables the owner creates (migrations run as it once `init --roles` has run), when
    -- this runs as someone else who may speak for it (a superuser).
    IF current_user <> 'cronstream_owner'
       AND EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronstream_owner')
       AND pg_has_role('cronstream_owner', 'USAGE') THEN
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronstream_writer') THEN
            ALTER DEFAULT PRIVILEGES FOR ROLE cronstream_owner IN SCHEMA public
                GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO cronstream_writer;
            ALTER DEFAULT PRIVILEGES FOR ROLE cronstream_owner IN SCHEMA public
                GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO cronstream_writer;
        END IF;
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'cronstream_reader') THEN
            ALTER DEFAULT PRIVILEGES FOR ROLE cronstream_owner IN SCHEMA public
                GRANT SELECT ON TABLES TO cronstream_reader;
        END IF;
    END IF;
END;
$$;

-- Only whoever runs the migrations grants.
REVOKE EXECUTE ON FUNCTION cronstream_grant_roles() FROM PUBLIC;
