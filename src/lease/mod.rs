//! What the distributed backends share about a lease once it is granted:
//! this process's view of it ([`Lease`]: its fence, its local deadline,
//! whether it is lost), the future that resolves when it is lost
//! ([`Lost`]), work guarded by it ([`UntilLost`], [`Completed`]), and the
//! ids of leases ([`IdSource`]), and the timing settings both builders
//! check alike ([`Timing`]).
//!
//! Where the lease comes from (a Lua script in Redis, a transaction in
//! PostgreSQL) and how it is renewed is each backend's; the rule that a
//! lease is lost from its local deadline on, whatever task runs, is
//! written here once.

mod call;
mod id;
mod lost;
mod state;
mod timing;

pub use call::Completed;
pub(crate) use call::UntilLost;
pub(crate) use id::IdSource;
pub use lost::Lost;
pub(crate) use state::Lease;
pub(crate) use timing::{BadTiming, Timing, default_label};
