-- `cronstream init --roles` (shared/db_roles.py), run with an administrator's URL: the
-- three roles of least privilege, and the owner of what exists already. The grants are
-- in migration 0008 (cronstream_grant_roles()).

-- name: create_roles
-- LOGIN roles without a password until one is set (set_password). Two `init --roles` at
-- the same moment: the loser's CREATE finds the role made, which is what it wanted.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['cronstream_owner', 'cronstream_writer', 'cronstream_reader'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN', name);
                RAISE NOTICE 'created role %', name;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
    IF NOT EXISTS (
        SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
        WHERE r.rolname = 'cronstream_reader' AND s.setdatabase = 0
          AND 'default_transaction_read_only=on' = ANY (s.setconfig)) THEN
        ALTER ROLE cronstream_reader SET default_transaction_read_only = on;
    END IF;
    -- Migrations run as the owner: whoever runs `init --roles` must be able to SET ROLE
    -- to it (a superuser can; a CREATEROLE administrator is made a member).
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role('cronstream_owner', 'MEMBER') THEN
        GRANT cronstream_owner TO CURRENT_USER;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO cronstream_owner, cronstream_writer, '
                   'cronstream_reader', current_database());
    -- Only the owner creates objects (PostgreSQL before 15 let every role create in public).
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    GRANT USAGE, CREATE ON SCHEMA public TO cronstream_owner;
END;
$$;

-- name: existing_roles
SELECT rolname FROM pg_roles
WHERE rolname IN ('cronstream_owner', 'cronstream_writer', 'cronstream_reader');

-- name: stage_password
-- The role and its SCRAM verifier for set_password, in this transaction only (a utility
-- statement takes no parameters).
SELECT set_config('cronstream.role', $1, true), set_config('cronstream.verifier', $2, true);

-- name: set_password
DO $$
BEGIN
    EXECUTE format('ALTER ROLE %I PASSWORD %L', current_setting('cronstream.role'),
                   current_setting('cronstream.verifier'));
END;
$$;

-- name: adopt_objects
-- Tables, views, sequences and functions of the schema that another role created (an
-- installation that ran `init` as a superuser or an older single user) become the
-- owner's, so that its migrations may alter them. Sequences owned by a column follow
-- their table; extension members stay their extension's.
DO $$
DECLARE
    obj record;
BEGIN
    FOR obj IN
        SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
          AND pg_get_userbyid(c.relowner) <> 'cronstream_owner'
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i'))
    LOOP
        EXECUTE format('ALTER %s public.%I OWNER TO cronstream_owner',
                       CASE obj.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                        WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                                        ELSE 'TABLE' END,
                       obj.relname);
    END LOOP;
    FOR obj IN
        SELECT p.oid::regprocedure AS signature FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> 'cronstream_owner'
          AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                          AND d.objid = p.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO cronstream_owner', obj.signature);
    END LOOP;
END;
$$;

-- name: become_owner
SET ROLE cronstream_owner;

-- name: stop_being_owner
RESET ROLE;
