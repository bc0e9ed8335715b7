//! `[ingress]`: how sends are spread over the ingress streams.

use super::table::{section, BOTH};
use super::Problems;

section! {
    /// `[ingress]`: the ingress streams between gateways and workers.
    pub struct IngressConfig in "ingress", read by BOTH;
    {
        /// Number of ingress streams; every process of a cluster must agree on it.
        ///
        /// A conversation always maps to the same stream.
        pub shards: u32 = "8",
    }
}

impl IngressConfig {
    pub(super) fn validate(&self, bad: &mut Problems) {
        if self.shards == 0 || self.shards > 1024 {
            bad.push("ingress.shards", "must be 1..=1024");
        }
    }
}
