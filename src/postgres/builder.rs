//! `PgSemaphore::builder`: settings, their checks, the schema's set-up and
//! the first connection.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Config, NoTls};

use super::error::{ConfigError, Failure};
use super::inner::{Inner, Settings};
use super::semaphore::PgSemaphore;
use super::{keeper, sql};
use crate::lease::{LeaseSettings, Timing, default_label};
use crate::timer::Timer;
use crate::timer::timeout::Timeout;

/// The longest semaphore name.
const MAX_NAME: usize = 200;

/// Configures a [`PgSemaphore`]; made by [`PgSemaphore::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct PgSemaphoreBuilder {
    config: Config,
    name: String,
    schema: String,
    lease: LeaseSettings,
    create_schema: bool,
}

impl PgSemaphore {
    /// Starts configuring the semaphore `name` on the database `config`
    /// names (a [`Config`], parsed from a URL such as
    /// `postgres://app@db.internal/app` or a `key=value` string). Every
    /// process that uses the same name in the same schema shares its
    /// permits.
    pub fn builder(config: Config, name: impl Into<String>) -> PgSemaphoreBuilder {
        PgSemaphoreBuilder {
            config,
            name: name.into(),
            schema: "watertight".into(),
            lease: LeaseSettings::default(),
            create_schema: true,
        }
    }

    /// The statements that create the tables and functions in `schema`,
    /// for a database whose migrations are its own (then build with
    /// [`create_schema(false)`](PgSemaphoreBuilder::create_schema)). They
    /// are idempotent.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadSchema`] for a schema name that is not a plain
    /// lower-case identifier.
    pub fn schema_sql(schema: &str) -> Result<String, ConfigError> {
        if !sql::valid_schema(schema) {
            return Err(ConfigError::BadSchema);
        }
        Ok(sql::schema(schema))
    }
}

impl PgSemaphoreBuilder {
    /// The schema of the tables and functions (default `"watertight"`): a
    /// lower-case identifier of at most 63 bytes.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    // The settings every leased semaphore has: their setters are written
    // once (`lease_setters!`), their docs are the database's.
    crate::lease::lease_setters! {
        /// The limit to store if the database holds no row for this semaphore
        /// yet (default 1). Once stored, the limit in the database wins, and
        /// [`PgSemaphore::set_limit`] changes it for every client.
        limit;
        /// How long a lease lives without renewal (default 30 s): a crashed
        /// holder's permit comes back after at most this long. At least 100 ms.
        lease_ttl;
        /// How often held leases are renewed (default: a third of the time to
        /// live less the [drift margin](Self::drift_margin)). All of a
        /// handle's leases are renewed in one call.
        renew_every;
        /// How much sooner than the database this process stops counting on a
        /// lease (default: 1% of the time to live, at least 10 ms, at most a
        /// quarter of it).
        ///
        /// A lease's local deadline is when the grant or the last successful
        /// renewal was *sent*, plus the time to live, less this margin; from
        /// that instant [`LeasedPermit::is_lost`](super::LeasedPermit::is_lost)
        /// is true. The database starts the time to live when it runs the call
        /// (`clock_timestamp()`, later than the send), so the holder knows at
        /// least the margin before anyone else can be granted the permit, as
        /// long as the two clocks run at rates that differ by less than that
        /// over one time to live and the database's clock is not stepped.
        drift_margin;
        /// The longest a waiter sleeps between attempts when no notification
        /// comes (default 1 s, and never longer than the renewal interval: each
        /// attempt keeps the waiter's row in the line alive).
        max_poll;
        /// A label stored with each lease (the `label` column, shown by
        /// [`PgSemaphore::holders`]; default: host name and process id).
        label;
        /// How long to wait for any answer from the database, a new connection
        /// included, before giving up on it (default 2 s).
        response_timeout;
        /// How long a *waiting* [`acquire`](PgSemaphore::acquire) keeps trying
        /// while the database is unreachable (a restart, a failover) before it
        /// fails with [`LeaseError::Unavailable`](super::LeaseError::Unavailable)
        /// (default 5 s). Zero fails at the first failed attempt.
        outage_tolerance;
        /// The timer for waits between attempts, timeouts and renewals
        /// (default: [`default_timer`](crate::timer::default_timer)).
        timer;
        /// Whether an attempt waits for those ahead of it in the line
        /// (default `true`). With `false`, an attempt takes a free permit even
        /// when others wait (barging): fewer calls per grant when one process
        /// does most of the work. Its waiters still take a place in the line,
        /// and every release serves the line first, in arrival order, so
        /// processes of both kinds share a semaphore without starving anyone;
        /// only the permits a release leaves free are raced for.
        fair;
    }

    /// Whether `build` creates the schema, its tables and functions when
    /// they are missing or of another version (default `true`). With
    /// `false`, it only checks that they are installed (see
    /// [`PgSemaphore::schema_sql`]).
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Checks the settings, connects, sets up the schema if needed (under
    /// an advisory lock, so that processes starting together do it once),
    /// stores the semaphore's row with the limit if it has none, and starts
    /// the renewer on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a setting that cannot work, a failed or
    /// unanswered first connection ([`Connect`](ConfigError::Connect)),
    /// credentials the database refuses ([`Auth`](ConfigError::Auth)), a
    /// user who may not set up or use the schema
    /// ([`Denied`](ConfigError::Denied)). None of them is retried.
    ///
    /// # Cancel safety
    ///
    /// Dropping it mid-way leaves no connection or task behind; what it may
    /// have written (the schema, the semaphore's row) is what every build
    /// writes.
    pub async fn build(self) -> Result<PgSemaphore, ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && !self.name.chars().any(char::is_control);
        if !name_ok {
            return Err(ConfigError::BadName);
        }
        if !sql::valid_schema(&self.schema) {
            return Err(ConfigError::BadSchema);
        }
        let lease = self.lease;
        let Timing { life, renew_every } = lease.timing(
            Duration::from_millis(100),
            [
                ConfigError::BadLeaseTtl,
                ConfigError::BadDriftMargin,
                ConfigError::BadRenewInterval,
            ],
        )?;
        let stored_limit = i64::try_from(lease.limit).map_err(|_| ConfigError::LimitTooLarge)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        let timer = match lease.timer {
            Some(t) => t,
            None => crate::timer::default_timer().ok_or(ConfigError::NoTimer)?,
        };
        let within = lease.response_timeout;
        let bounded = |fut| Timeout::new(fut, timer.sleep(within));
        let set_up = set_up(
            &self.config,
            &self.schema,
            self.create_schema,
            &self.name,
            stored_limit,
        );
        bounded(Box::pin(set_up))
            .await
            .unwrap_or_else(|_elapsed| Err(Failure::silent(within).config()))?;

        let settings = Settings {
            limit: lease.limit,
            lease_ttl: lease.lease_ttl,
            life,
            renew_every,
            max_poll: lease.max_poll.min(renew_every),
            outage_tolerance: lease.outage_tolerance,
            response_timeout: lease.response_timeout,
            fair: lease.fair,
        };
        let inner = Arc::new(Inner::new(
            self.name,
            lease.label.unwrap_or_else(default_label),
            self.config,
            &self.schema,
            timer,
            runtime,
            settings,
        ));
        inner.conn.live().await.map_err(Failure::config)?;
        // The limit stored, which may not be the builder's.
        let sem = PgSemaphore { inner };
        let limit = sem.inner.read_limit().await.map_err(Failure::config)?;
        sem.inner.local.saw_limit(limit);
        keeper::start(&sem.inner);
        Ok(sem)
    }
}

/// On a connection of its own, dropped afterwards: installs the schema if
/// its functions are missing or of another version (or checks that they
/// are, without `create`), and stores the semaphore's row if it has none.
async fn set_up(
    config: &Config,
    schema: &str,
    create: bool,
    name: &str,
    limit: i64,
) -> Result<(), ConfigError> {
    let failed = Failure::config;
    let (client, connection) = config.connect(NoTls).await.map_err(|e| failed(e.into()))?;
    let driver = tokio::spawn(connection);
    let sql_failed = |e: tokio_postgres::Error| failed(e.into());
    let installed = sql::installed(schema);
    let current = async || {
        let row = client.query_one(&installed, &[]).await?;
        let version: Option<String> = row.try_get(0)?;
        Ok(version.as_deref() == Some(sql::VERSION))
    };
    if !current().await.map_err(sql_failed)? {
        if !create {
            return Err(ConfigError::NoSchema);
        }
        // Read again once the lock is held, in a transaction that starts
        // then (so that it sees the catalogs as they are now): of the
        // processes that start together on a database without the schema,
        // the first installs it and the others find it installed. A second
        // install would lock the tables that the first one's process
        // already uses, and could deadlock with its grants. The lock is
        // the session's, and goes with the connection if a step fails.
        let key = format!("hashtext('watertight schema {schema}')");
        client
            .execute(&format!("SELECT pg_advisory_lock({key})"), &[])
            .await
            .map_err(sql_failed)?;
        if !current().await.map_err(sql_failed)? {
            client
                .batch_execute(&format!("BEGIN; {} COMMIT;", sql::schema(schema)))
                .await
                .map_err(sql_failed)?;
        }
        client
            .execute(&format!("SELECT pg_advisory_unlock({key})"), &[])
            .await
            .map_err(sql_failed)?;
    }
    let statements = sql::Statements::new(schema);
    client
        .execute(&statements.create, &[&name, &limit])
        .await
        .map_err(sql_failed)?;
    drop(client);
    let _ = driver.await;
    Ok(())
}
