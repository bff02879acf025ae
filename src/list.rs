//! A doubly linked intrusive list: the raw, unsafe layer under the
//! semaphore's wait queue.
//!
//! The list never owns its nodes. Each node lives inside a pinned future (or
//! any other pinned place) and carries its own [`Links`]. The list only
//! stores pointers, so pushing and removing allocate nothing, and removal of
//! any node is O(1) because the list is doubly linked.
//!
//! # Invariants
//!
//! * The list and the links of every node in it are only touched by the one
//!   thread that holds the lock guarding the list (the semaphore's mutex);
//!   the [`List`] itself sits inside that mutex, and a node's [`Links`] are
//!   in `UnsafeCell`s that are read and written only through `&mut List`.
//! * A node stays at the same address, and alive, from `push_back` or
//!   `push_front` until it is removed (by `pop_front` or `remove`). Nodes
//!   are `!Unpin` so their owners can only link them once pinned.
//! * `len` is the number of nodes reachable from `head`.

use core::marker::PhantomPinned;
use core::ptr::NonNull;

use crate::loom::UnsafeCell;

/// The pointers that make a node part of a [`List`].
pub(crate) struct Links<T> {
    /// The node before this one; `None` at the head. Only touched through
    /// `&mut List` while the node is linked.
    prev: UnsafeCell<Option<NonNull<T>>>,
    /// The node after this one; `None` at the tail. Same rule as `prev`.
    next: UnsafeCell<Option<NonNull<T>>>,
    /// Another pointer may point at this node, so it must not move.
    _pin: PhantomPinned,
}

impl<T> Links<T> {
    pub(crate) fn new() -> Self {
        Self {
            prev: UnsafeCell::new(None),
            next: UnsafeCell::new(None),
            _pin: PhantomPinned,
        }
    }
}

impl<T> core::fmt::Debug for Links<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The pointers may only be read under the list's lock, which we do not
        // hold here, so print no more than the type.
        f.debug_struct("Links").finish_non_exhaustive()
    }
}

/// A type that embeds [`Links`] and can therefore be put in a [`List`].
///
/// # Safety
///
/// `links` must return a pointer to a `Links<Self>` stored inside the node
/// that `this` points to, valid for as long as the node is.
pub(crate) unsafe trait Linked: Sized {
    /// Returns the links embedded in the node.
    ///
    /// # Safety
    ///
    /// `this` must point to a live node.
    unsafe fn links(this: NonNull<Self>) -> NonNull<Links<Self>>;
}

/// The head of an intrusive, doubly linked FIFO list.
pub(crate) struct List<T: Linked> {
    head: Option<NonNull<T>>,
    tail: Option<NonNull<T>>,
    len: usize,
}

// SAFETY: the list only holds pointers to nodes; the nodes are accessed only
// by whoever holds `&mut List`, which the enclosing mutex hands to one thread
// at a time. The node types used with it (`Waiter`) are `Sync`.
unsafe impl<T: Linked + Sync> Send for List<T> {}

impl<T: Linked> List<T> {
    /// An empty list.
    pub(crate) const fn new() -> Self {
        Self {
            head: None,
            tail: None,
            len: 0,
        }
    }

    /// The number of linked nodes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no node is linked.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    /// The first node, without unlinking it.
    #[inline]
    pub(crate) fn front(&self) -> Option<NonNull<T>> {
        self.head
    }

    /// The last node, without unlinking it.
    #[inline]
    pub(crate) fn back(&self) -> Option<NonNull<T>> {
        self.tail
    }

    /// Appends `node` at the tail.
    ///
    /// # Safety
    ///
    /// `node` must point to a live node that is not linked in any list, and
    /// it must stay alive and at the same address until it is unlinked with
    /// [`pop_front`](Self::pop_front) or [`remove`](Self::remove).
    pub(crate) unsafe fn push_back(&mut self, node: NonNull<T>) {
        // SAFETY: the caller's contract is `link`'s.
        unsafe { self.link(node, self.tail, None) };
    }

    /// Puts `node` at the head.
    ///
    /// # Safety
    ///
    /// As [`push_back`](Self::push_back).
    pub(crate) unsafe fn push_front(&mut self, node: NonNull<T>) {
        // SAFETY: the caller's contract is `link`'s.
        unsafe { self.link(node, None, self.head) };
    }

    /// Links `node` between `prev` and `next`, which are adjacent (or the
    /// ends of the list).
    ///
    /// # Safety
    ///
    /// As [`push_back`](Self::push_back); `prev` and `next` are linked here.
    unsafe fn link(
        &mut self,
        node: NonNull<T>,
        prev: Option<NonNull<T>>,
        next: Option<NonNull<T>>,
    ) {
        debug_assert!(
            self.head != Some(node) && self.tail != Some(node),
            "node must not be pushed twice"
        );
        // SAFETY: the caller guarantees `node` is live; we hold `&mut self`,
        // so nobody else touches any linked node's links.
        let links = unsafe { T::links(node).as_ref() };
        links.prev.with_mut(|p| unsafe {
            // SAFETY: exclusive access to the links, as above.
            *p = prev;
        });
        links.next.with_mut(|p| unsafe {
            // SAFETY: exclusive access to the links, as above.
            *p = next;
        });
        match prev {
            // SAFETY: a linked node is alive (push's contract).
            Some(prev) => unsafe { set_next(prev, Some(node)) },
            None => self.head = Some(node),
        }
        match next {
            // SAFETY: a linked node is alive (push's contract).
            Some(next) => unsafe { set_prev(next, Some(node)) },
            None => self.tail = Some(node),
        }
        self.len += 1;
    }

    /// Unlinks and returns the first node.
    pub(crate) fn pop_front(&mut self) -> Option<NonNull<T>> {
        let head = self.head?;
        // SAFETY: `head` is linked, so it is alive and in this list.
        unsafe { self.remove(head) };
        Some(head)
    }

    /// Unlinks `node`. Its links are left as they were, stale: nothing
    /// reads an unlinked node's links, and linking it again overwrites
    /// both (two stores fewer on a cancellation's path).
    ///
    /// # Safety
    ///
    /// `node` must be linked in this list.
    pub(crate) unsafe fn remove(&mut self, node: NonNull<T>) {
        // SAFETY: the caller guarantees `node` is linked here, hence alive;
        // `&mut self` gives exclusive access to the links of linked nodes.
        let (prev, next) = unsafe {
            let links = T::links(node).as_ref();
            (links.prev.with(|p| *p), links.next.with(|p| *p))
        };
        debug_assert!(prev != Some(node), "node must not be linked to itself");
        match prev {
            // SAFETY: a linked node's neighbour is linked, hence alive.
            Some(prev) => unsafe { set_next(prev, next) },
            None => {
                debug_assert!(
                    self.head == Some(node),
                    "a node with no prev must be the head"
                );
                self.head = next;
            }
        }
        match next {
            // SAFETY: a linked node's neighbour is linked, hence alive.
            Some(next) => unsafe { set_prev(next, prev) },
            None => {
                debug_assert!(
                    self.tail == Some(node),
                    "a node with no next must be the tail"
                );
                self.tail = prev;
            }
        }
        self.len -= 1;
    }

    /// Walks the list and panics if its links are inconsistent: a broken
    /// back-pointer, a wrong tail, or a length that does not match.
    #[cfg(test)]
    pub(crate) fn assert_valid(&self) {
        let mut prev: Option<NonNull<T>> = None;
        let mut cur = self.head;
        let mut count = 0;
        while let Some(node) = cur {
            // SAFETY: every node reachable from `head` is linked, hence alive.
            let links = unsafe { T::links(node).as_ref() };
            // SAFETY: `&self` excludes `&mut List`, the only writer of links.
            let back = links.prev.with(|p| unsafe { *p });
            assert_eq!(back, prev, "node's prev must point at the node before it");
            prev = Some(node);
            // SAFETY: as above.
            cur = links.next.with(|p| unsafe { *p });
            count += 1;
            assert!(count <= self.len, "list must not be longer than its length");
        }
        assert_eq!(prev, self.tail, "tail must be the last reachable node");
        assert_eq!(count, self.len, "length must count every linked node");
    }
}

impl<T: Linked> core::fmt::Debug for List<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("List").field("len", &self.len).finish()
    }
}

/// # Safety
///
/// `node` must be linked in a list the caller holds exclusively.
unsafe fn set_next<T: Linked>(node: NonNull<T>, next: Option<NonNull<T>>) {
    // SAFETY: guaranteed by the caller.
    unsafe { T::links(node).as_ref().next.with_mut(|p| *p = next) }
}

/// # Safety
///
/// `node` must be linked in a list the caller holds exclusively.
unsafe fn set_prev<T: Linked>(node: NonNull<T>, prev: Option<NonNull<T>>) {
    // SAFETY: guaranteed by the caller.
    unsafe { T::links(node).as_ref().prev.with_mut(|p| *p = prev) }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use core::pin::Pin;

    /// A node that records a value, for checking order.
    struct Node {
        links: Links<Node>,
        value: u32,
    }

    // SAFETY: `links` returns the node's own `links` field.
    unsafe impl Linked for Node {
        unsafe fn links(this: NonNull<Self>) -> NonNull<Links<Self>> {
            // SAFETY: `this` points to a live node (caller's contract).
            unsafe { NonNull::new_unchecked(core::ptr::addr_of_mut!((*this.as_ptr()).links)) }
        }
    }

    fn node(value: u32) -> Pin<Box<Node>> {
        Box::pin(Node {
            links: Links::new(),
            value,
        })
    }

    fn ptr(node: &Pin<Box<Node>>) -> NonNull<Node> {
        NonNull::from(&**node)
    }

    fn drain(list: &mut List<Node>) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(n) = list.pop_front() {
            // SAFETY: the boxes outlive the list in every test.
            out.push(unsafe { n.as_ref() }.value);
            list.assert_valid();
        }
        out
    }

    #[test]
    fn pushes_and_pops_in_fifo_order() {
        let nodes: Vec<_> = (0..5).map(node).collect();
        let mut list = List::new();
        assert!(list.is_empty());
        for n in &nodes {
            // SAFETY: each node is boxed, pinned, unlinked, and outlives the list.
            unsafe { list.push_back(ptr(n)) };
            list.assert_valid();
        }
        assert_eq!(list.len(), 5);
        assert_eq!(list.front(), Some(ptr(&nodes[0])));
        assert_eq!(list.back(), Some(ptr(&nodes[4])));
        assert_eq!(drain(&mut list), [0, 1, 2, 3, 4]);
        assert!(list.is_empty());
        assert_eq!((list.front(), list.back()), (None, None));
    }

    #[test]
    fn removes_head_middle_and_tail() {
        let nodes: Vec<_> = (0..5).map(node).collect();
        let mut list = List::new();
        for n in &nodes {
            // SAFETY: as above.
            unsafe { list.push_back(ptr(n)) };
        }
        for i in [2, 0, 4] {
            // SAFETY: node `i` is linked in `list`.
            unsafe { list.remove(ptr(&nodes[i])) };
            list.assert_valid();
        }
        assert_eq!(list.len(), 2);
        assert_eq!(list.back(), Some(ptr(&nodes[3])), "the tail moves back");
        assert_eq!(drain(&mut list), [1, 3]);
    }

    #[test]
    fn a_removed_node_can_be_linked_again() {
        let (a, b) = (node(1), node(2));
        let mut list = List::new();
        // SAFETY: both nodes are pinned and outlive the list; each is pushed
        // only while unlinked.
        unsafe {
            list.push_back(ptr(&a));
            list.push_back(ptr(&b));
            list.remove(ptr(&a));
            list.push_back(ptr(&a));
        }
        list.assert_valid();
        assert_eq!(drain(&mut list), [2, 1]);
    }

    #[test]
    fn removing_the_only_node_empties_the_list() {
        let a = node(7);
        let mut list = List::new();
        // SAFETY: `a` is pinned, unlinked, and outlives the list.
        unsafe { list.push_back(ptr(&a)) };
        // SAFETY: `a` is linked.
        unsafe { list.remove(ptr(&a)) };
        list.assert_valid();
        assert!(list.is_empty());
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn push_front_puts_a_node_ahead_of_the_others() {
        let nodes: Vec<_> = (0..4).map(node).collect();
        let mut list = List::new();
        // SAFETY: each node is pinned, unlinked when pushed, and outlives
        // the list; a popped node is unlinked again.
        unsafe {
            list.push_front(ptr(&nodes[0]));
            list.assert_valid();
            list.push_back(ptr(&nodes[1]));
            list.push_front(ptr(&nodes[2]));
            list.assert_valid();
            let head = list.pop_front().unwrap();
            list.push_front(head);
            list.push_back(ptr(&nodes[3]));
        }
        list.assert_valid();
        assert_eq!(list.len(), 4);
        assert_eq!(drain(&mut list), [2, 0, 1, 3]);
    }
}
