//! The forms of a key that a keyed bulkhead's methods take.

use core::borrow::Borrow;
use core::hash::Hash;

/// A form of the key type `K` that every method of
/// [`KeyedBulkhead`](super::KeyedBulkhead) taking a key accepts: `K` itself,
/// or any type `K` borrows as that hashes and compares as `K` does and can
/// make an owned `K` (for a key seen for the first time). So a bulkhead
/// keyed by `String` takes `&str` as well as `&String`, and one keyed by
/// `Vec<u8>` takes `&[u8]`.
///
/// Implemented for every such type, and for no other; there is nothing to
/// implement. Its one method is the crate's own.
///
/// # Examples
///
/// ```
/// use watertight::keyed::{BorrowedKey, KeyedBulkhead};
///
/// fn admit<Q: BorrowedKey<String> + ?Sized>(tenants: &KeyedBulkhead<String>, tenant: &Q) -> bool {
///     tenants.try_acquire(tenant).is_ok() && tenants.metrics_for(tenant).is_some()
/// }
///
/// let tenants = KeyedBulkhead::<String>::builder().max_concurrent_calls(1).build().unwrap();
/// assert!(admit(&tenants, "acme"));
/// assert!(admit(&tenants, &String::from("globex")));
/// ```
pub trait BorrowedKey<K>: Hash + Eq + ToOwned<Owned = K> + sealed::Of<K> {}

impl<K, Q> BorrowedKey<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
}

// The method in a trait of its own that no one outside the crate can name:
// it cannot clash with another trait's method of the same name in a user's
// scope.
#[allow(unreachable_pub)]
pub(super) mod sealed {
    use core::borrow::Borrow;

    /// How the registry compares a stored key with the form it was given.
    pub trait Of<K> {
        /// `key` in this form.
        fn of(key: &K) -> &Self;
    }

    impl<K: Borrow<Q>, Q: ?Sized> Of<K> for Q {
        #[inline]
        fn of(key: &K) -> &Q {
            key.borrow()
        }
    }
}
