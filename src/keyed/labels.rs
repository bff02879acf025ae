//! The metric labels of the keys' bulkheads, bounded: at most `max`
//! distinct ones are ever handed out, and past that every key is labelled
//! `"other"`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The metric labels handed out: at most `max`, ever; past that, `"other"`.
pub(super) struct Labels {
    pub(super) max: usize,
    issued: Mutex<HashSet<Arc<str>>>,
    other: Arc<str>,
}

impl Labels {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            issued: Mutex::new(HashSet::new()),
            other: Arc::from("other"),
        }
    }

    pub(super) fn assign(&self, label: String) -> Arc<str> {
        if *label == *self.other {
            return self.other.clone();
        }
        let mut issued = self.issued.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(label) = issued.get(label.as_str()) {
            return label.clone();
        }
        if issued.len() >= self.max {
            return self.other.clone();
        }
        let label: Arc<str> = Arc::from(label);
        issued.insert(label.clone());
        label
    }

    pub(super) fn in_use(&self) -> usize {
        self.issued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}
