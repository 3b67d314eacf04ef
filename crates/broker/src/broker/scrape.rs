//! The team as a scrape of `GET /metrics` sees it: the gauges' values,
//! read when asked (`Metrics::encode` sets them).

use super::*;
use crate::metrics::TeamState;

impl Broker {
    /// The metrics' exposition text, the team read now. A store that
    /// cannot be read leaves the team's gauges at zero: the counters
    /// still answer.
    pub fn metrics_text(&self) -> String {
        let mut team = TeamState::default();
        let agents = self.agents().unwrap_or_default();
        let mut states: BTreeMap<String, i64> = BTreeMap::new();
        for agent in &agents {
            let Ok(status) = self.status(agent) else {
                continue;
            };
            *states.entry(status.state.as_str().to_string()).or_default() += 1;
            team.queued_turns += i64::from(status.queued_turns);
            if let Ok(usage) = self.store().model_usage(&agent.id) {
                team.model_requests_today +=
                    i64::try_from(usage.requests_today).unwrap_or(i64::MAX);
                team.model_tokens_today += i64::try_from(usage.tokens_today).unwrap_or(i64::MAX);
            }
        }
        team.agents = states.into_iter().collect();
        team.running_turns = i64::try_from(self.running().len()).unwrap_or(i64::MAX);
        team.upstreams = self
            .upstreams()
            .report()
            .iter()
            .map(|s| {
                (
                    s["server"].as_str().unwrap_or("").to_string(),
                    s["status"]["status"] == "up",
                    s["restarts"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        self.metrics.encode(&team)
    }
}
