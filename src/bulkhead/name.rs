//! Bulkhead names, interned: each distinct name is stored once for the life
//! of the process, so that a rejection, a metrics snapshot and a leak report
//! carry it as a plain `&'static str`, with no reference count to touch on
//! the rejection path (where a count costs two atomic read-modify-writes,
//! as much as the rest of a rejection).
//!
//! Names are configuration (a dependency, a tenant label under a bounded
//! label set), so the set stays small; a name made per request would grow
//! it for good, which the builder's documentation warns about.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// An interned name: a thin pointer (8 bytes, where a `&str` is 16), which
/// keeps [`Rejected`](crate::Rejected) small enough to return cheaply.
pub(crate) type Name = &'static &'static str;

static NAMES: Mutex<Option<HashMap<&'static str, Name>>> = Mutex::new(None);

/// The interned copy of `name`.
pub(crate) fn intern(name: &str) -> Name {
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let names = names.get_or_insert_with(HashMap::new);
    if let Some(known) = names.get(name) {
        return known;
    }
    let text: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let name: Name = Box::leak(Box::new(text));
    names.insert(text, name);
    name
}

#[cfg(test)]
mod tests {
    use super::intern;

    #[test]
    fn a_name_is_stored_once() {
        let a = intern(&String::from("partner-api"));
        let b = intern(&String::from("partner-api"));
        assert!(core::ptr::eq(a, b));
        assert_eq!(*a, "partner-api");
        assert!(!core::ptr::eq(a, intern("other")));
    }
}
