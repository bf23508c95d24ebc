//! Publishing the transport's counters for other processes: the stats page
//! ([`stats_page`](super::stats_page)) attached, and rewritten from the
//! slow path.

use std::path::Path;
use std::time::Instant;

use super::endpoint::Transport;
use super::error::Result;
use super::stats_page::StatsPage;

impl Transport {
    /// Publishes this transport's per-peer state, outstanding operations and
    /// counters (drops by kind among them) in a page at `path`, rewritten
    /// every [`PUBLISH_INTERVAL`](super::PUBLISH_INTERVAL) at most while the
    /// transport is polled and removed when it is dropped; `ntb-tool qp`
    /// reads it ([`read_stats`](super::read_stats)). For the emulated
    /// fabric, [`stats_path`](super::stats_path) names the place beside it.
    pub fn publish_stats(&mut self, path: &Path) -> Result<()> {
        let page = StatsPage::create(path, self.me, self.peers.len(), self.dev.generation())?;
        self.stats_page = Some(page);
        self.publish_now(Instant::now());
        Ok(())
    }

    /// Rewrites the page if one is published and it is due (slow path).
    pub(crate) fn maybe_publish_stats(&mut self, now: Instant) {
        if self.stats_page.as_ref().is_some_and(|p| p.due(now)) {
            self.publish_now(now);
        }
    }

    fn publish_now(&mut self, now: Instant) {
        if let Some(page) = self.stats_page.as_mut() {
            page.write(now, self.me, &self.peers, self.ops.values());
        }
    }
}
