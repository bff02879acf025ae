//! The metric labels of the keys' bulkheads, bounded: at most `max`
//! distinct ones are ever handed out, and past that every key is labelled
//! `"other"`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::observer::Observer;

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

/// The metrics exporters the keys share: one per label, and one for the
/// keys without (as bounded as the labels are). Labelled
/// `bulkhead=<name>` and `key=<label>`, so a query needs no pattern on
/// the name.
pub(super) struct KeySeries {
    #[cfg(feature = "metrics")]
    name: String,
    #[cfg(feature = "metrics")]
    by_label: Mutex<std::collections::HashMap<Option<Arc<str>>, Series>>,
}

/// One label's exporter.
#[cfg(feature = "metrics")]
type Series = Arc<dyn Observer>;

impl KeySeries {
    pub(super) fn new(
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] name: &str,
    ) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            name: name.to_owned(),
            #[cfg(feature = "metrics")]
            by_label: Mutex::default(),
        }
    }

    /// The exporter of the keys labelled `label` (`None`: every key, with
    /// no `key_label`), made the first time; `None` without the `metrics`
    /// feature.
    pub(super) fn for_key(
        &self,
        #[cfg_attr(not(feature = "metrics"), allow(unused_variables))] label: Option<&Arc<str>>,
    ) -> Option<Arc<dyn Observer>> {
        #[cfg(feature = "metrics")]
        {
            use crate::bulkhead::export::MetricsExporter;
            let mut by_label = self.by_label.lock().unwrap_or_else(PoisonError::into_inner);
            let series = by_label
                .entry(label.cloned())
                .or_insert_with(|| MetricsExporter::for_keys(&self.name, label));
            Some(series.clone())
        }
        #[cfg(not(feature = "metrics"))]
        None
    }
}
