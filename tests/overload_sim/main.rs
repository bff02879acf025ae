//! The overload simulation: one bulkhead under overload in virtual time,
//! driving the library's own overload state machines (`src/overload/`,
//! compiled here by path: they read no clock and take no lock), and the
//! tables and the plot of the overload guide drawn from it.
//!
//! After changing the simulation or a state machine, redraw the guide's
//! tables and plot:
//!
//! ```text
//! WATERTIGHT_WRITE_DOCS=1 cargo test --test overload_sim plot
//! ```

// The state machines, as the library compiles them. The bulkhead uses
// some of their methods that the simulation does not.
#[allow(dead_code)]
#[path = "../../src/overload/mod.rs"]
mod overload;

mod plot;
mod sim;
