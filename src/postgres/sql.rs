//! The tables and functions in PostgreSQL, and the statements that call
//! them. Every grant, renewal and release is one function call, so one
//! short transaction: the function locks the semaphore's row first
//! (`FOR UPDATE`), which orders every change to one semaphore, and reads
//! the database's clock (`clock_timestamp()`), so clients' clocks do not
//! matter.

/// Written as the comment of the `acquire` function: `build` skips the
/// schema's statements when the installed functions carry it.
pub(super) const VERSION: &str = "watertight schema 4";

/// The longest schema name: PostgreSQL's identifiers are at most 63 bytes.
const MAX_SCHEMA: usize = 63;

/// Whether `schema` can be written into the statements as it is: a
/// lower-case identifier (letters, digits, `_`, not starting with a digit),
/// which PostgreSQL reads the same quoted or not.
pub(super) fn valid_schema(schema: &str) -> bool {
    let mut bytes = schema.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    first_ok
        && schema.len() <= MAX_SCHEMA
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.starts_with("pg_")
}

/// The statements that create the schema, its tables and functions, for
/// `build` and for teams whose migrations are their own. Idempotent: every
/// statement is `IF NOT EXISTS` or `OR REPLACE`.
pub(super) fn schema(schema: &str) -> String {
    SCHEMA.replace("{s}", schema).replace("{version}", VERSION)
}

/// The statement that reads which version of the functions is installed
/// (`NULL` when none is).
pub(super) fn installed(schema: &str) -> String {
    format!(
        "SELECT obj_description(to_regprocedure('{schema}.acquire({ACQUIRE_ARGS})'), 'pg_proc')"
    )
}

/// The argument types of `acquire`, as `to_regprocedure` names them.
const ACQUIRE_ARGS: &str = "text,text,text,text,integer,bigint,boolean,boolean";

/// The statements every handle prepares on each connection.
pub(super) struct Statements {
    pub(super) acquire: String,
    pub(super) release: String,
    pub(super) renew: String,
    pub(super) set_limit: String,
    pub(super) limit: String,
    pub(super) holders: String,
    pub(super) create: String,
}

impl Statements {
    pub(super) fn new(s: &str) -> Self {
        Self {
            acquire: format!(
                "SELECT granted, fence, max_permits, free, next_expiry_ms \
                 FROM {s}.acquire($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            release: format!("SELECT outcome, late_ms FROM {s}.release($1, $2)"),
            renew: format!("SELECT id FROM {s}.renew($1, $2, $3) AS id"),
            set_limit: format!("SELECT {s}.set_limit($1, $2)"),
            limit: format!("SELECT max_permits FROM {s}.semaphores WHERE name = $1"),
            holders: format!(
                "SELECT id, label, weight, fence, \
                 (extract(epoch FROM clock_timestamp() - granted_at) * 1000)::bigint, \
                 (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint \
                 FROM {s}.leases WHERE semaphore = $1 AND expires_at > clock_timestamp() \
                 ORDER BY fence"
            ),
            create: format!(
                "INSERT INTO {s}.semaphores (name, max_permits) VALUES ($1, $2) \
                 ON CONFLICT (name) DO NOTHING"
            ),
        }
    }
}

/// The schema. `{s}` is the schema's name.
///
/// * `semaphores`: one row per semaphore, with its limit. Every function
///   that changes a semaphore's leases or line locks this row first.
/// * `leases`: one row per grant, with the holder's channel and label, the
///   weight, the fencing token and the expiry, on the database's clock.
/// * `waiters`: the fair line, in arrival order; a row lives until its
///   `expires_at` unless its waiter looks again (each attempt pushes it
///   on), so a dead process's waiters leave the line by themselves.
/// * `fences`, `arrivals`: sequences, which never go back (a crash skips
///   values, never repeats one), so fencing tokens increase across
///   restarts.
const SCHEMA: &str = r#"
CREATE SCHEMA IF NOT EXISTS {s};

CREATE TABLE IF NOT EXISTS {s}.semaphores (
    name        text PRIMARY KEY,
    max_permits bigint NOT NULL CHECK (max_permits >= 0),
    used        bigint NOT NULL DEFAULT 0,
    changed_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE SEQUENCE IF NOT EXISTS {s}.fences;
CREATE SEQUENCE IF NOT EXISTS {s}.arrivals;

CREATE TABLE IF NOT EXISTS {s}.leases (
    semaphore  text NOT NULL REFERENCES {s}.semaphores (name) ON DELETE CASCADE,
    id         text NOT NULL,
    holder     text NOT NULL,
    label      text NOT NULL,
    weight     integer NOT NULL CHECK (weight > 0),
    fence      bigint NOT NULL,
    granted_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (semaphore, id)
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON {s}.leases (semaphore, expires_at);

CREATE TABLE IF NOT EXISTS {s}.waiters (
    semaphore  text NOT NULL REFERENCES {s}.semaphores (name) ON DELETE CASCADE,
    id         text NOT NULL,
    holder     text NOT NULL,
    label      text NOT NULL,
    weight     integer NOT NULL CHECK (weight > 0),
    arrival    bigint NOT NULL,
    ttl_ms     bigint NOT NULL CHECK (ttl_ms > 0),
    since      timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (semaphore, id)
);
CREATE INDEX IF NOT EXISTS waiters_in_line ON {s}.waiters (semaphore, arrival);
CREATE INDEX IF NOT EXISTS waiters_by_expiry ON {s}.waiters (semaphore, expires_at);

-- Every row of `leases` and `waiters` is inserted once and deleted once, so
-- between two vacuums their indexes hold an entry for every row deleted
-- since. The functions read them only by a key or by the first entry of a
-- range (`LIMIT 1`, `EXISTS`): an index scan marks each entry of a deleted
-- row it passes, and later scans skip it, so a busy semaphore stays as
-- fast between vacuums. The permits in use are counted in `used`, not
-- summed.

-- Drops the semaphore's expired leases and the waiters that stopped
-- looking, then grants the line's head while it fits, in arrival order,
-- and tells each waiter served on its process's channel ("id fence").
-- The caller holds the semaphore's row lock. Returns the permits left.
CREATE OR REPLACE FUNCTION {s}.serve(sem text, lim bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t     timestamptz := clock_timestamp();
    was   bigint;
    taken bigint;
    freed bigint;
    w     record;
    f     bigint;
BEGIN
    SELECT s.used INTO was FROM {s}.semaphores s WHERE s.name = sem;
    taken := was;
    IF EXISTS (SELECT 1 FROM {s}.leases l WHERE l.semaphore = sem AND l.expires_at <= t) THEN
        WITH gone AS (
            DELETE FROM {s}.leases l WHERE l.semaphore = sem AND l.expires_at <= t
            RETURNING l.weight)
        SELECT coalesce(sum(gone.weight), 0) INTO freed FROM gone;
        taken := taken - freed;
    END IF;
    IF EXISTS (SELECT 1 FROM {s}.waiters x WHERE x.semaphore = sem AND x.expires_at <= t) THEN
        DELETE FROM {s}.waiters x WHERE x.semaphore = sem AND x.expires_at <= t;
    END IF;
    -- Lease rows deleted by hand: nothing is held if no row is left (and
    -- `renew` counts afresh while some are).
    IF taken <> 0 AND NOT EXISTS (SELECT 1 FROM {s}.leases l WHERE l.semaphore = sem) THEN
        taken := 0;
    END IF;
    LOOP
        SELECT x.id, x.holder, x.label, x.weight, x.ttl_ms INTO w FROM {s}.waiters x
            WHERE x.semaphore = sem ORDER BY x.arrival LIMIT 1;
        EXIT WHEN NOT FOUND OR taken + w.weight > lim;
        f := nextval('{s}.fences');
        t := clock_timestamp();
        INSERT INTO {s}.leases (semaphore, id, holder, label, weight, fence, granted_at, expires_at)
            VALUES (sem, w.id, w.holder, w.label, w.weight, f, t,
                    t + w.ttl_ms * interval '1 millisecond');
        DELETE FROM {s}.waiters x WHERE x.semaphore = sem AND x.id = w.id;
        PERFORM pg_notify(w.holder, w.id || ' ' || f);
        taken := taken + w.weight;
    END LOOP;
    IF taken <> was THEN
        UPDATE {s}.semaphores s SET used = taken WHERE s.name = sem;
    END IF;
    RETURN lim - taken;
END $$;

-- One attempt of the lease `lease_id`: granted (a grant made to it while
-- it waited is renewed from now), or else, with `queue`, a place in the
-- line kept (or taken, at its back). With `fair`, nobody ahead in the
-- line may be passed.
CREATE OR REPLACE FUNCTION {s}.acquire(
    sem text, lease_id text, who text, who_label text, w integer, ttl_ms bigint,
    fair boolean, queue boolean,
    OUT granted boolean, OUT fence bigint, OUT max_permits bigint, OUT free bigint,
    OUT next_expiry_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    t    timestamptz;
    mine bigint;
    ahead boolean;
    ttl  interval := ttl_ms * interval '1 millisecond';
BEGIN
    SELECT s.max_permits INTO max_permits FROM {s}.semaphores s WHERE s.name = sem FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'watertight: semaphore % has no row in {s}.semaphores', sem
            USING ERRCODE = 'no_data_found';
    END IF;
    granted := false;
    t := clock_timestamp();
    UPDATE {s}.leases l SET expires_at = t + ttl
        WHERE l.semaphore = sem AND l.id = lease_id AND l.expires_at > t
        RETURNING l.fence INTO fence;
    IF FOUND THEN
        granted := true;
        DELETE FROM {s}.waiters x WHERE x.semaphore = sem AND x.id = lease_id;
    ELSE
        -- Keeps this waiter's place while it serves the line.
        UPDATE {s}.waiters x SET expires_at = t + ttl
            WHERE x.semaphore = sem AND x.id = lease_id
            RETURNING x.arrival INTO mine;
        free := {s}.serve(sem, max_permits);
        SELECT l.fence INTO fence FROM {s}.leases l
            WHERE l.semaphore = sem AND l.id = lease_id;
        IF FOUND THEN
            granted := true;
        ELSE
            IF NOT fair THEN
                ahead := false;
            ELSIF mine IS NULL THEN
                ahead := EXISTS (SELECT 1 FROM {s}.waiters x WHERE x.semaphore = sem);
            ELSE
                ahead := EXISTS (SELECT 1 FROM {s}.waiters x
                                 WHERE x.semaphore = sem AND x.arrival < mine);
            END IF;
            IF w <= free AND NOT ahead THEN
                fence := nextval('{s}.fences');
                t := clock_timestamp();
                INSERT INTO {s}.leases (semaphore, id, holder, label, weight, fence, granted_at, expires_at)
                    VALUES (sem, lease_id, who, who_label, w, fence, t, t + ttl);
                IF mine IS NOT NULL THEN
                    DELETE FROM {s}.waiters x WHERE x.semaphore = sem AND x.id = lease_id;
                END IF;
                UPDATE {s}.semaphores s SET used = s.used + w WHERE s.name = sem;
                granted := true;
            ELSIF queue AND mine IS NULL THEN
                INSERT INTO {s}.waiters (semaphore, id, holder, label, weight, arrival, ttl_ms, since, expires_at)
                    VALUES (sem, lease_id, who, who_label, w, nextval('{s}.arrivals'), ttl_ms, t, t + ttl);
            END IF;
        END IF;
    END IF;
    SELECT s.max_permits - s.used INTO free FROM {s}.semaphores s WHERE s.name = sem;
    SELECT (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint
        INTO next_expiry_ms
        FROM {s}.leases l WHERE l.semaphore = sem ORDER BY l.expires_at LIMIT 1;
END $$;
COMMENT ON FUNCTION {s}.acquire(text, text, text, text, integer, bigint, boolean, boolean)
    IS '{version}';

-- Gives back the lease `lease_id`, or takes its waiter out of the line
-- (an acquire dropped while it waited), then serves the line. Outcome 0:
-- released in time; 1: it had expired `late_ms` ago; 2: no such lease.
CREATE OR REPLACE FUNCTION {s}.release(sem text, lease_id text,
    OUT outcome integer, OUT late_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    lim bigint;
    t   timestamptz;
    exp timestamptz;
    w   integer;
BEGIN
    SELECT s.max_permits INTO lim FROM {s}.semaphores s WHERE s.name = sem FOR UPDATE;
    t := clock_timestamp();
    DELETE FROM {s}.waiters x WHERE x.semaphore = sem AND x.id = lease_id;
    DELETE FROM {s}.leases l WHERE l.semaphore = sem AND l.id = lease_id
        RETURNING l.expires_at, l.weight INTO exp, w;
    IF NOT FOUND THEN
        outcome := 2;
    ELSE
        UPDATE {s}.semaphores s SET used = s.used - w WHERE s.name = sem;
        IF exp <= t THEN
            outcome := 1;
            late_ms := (extract(epoch FROM t - exp) * 1000)::bigint;
        ELSE
            outcome := 0;
        END IF;
    END IF;
    IF lim IS NOT NULL THEN
        PERFORM {s}.serve(sem, lim);
    END IF;
END $$;

-- Renews the leases `ids` that have not expired; returns those renewed.
-- It locks the semaphore's row as every other change does (so that it and
-- a release that drops expired leases never wait for each other's rows),
-- counts the permits in use afresh (a lease row deleted by hand gives its
-- permits back here), and serves the line: a lease that expired meanwhile
-- is dropped, and its permit granted, at the next renewal of any holder.
CREATE OR REPLACE FUNCTION {s}.renew(sem text, ids text[], ttl_ms bigint)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    lim bigint;
    t   timestamptz;
BEGIN
    SELECT s.max_permits INTO lim FROM {s}.semaphores s WHERE s.name = sem FOR UPDATE;
    t := clock_timestamp();
    RETURN QUERY
        UPDATE {s}.leases l SET expires_at = t + ttl_ms * interval '1 millisecond'
        WHERE l.semaphore = sem AND l.id = ANY (ids) AND l.expires_at > t
        RETURNING l.id;
    IF lim IS NOT NULL THEN
        UPDATE {s}.semaphores s
            SET used = (SELECT coalesce(sum(l.weight), 0) FROM {s}.leases l WHERE l.semaphore = sem)
            WHERE s.name = sem;
        PERFORM {s}.serve(sem, lim);
    END IF;
END $$;

-- Changes the limit for every client, and serves the line if it grew.
CREATE OR REPLACE FUNCTION {s}.set_limit(sem text, lim bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.semaphores s SET max_permits = lim, changed_at = clock_timestamp()
        WHERE s.name = sem;
    IF FOUND THEN
        PERFORM {s}.serve(sem, lim);
    END IF;
END $$;
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["watertight", "_q", "app_2", &"a".repeat(63)] {
            assert!(valid_schema(good), "{good}");
        }
        for bad in [
            "",
            "Watertight",
            "2app",
            "app-quota",
            "a.b",
            "a;drop",
            "pg_quota",
            "quota\"",
            &"a".repeat(64),
        ] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }

    #[test]
    fn the_schema_names_its_schema_everywhere() {
        let sql = schema("quota");
        assert!(!sql.contains("{s}") && !sql.contains("{version}"));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS quota.leases"));
        assert!(sql.contains(VERSION));
        assert!(installed("quota").contains(ACQUIRE_ARGS));
    }
}
