//! Overload control: the decisions a bulkhead makes when more callers want
//! seats than it has. Each is a small state machine with no
//! clock and no lock, that the bulkhead's policy owns and drives:
//!
//! - [`QueueDelay`] (`queue_delay.rs`): controlled delay on the waiting
//!   line, and adaptive LIFO. A line whose waits have stood at or above a
//!   target for a whole interval is overloaded: its wait budget drops to
//!   the target and, with adaptive LIFO, the newest waiter is served
//!   first, until the line empties.
//! - [`HoldEstimate`] (`deadline.rs`): deadline-aware admission. A call
//!   that carries its deadline is rejected at once when the retry hint's
//!   expected wait plus the expected hold time exceeds the time it has
//!   left, and waits no longer than it could still finish in.
//! - [`Seats`] (`seats.rs`): priority classes with reserved seats that
//!   are lent while idle, returned to their owners first when they free,
//!   and borrowed by importance; the least important shed first.
//! - [`Drr`] (`drr.rs`): deficit round robin over keys with weights, for
//!   the keyed bulkhead's global line.
//!
//! All take time, where they need it, as nanoseconds since an origin the
//! caller picks (the line timer's convention); none reads a clock, so the
//! simulation (`tests/overload_sim/`, which compiles this module's files by
//! path) drives exactly these pieces in virtual time, deterministically. The overload guide
//! (`watertight::guide::overload`) shows what it measures.
//!
//! # Implementation notes
//!
//! The bulkhead's policy runs [`HoldEstimate`] (deadline-aware admission,
//! on the hold-time average it keeps for retry hints) and [`QueueDelay`]
//! (controlled delay and adaptive LIFO, through `bulkhead/delay.rs`, which
//! switches the semaphore to serving its newest waiter first while
//! [`QueueDelay::serve_newest`] says so, and through `bulkhead/classes.rs`
//! on each priority class's line), the bulkhead runs [`Seats`] (priority
//! classes, through `bulkhead/classes.rs`), and the keyed bulkhead runs
//! [`Drr`] (fair shares of its global limit, through `keyed/fair.rs`). A
//! few of their methods serve only the simulation and the unit tests, and
//! are compiled for the tests alone. Each counts and
//! decides; none owns the waiters. The line itself (who waits,
//! in what order inside a class or key, whose deadline is when) stays with
//! its owner, so that a cancelled waiter costs one call (`leave`) and no
//! search, and a hand-off to a waiter that is gone meanwhile is undone by
//! giving the seat back and picking again.

mod deadline;
mod drr;
mod queue_delay;
mod seats;

pub(crate) use deadline::{HoldEstimate, Verdict};
pub(crate) use drr::Drr;
pub(crate) use queue_delay::{Change, QueueDelay};
pub(crate) use seats::{Join, Seats};
