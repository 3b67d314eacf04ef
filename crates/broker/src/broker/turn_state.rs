//! Turns in flight: claimed, started, ended, stopped.

use super::*;

impl Broker {
    pub(super) fn running(&self) -> MutexGuard<'_, HashMap<String, RunningTurn>> {
        self.running.lock_anyway()
    }

    /// Takes queued turns to run (see `Store::claim_turns`) and registers
    /// each as running, so tool calls and stops find it.
    pub fn claim_turns(&self, limit: usize) -> Result<Vec<ClaimedTurn>, BrokerError> {
        // The store stays locked until the turns are registered: a kill,
        // suspend or removal (which take the store first) sees them.
        // Lock order everywhere: store, then running.
        let turns = {
            let mut store = self.store();
            let turns = store.claim_turns(limit)?;
            let mut running = self.running();
            for t in &turns {
                running.insert(
                    t.agent.id.clone(),
                    RunningTurn {
                        turn_id: t.id.clone(),
                        ..RunningTurn::default()
                    },
                );
            }
            turns
        };
        // An agent another daemon placed here has its socket bound before
        // its first turn launches (the turn binds it into the sandbox).
        let agents: Vec<Agent> = turns.iter().map(|t| t.agent.clone()).collect();
        self.serve_placed(&agents);
        Ok(turns)
    }

    /// Records the launcher's pid; returns a stop asked for before it started.
    pub fn turn_started(&self, agent_id: &str, pid: u32) -> Option<StopReason> {
        let mut running = self.running();
        let turn = running.get_mut(agent_id)?;
        turn.pid = Some(pid);
        turn.stop.clone()
    }

    /// The running turn's CLI wrote its first line.
    pub fn turn_output(&self, agent_id: &str) {
        if let Some(turn) = self.running().get_mut(agent_id) {
            turn.first_output.get_or_insert_with(Instant::now);
        }
    }

    /// Ends the running turn's registration: what the broker saw during it.
    pub fn turn_ended(&self, agent_id: &str) -> Option<RunningTurn> {
        self.running().remove(agent_id)
    }

    pub fn finish_turn(&self, finish: &TurnFinish<'_>) -> Result<(), BrokerError> {
        if !self.store().finish_turn(finish)? {
            tracing::warn!(
                turn = %finish.turn_id,
                "the turn's outcome is dropped: its lease ran out and another daemon failed it"
            );
        }
        self.wake.notify_one();
        Ok(())
    }

    pub fn set_turn_prompt(&self, turn_id: &str, prompt: &str) -> Result<(), BrokerError> {
        Ok(self.store().set_turn_prompt(turn_id, prompt)?)
    }

    /// The session a running turn's CLI reported (a re-run resumes it).
    pub fn set_agent_session(&self, agent_id: &str, session: &str) -> Result<(), BrokerError> {
        Ok(self.store().set_agent_session(agent_id, session)?)
    }

    /// What earlier runs of the turn did that took effect.
    pub fn effects_of_turn(
        &self,
        turn_id: &str,
    ) -> Result<Vec<crate::store::TurnEffect>, BrokerError> {
        Ok(self.store().effects_of_turn(turn_id)?)
    }

    pub fn requeue_turn(&self, turn_id: &str) -> Result<(), BrokerError> {
        Ok(self.store().requeue_turn(turn_id)?)
    }

    /// After a restart: turns that were running are queued again.
    pub fn recover_running(&self) -> Result<usize, BrokerError> {
        Ok(self.store().recover_running()?)
    }

    /// Asks the agent's running turn to stop: SIGTERM to its launcher,
    /// which ends the whole sandbox. Returns whether a turn was running.
    pub(super) fn stop_turn(&self, agent_id: &str, reason: StopReason) -> bool {
        let mut running = self.running();
        let Some(turn) = running.get_mut(agent_id) else {
            return false;
        };
        // The first reason stands (a suspend stays a suspend).
        turn.stop.get_or_insert(reason);
        if let Some(pid) = turn.pid.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        true
    }

    /// The daemon stops: every running turn is asked to stop, to go back
    /// to the queue when it ends (`StopReason::Shutdown`). Returns their
    /// ids.
    pub fn stop_turns_for_shutdown(&self) -> Vec<String> {
        let turns: Vec<(String, String)> = self
            .running()
            .iter()
            .map(|(agent, turn)| (agent.clone(), turn.turn_id.clone()))
            .collect();
        for (agent, _) in &turns {
            self.stop_turn(agent, StopReason::Shutdown);
        }
        turns.into_iter().map(|(_, turn)| turn).collect()
    }

    /// Asks every running turn to stop (see `stop_turn`); how many ran.
    pub(super) fn stop_all_turns(&self, reason: StopReason) -> usize {
        let agents: Vec<String> = self.running().keys().cloned().collect();
        let stopped = agents
            .iter()
            .filter(|agent| self.stop_turn(agent, reason.clone()))
            .count();
        if stopped > 0 {
            tracing::error!(
                turns = stopped,
                ?reason,
                "this daemon stops its running turns"
            );
        }
        stopped
    }
}
