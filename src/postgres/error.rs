//! Errors of the PostgreSQL semaphore.
//!
//! A variant that holds the client's error returns it from `source()` and
//! does not repeat it in `Display`.

use core::fmt;
use std::io;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::LostReason;

/// The error PostgreSQL or the connection gave: the client's error, or a
/// call that went unanswered for the `response_timeout`.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lease was not granted.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseError {
    /// Every permit is leased ([`try_acquire`](super::PgSemaphore::try_acquire)
    /// only; `acquire` waits instead).
    NoPermits {
        /// The time until the earliest lease expires, as PostgreSQL sees
        /// it: when a permit comes back at the latest if its holder
        /// crashed. `None` when no lease is held (a limit of zero).
        retry_after: Option<Duration>,
        /// The limit every client obeys, as stored in the database.
        limit: usize,
    },
    /// PostgreSQL could not be reached, did not answer within the
    /// `response_timeout`, or is not serving for now (starting, shutting
    /// down, in recovery): the errors a waiting `acquire` rides out for up
    /// to the builder's `outage_tolerance`. The semaphore fails closed: no
    /// permit is granted without the database.
    Unavailable(Cause),
    /// [`close`](super::PgSemaphore::close) was called on this handle.
    Closed,
    /// PostgreSQL refused the call for lack of rights on the schema, its
    /// tables or functions (`42501`). Returned at once, never retried.
    Denied(Cause),
    /// PostgreSQL refused the credentials. Returned at once, never retried.
    Auth(Cause),
    /// A statement failed on the server for another reason (the
    /// semaphore's row deleted, the functions of another version), or
    /// answered what this version does not expect. Returned at once, never
    /// retried.
    Sql(Cause),
    /// The number of permits asked for can never be granted: zero, or more
    /// than the limit stored in the database (or than an `integer` holds).
    /// Returned at once (a waiter already in line leaves it when it sees
    /// the limit lowered below its weight), never retried.
    Weight {
        /// The permits asked for.
        permits: u32,
        /// The limit as last read.
        limit: usize,
    },
    /// The lease was lost while [`PgSemaphore::call`](super::PgSemaphore::call)
    /// ran its work, which was dropped unfinished. The reason is the
    /// [`source`](std::error::Error::source).
    Lost(LostReason),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPermits { limit, .. } => write!(f, "all {limit} leased permits are held"),
            Self::Unavailable(_) => f.write_str("postgres is unavailable, no permit granted"),
            Self::Closed => f.write_str("the semaphore was closed"),
            Self::Denied(_) => f.write_str("postgres denied the semaphore's statement"),
            Self::Auth(_) => f.write_str("postgres refused the credentials"),
            Self::Sql(_) => f.write_str("the semaphore's statement failed in postgres"),
            Self::Lost(_) => f.write_str("the lease was lost, the call was dropped"),
            Self::Weight { permits: 0, .. } => f.write_str("an acquire of 0 permits asks for none"),
            Self::Weight { permits, limit } => {
                write!(
                    f,
                    "{permits} permits can never be granted under a limit of {limit}"
                )
            }
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) | Self::Denied(e) | Self::Auth(e) | Self::Sql(e) => Some(&**e),
            Self::Lost(reason) => Some(reason),
            Self::NoPermits { .. } | Self::Closed | Self::Weight { .. } => None,
        }
    }
}

/// What went wrong when a permit was given back.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The lease had expired (or was found lost) before it was released:
    /// for a while the guarded work ran without a permit, and another
    /// holder may have been granted it. `by` is how long ago it expired,
    /// when the database still had the row.
    Overrun {
        /// How long ago the lease expired, if known.
        by: Option<Duration>,
    },
    /// PostgreSQL could not be reached; the lease expires on its own within
    /// its time to live.
    Unavailable(Cause),
    /// PostgreSQL refused the release (rights, credentials, a failed
    /// statement); the lease expires on its own within its time to live.
    Refused(Cause),
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overrun { by: Some(by) } => write!(
                f,
                "the lease had expired {} ms before its release",
                by.as_millis()
            ),
            Self::Overrun { by: None } => f.write_str("the lease was lost before its release"),
            Self::Unavailable(_) => f.write_str("postgres is unavailable; the lease will expire"),
            Self::Refused(_) => f.write_str("postgres refused the release; the lease will expire"),
        }
    }
}

impl std::error::Error for ReleaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(e) | Self::Refused(e) => Some(&**e),
            Self::Overrun { .. } => None,
        }
    }
}

/// Why [`build`](super::PgSemaphoreBuilder::build) failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name is empty, longer than 200 bytes, or holds a control
    /// character.
    BadName,
    /// The schema is not a lower-case identifier of at most 63 bytes
    /// (letters, digits and `_`, not starting with a digit or `pg_`).
    BadSchema,
    /// The lease time to live is under 100 ms, or too long to count in
    /// milliseconds.
    BadLeaseTtl,
    /// The drift margin is not shorter than the lease time to live.
    BadDriftMargin,
    /// The renewal interval is zero, or not shorter than the time to live
    /// less the drift margin.
    BadRenewInterval,
    /// The limit does not fit the database's `bigint`.
    LimitTooLarge,
    /// `build` was called outside a tokio runtime: the connection and the
    /// lease renewals run on it.
    NoRuntime,
    /// No timer could be found (see [`default_timer`](crate::timer::default_timer)).
    NoTimer,
    /// The first connection failed or went unanswered.
    Connect(Cause),
    /// PostgreSQL refused the credentials.
    Auth(Cause),
    /// The user may not create the schema, its tables and functions (they
    /// are missing, or of another version), or may not use them. A
    /// database whose migrations are its own installs them with
    /// [`PgSemaphore::schema_sql`](super::PgSemaphore::schema_sql).
    Denied(Cause),
    /// Another statement failed while the schema was set up.
    Sql(Cause),
    /// The schema's functions are missing or of another version, and
    /// [`create_schema(false)`](super::PgSemaphoreBuilder::create_schema)
    /// forbids installing them: run
    /// [`PgSemaphore::schema_sql`](super::PgSemaphore::schema_sql) first.
    NoSchema,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadName => f.write_str(
                "the semaphore name must be 1 to 200 bytes with no control characters",
            ),
            Self::BadSchema => f.write_str(
                "the schema must be a lower-case identifier of at most 63 bytes \
                 (letters, digits, `_`), not starting with a digit or `pg_`",
            ),
            Self::BadLeaseTtl => f.write_str("the lease time to live must be at least 100 ms"),
            Self::BadDriftMargin => {
                f.write_str("the drift margin must be shorter than the lease time to live")
            }
            Self::BadRenewInterval => f.write_str(
                "the renewal interval must be above zero and shorter than the lease time to live \
                 less the drift margin",
            ),
            Self::LimitTooLarge => f.write_str("the limit does not fit a postgres bigint"),
            Self::NoRuntime => f.write_str(
                "the postgres semaphore must be built inside a tokio runtime, which runs its \
                 connection and renewals",
            ),
            Self::NoTimer => f.write_str("no timer found: pass one with `timer`"),
            Self::Connect(_) => f.write_str("could not connect to postgres"),
            Self::Auth(_) => f.write_str("postgres refused the credentials"),
            Self::Denied(_) => f.write_str(
                "the user may not set up or use the semaphore's schema (see `PgSemaphore::schema_sql`)",
            ),
            Self::Sql(_) => f.write_str("a statement failed while the schema was set up"),
            Self::NoSchema => f.write_str(
                "the schema's functions are missing or of another version, and create_schema is off",
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) | Self::Auth(e) | Self::Denied(e) | Self::Sql(e) => Some(&**e),
            _ => None,
        }
    }
}

/// What kind of failure a statement's error is, the one rule every caller
/// reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The connection or the server, for now: worth trying again.
    Transient,
    Denied,
    Auth,
    Sql,
}

/// A failed call: the kind, and the error.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) kind: Kind,
    pub(super) cause: Cause,
}

impl Failure {
    /// A call that went unanswered for `timeout`.
    pub(super) fn silent(timeout: Duration) -> Self {
        Self {
            kind: Kind::Transient,
            cause: Box::new(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("postgres did not answer within {} ms", timeout.as_millis()),
            )),
        }
    }

    pub(super) fn lease(self) -> LeaseError {
        match self.kind {
            Kind::Transient => LeaseError::Unavailable(self.cause),
            Kind::Denied => LeaseError::Denied(self.cause),
            Kind::Auth => LeaseError::Auth(self.cause),
            Kind::Sql => LeaseError::Sql(self.cause),
        }
    }

    pub(super) fn release(self) -> ReleaseError {
        match self.kind {
            Kind::Transient => ReleaseError::Unavailable(self.cause),
            _ => ReleaseError::Refused(self.cause),
        }
    }

    pub(super) fn config(self) -> ConfigError {
        match self.kind {
            Kind::Transient => ConfigError::Connect(self.cause),
            Kind::Denied => ConfigError::Denied(self.cause),
            Kind::Auth => ConfigError::Auth(self.cause),
            Kind::Sql => ConfigError::Sql(self.cause),
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self {
            kind: classify(&e),
            cause: Box::new(e),
        }
    }
}

/// Sorts a client error: a closed connection, an I/O error or a server
/// that is not serving for now is transient; a refusal is not.
pub(super) fn classify(e: &tokio_postgres::Error) -> Kind {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection (refused, reset, closed), or a reply
        // the client could not read.
        return Kind::Transient;
    };
    match code {
        c if *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            Kind::Auth
        }
        c if *c == SqlState::INSUFFICIENT_PRIVILEGE => Kind::Denied,
        c if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::T_R_SERIALIZATION_FAILURE
            || *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::TOO_MANY_CONNECTIONS
            || *c == SqlState::READ_ONLY_SQL_TRANSACTION
            || *c == SqlState::QUERY_CANCELED =>
        {
            Kind::Transient
        }
        c if c.code().starts_with("08") => Kind::Transient,
        _ => Kind::Sql,
    }
}
