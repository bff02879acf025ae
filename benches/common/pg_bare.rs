//! tokio-postgres alone, on a connection of its own, sending the two
//! prepared statements the PostgreSQL semaphore sends for an uncontended
//! acquire and release, with the same arguments: the floor its client is
//! measured against (`benches/postgres.rs`, `tests/postgres_alloc.rs`).

use tokio_postgres::{Client, NoTls, Statement};

pub struct Bare {
    client: Client,
    acquire: Statement,
    release: Statement,
    name: String,
    n: u64,
}

impl Bare {
    /// Connects to `url` for the semaphore `name`, whose row a build of
    /// the semaphore has stored.
    pub async fn new(url: &str, name: &str) -> Bare {
        let (client, connection) = url
            .parse::<tokio_postgres::Config>()
            .unwrap()
            .connect(NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let acquire = client
            .prepare(
                "SELECT granted, fence, max_permits, free, next_expiry_ms \
                 FROM watertight.acquire($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .unwrap();
        let release = client
            .prepare("SELECT outcome, late_ms FROM watertight.release($1, $2)")
            .await
            .unwrap();
        Bare {
            client,
            acquire,
            release,
            name: name.to_owned(),
            n: 0,
        }
    }

    /// One acquire and release, each checked.
    pub async fn cycle(&mut self) {
        self.n += 1;
        let id = format!("{:032x}", self.n);
        let (holder, label) = ("wt_bare", "bare/0");
        let row = self
            .client
            .query_one(
                &self.acquire,
                &[
                    &self.name,
                    &id,
                    &holder,
                    &label,
                    &1_i32,
                    &30_000_i64,
                    &true,
                    &true,
                ],
            )
            .await
            .unwrap();
        assert!(row.get::<_, bool>(0), "granted");
        let row = self
            .client
            .query_one(&self.release, &[&self.name, &id])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), 0, "released in time");
    }
}
