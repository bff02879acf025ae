//! The names of a semaphore's keys, and the calls that pass them to its
//! scripts.

/// The names of the semaphore's keys (see `scripts.rs`).
pub(super) struct Keys {
    pub(super) leases: String,
    pub(super) info: String,
    pub(super) fence: String,
    pub(super) limit: String,
    pub(super) channel: String,
    pub(super) quarantine: String,
    pub(super) epoch: String,
    pub(super) queue: String,
    pub(super) queue_beat: String,
    pub(super) queue_info: String,
    pub(super) queue_seq: String,
}

impl Keys {
    /// A call of `script` with the keys every script takes, `KEYS[1]` to
    /// `KEYS[5]` in the order `scripts.rs` gives (the quarantine script
    /// adds the quarantine key; the scripts that change leases take
    /// [`call_all`](Self::call_all)).
    pub(super) fn call<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(&self.leases)
            .key(&self.info)
            .key(&self.fence)
            .key(&self.limit)
            .key(&self.channel);
        call
    }

    /// A call of `script` with all ten keys (`KEYS[6]` the quarantine,
    /// `KEYS[7]` to `KEYS[10]` the fair line): for the scripts that change
    /// leases, since each of them serves the line.
    pub(super) fn call_all<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut call = self.call(script);
        call.key(&self.quarantine)
            .key(&self.queue)
            .key(&self.queue_beat)
            .key(&self.queue_info)
            .key(&self.queue_seq);
        call
    }

    /// The ten keys of [`call_all`](Self::call_all), in order, and the
    /// epoch marker: the acquire script's eleven keys are all of them, the
    /// release script's the first ten (see [`Call`](super::scripts::Call)).
    pub(super) fn all(&self) -> [&str; 11] {
        [
            &self.leases,
            &self.info,
            &self.fence,
            &self.limit,
            &self.channel,
            &self.quarantine,
            &self.queue,
            &self.queue_beat,
            &self.queue_info,
            &self.queue_seq,
            &self.epoch,
        ]
    }
}
