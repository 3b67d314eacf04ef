//! Races between daemons on one database, each through a store (a
//! connection) of its own: threads started together by a barrier, many
//! rounds, and the exact outcome asserted. On both engines (SQLite's
//! IMMEDIATE transactions serialise writers; PostgreSQL's read committed
//! does not, which is what these try).

use super::testdb::agent;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Barrier;

use super::testdb::TestDb;
use super::*;

const THREADS: usize = 4;
const ROUNDS: usize = 40;

fn seated(db: &TestDb, daemon: &str, lease_ms: i64) -> Store {
    let mut store = db.open();
    store.take_seat(Seat {
        daemon_id: daemon.into(),
        lease_ms,
    });
    store
}

/// The role the agents here have, with the policy hash their plans say.
pub(super) fn worker_runs() -> std::collections::BTreeMap<String, String> {
    [("worker".to_string(), "h".to_string())].into()
}

/// Runs `ROUNDS` rounds on one thread per store. Each round, once all
/// are done with the last, the first store's thread runs `setup` while
/// the others wait, then all run `each` at once. Returns each round's results, in the stores' order.
fn contend<T: Send>(
    stores: Vec<Store>,
    setup: impl Fn(usize, &mut Store) + Sync,
    each: impl Fn(usize, usize, &mut Store) -> T + Sync,
) -> Vec<Vec<T>> {
    let barrier = Barrier::new(stores.len());
    let (barrier, setup, each) = (&barrier, &setup, &each);
    let per_thread: Vec<Vec<std::thread::Result<T>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = stores
            .into_iter()
            .enumerate()
            .map(|(thread, mut store)| {
                scope.spawn(move || {
                    // A panic is kept for after the rounds: the other
                    // threads must not wait for this one at the barrier.
                    (0..ROUNDS)
                        .map(|round| {
                            // Every thread is done with the last round.
                            barrier.wait();
                            let set = catch_unwind(AssertUnwindSafe(|| {
                                if thread == 0 {
                                    setup(round, &mut store);
                                }
                            }));
                            barrier.wait();
                            set?;
                            catch_unwind(AssertUnwindSafe(|| each(round, thread, &mut store)))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut rounds: Vec<Vec<T>> = (0..ROUNDS).map(|_| Vec::new()).collect();
    for results in per_thread {
        for (round, result) in results.into_iter().enumerate() {
            match result {
                Ok(result) => rounds[round].push(result),
                Err(panic) => resume_unwind(panic),
            }
        }
    }
    rounds
}

fn message<'a>(to: &'a str, key: Option<String>) -> NewMessage<'a> {
    NewMessage {
        from: Sender {
            id: "id-sender",
            name: "sender",
        },
        to_id: to,
        text: "hello",
        sync: false,
        kind: MessageKind::Message,
        delivery: Delivery::Inbox,
        thread: None,
        dedupe_key: key,
    }
}

#[test]
fn a_dedupe_key_sent_at_once_by_daemons_is_one_message() {
    TestDb::each(
        "a_dedupe_key_sent_at_once_by_daemons_is_one_message",
        a_dedupe_key_sent_at_once_by_daemons_is_one_message_on,
    );
}

/// Every thread sends the round's key at once: each gets the one
/// message's id (none an error), and one message has the key.
fn a_dedupe_key_sent_at_once_by_daemons_is_one_message_on(db: &TestDb) {
    let stores: Vec<Store> = (0..THREADS).map(|_| db.open()).collect();
    let setup = |round: usize, store: &mut Store| {
        store
            .insert_agent(&agent(&format!("r{round}")), None)
            .unwrap();
    };
    let rounds = contend(stores, setup, |round, _, store| {
        let to = format!("id-r{round}");
        let key = format!("turn-{round}#1#00");
        // With and without a depth: the inbox's room is counted too.
        let depth = (round % 2 == 0).then_some(100);
        store
            .send(&[message(&to, Some(key))], depth)
            .map(|mut ids| ids.pop().flatten())
    });
    for (round, results) in rounds.iter().enumerate() {
        let ids: Vec<&String> = results
            .iter()
            .map(|r| match r {
                Ok(Some(id)) => id,
                other => panic!("round {round}: {other:?}"),
            })
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "round {round}: {ids:?}");
    }
    let keys = db.open().dedupe_keys().unwrap();
    assert_eq!(keys.len(), ROUNDS, "one message per key: {keys:?}");
}

#[test]
fn daemons_sending_at_once_never_overfill_an_inbox() {
    TestDb::each(
        "daemons_sending_at_once_never_overfill_an_inbox",
        daemons_sending_at_once_never_overfill_an_inbox_on,
    );
}

/// Each round a fresh recipient with room for 5; every thread sends 3 at
/// once (12 in all): exactly 5 are kept, 7 refused as full.
fn daemons_sending_at_once_never_overfill_an_inbox_on(db: &TestDb) {
    const DEPTH: u32 = 5;
    let stores: Vec<Store> = (0..THREADS).map(|_| db.open()).collect();
    let setup = |round: usize, store: &mut Store| {
        store
            .insert_agent(&agent(&format!("r{round}")), None)
            .unwrap();
    };
    let rounds = contend(stores, setup, |round, _, store| {
        let to = format!("id-r{round}");
        (0..3)
            .map(|_| {
                let kept = store.send(&[message(&to, None)], Some(DEPTH)).unwrap();
                usize::from(kept[0].is_some())
            })
            .sum::<usize>()
    });
    let store = db.open();
    for (round, kept) in rounds.iter().enumerate() {
        let queued = store.queued_count(&format!("id-r{round}")).unwrap();
        assert_eq!(
            (kept.iter().sum::<usize>(), queued),
            (DEPTH as usize, DEPTH),
            "round {round}: kept per thread {kept:?}"
        );
    }
}

#[test]
fn daemons_pinning_one_tool_at_once_agree_on_one_pin() {
    TestDb::each(
        "daemons_pinning_one_tool_at_once_agree_on_one_pin",
        daemons_pinning_one_tool_at_once_agree_on_one_pin_on,
    );
}

/// Even rounds: a tool never seen, each thread seeing its own definition:
/// one pins it (approved), the others find it changed (quarantined), and
/// the pin is the winner's. Odd rounds: a tool pinned at `h0`, half the
/// threads seeing `h0` and half `hX`: the quarantine is never lost.
fn daemons_pinning_one_tool_at_once_agree_on_one_pin_on(db: &TestDb) {
    let stores: Vec<Store> = (0..THREADS).map(|_| db.open()).collect();
    let setup = |round: usize, store: &mut Store| {
        if round % 2 == 1 {
            let tool = format!("t{round}");
            let pinned = store.check_pin("s", &tool, 0, "h0", "{}", None).unwrap();
            assert_eq!(pinned, PinState::Approved);
        }
    };
    let rounds = contend(stores, setup, |round, thread, store| {
        let tool = format!("t{round}");
        let hash = match round % 2 {
            0 => format!("h{thread}"),
            _ if thread % 2 == 0 => "h0".into(),
            _ => "hX".into(),
        };
        let state = store.check_pin("s", &tool, 0, &hash, "{}", None).unwrap();
        (hash, state)
    });
    let pins = db.open().pins().unwrap();
    assert_eq!(pins.len(), ROUNDS, "one pin per tool");
    for (round, results) in rounds.iter().enumerate() {
        let tool = format!("t{round}");
        let pin = pins.iter().find(|p| p.tool == tool).unwrap();
        let approved: Vec<&String> = results
            .iter()
            .filter(|(_, state)| *state == PinState::Approved)
            .map(|(hash, _)| hash)
            .collect();
        if round % 2 == 0 {
            assert_eq!(approved.len(), 1, "round {round}: {results:?}");
            assert_eq!(
                pin.approved_hash.as_ref(),
                Some(approved[0]),
                "round {round}"
            );
        } else {
            assert!(
                approved.iter().all(|hash| *hash == "h0"),
                "round {round}: {results:?}"
            );
            assert_eq!(pin.approved_hash.as_deref(), Some("h0"), "round {round}");
        }
        assert_eq!(
            pin.state,
            PinStatus::Quarantined,
            "round {round}: a definition changed: {results:?}"
        );
    }
}

#[test]
fn an_agent_is_adopted_or_removed_by_its_old_daemon_never_both() {
    TestDb::each(
        "an_agent_is_adopted_or_removed_by_its_old_daemon_never_both",
        an_agent_is_adopted_or_removed_by_its_old_daemon_never_both_on,
    );
}

/// A daemon whose heartbeat is old (cut off, yet still serving its
/// operator) removes or suspends its agent while two others adopt it: at
/// most one adopter takes it; a removal holds and nobody adopts it, or it
/// is refused (`Elsewhere`) and one did; a suspension holds (adopted
/// after, or not) or is refused because one adopted it first.
fn an_agent_is_adopted_or_removed_by_its_old_daemon_never_both_on(db: &TestDb) {
    let stores = vec![
        seated(db, "old", 30_000),
        seated(db, "new-1", 30_000),
        seated(db, "new-2", 30_000),
    ];
    for (store, name) in stores.iter().zip(["old", "new-1", "new-2"]) {
        store.register_daemon(&format!("{name}-host")).unwrap();
    }
    // The old daemon's last beat, long ago.
    stores[0]
        .db
        .execute("UPDATE daemons SET heartbeat_at = 0 WHERE id = 'old'", &[])
        .unwrap();
    let setup = |round: usize, store: &mut Store| {
        store
            .insert_agent(&agent(&format!("a{round}")), None)
            .unwrap();
    };
    let rounds = contend(stores, setup, |round, thread, store| {
        let id = format!("id-a{round}");
        match thread {
            // Refused only as adopted: never another error.
            0 if round % 2 == 0 => match store.remove_agent(&id) {
                Ok(removed) => removed,
                Err(StoreError::Elsewhere(to)) => !to.starts_with("new-"),
                Err(e) => panic!("{e}"),
            },
            0 => match store.set_agent_state(&id, StoredState::Suspended, None) {
                Ok(()) => true,
                Err(StoreError::Elsewhere(to)) => !to.starts_with("new-"),
                Err(e) => panic!("{e}"),
            },
            _ => {
                let adopted = store.adopt_agents(4, true).unwrap();
                adopted.iter().any(|a| a.id == id)
            }
        }
    });
    let store = db.open();
    let placed: std::collections::HashMap<String, Option<String>> = store
        .agent_daemons()
        .unwrap()
        .into_iter()
        .map(|row| (row.agent_id, row.daemon_id))
        .collect();
    for (round, done) in rounds.iter().enumerate() {
        let (changed, adopted) = (done[0], usize::from(done[1]) + usize::from(done[2]));
        let id = format!("id-a{round}");
        let status = store.agent_by_id(&id).unwrap().map(|_| {
            (
                store.agent_status(&id).unwrap().state,
                placed[&id].clone().unwrap(),
            )
        });
        let what = format!("round {round}: changed {changed}, adopted {adopted} times");
        assert!(adopted <= 1, "{what}");
        match (round % 2, changed) {
            // Removed, or adopted and the removal refused: never both.
            (0, true) => assert_eq!((status, adopted), (None, 0), "{what}"),
            // Suspended while still its own (adopted after, or not).
            (_, true) => {
                let (state, daemon) = status.unwrap();
                assert_eq!(state, AgentState::Suspended, "{what}");
                assert_eq!(daemon == "old", adopted == 0, "{what}: on {daemon}");
            }
            // Refused: adopted first.
            (_, false) => {
                let (state, daemon) = status.unwrap();
                assert_eq!((state, adopted), (AgentState::Idle, 1), "{what}");
                assert!(daemon.starts_with("new-"), "{what}: on {daemon}");
            }
        }
    }
}

#[test]
fn a_certificate_is_never_recorded_for_an_agent_removed_at_once() {
    TestDb::each(
        "a_certificate_is_never_recorded_for_an_agent_removed_at_once",
        a_certificate_is_never_recorded_for_an_agent_removed_at_once_on,
    );
}

/// Two `agent cert` and one `agent remove` at once: each issue is
/// recorded (before the removal, which revokes it) or refused as gone,
/// never an error; afterwards the agent holds no certificate (checked,
/// then recorded, a certificate would outlive its agent).
fn a_certificate_is_never_recorded_for_an_agent_removed_at_once_on(db: &TestDb) {
    let stores: Vec<Store> = (0..3).map(|_| seated(db, "d", 30_000)).collect();
    stores[0].register_daemon("d-host").unwrap();
    let setup = |round: usize, store: &mut Store| {
        store
            .insert_agent(&agent(&format!("c{round}")), None)
            .unwrap();
    };
    let rounds = contend(stores, setup, |round, thread, store| {
        let id = format!("id-c{round}");
        if thread == 2 {
            return store.remove_agent(&id).unwrap();
        }
        let fingerprint = format!("{round}-{thread}");
        store
            .insert_agent_cert(NewCert {
                agent_id: &id,
                fingerprint: &fingerprint,
                authority: "ca",
                replace: thread == 1,
            })
            .unwrap()
    });
    let store = db.open();
    let mut recorded = 0;
    for (round, done) in rounds.iter().enumerate() {
        let id = format!("id-c{round}");
        assert!(done[2], "round {round}: removed");
        assert_eq!(store.agent_cert_count(&id).unwrap(), 0, "round {round}");
        recorded += usize::from(done[0]) + usize::from(done[1]);
    }
    // Both outcomes happened (the race was run, not avoided).
    println!(
        "certificates recorded before the removal: {recorded} of {}",
        2 * ROUNDS
    );
}

/// A call of a role with no rate or step limit has nothing to count: it
/// must not cost a round trip to the database (under the store's lock,
/// which every call of the daemon's agents waits for) on every tool call.
/// 2,000 such calls took 1.0 s on a local PostgreSQL before; a remote one
/// costs its round trip each. PostgreSQL only (a daemon on SQLite counts
/// in memory).
#[test]
fn a_call_with_no_limits_costs_no_database_round_trip() {
    let Some(db) = TestDb::postgres("a_call_with_no_limits_costs_no_database_round_trip") else {
        return;
    };
    let store = db.open();
    let none = CallLimits::default();
    let rounds = 2_000;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        assert_eq!(
            store.count_call("id-a", &none).unwrap(),
            CallCount::Admitted
        );
    }
    let took = start.elapsed();
    assert!(
        took < std::time::Duration::from_millis(50),
        "{rounds} calls took {took:?}"
    );
}

#[test]
fn daemons_placing_at_once_never_overfill_a_daemon() {
    TestDb::each(
        "daemons_placing_at_once_never_overfill_a_daemon",
        daemons_placing_at_once_never_overfill_a_daemon_on,
    );
}

/// Each round a new daemon offers 2 slots and every thread (a daemon of
/// its own) places an agent on it at once: exactly 2 land there, the
/// others stay with their makers saying why. A daemon that stopped
/// beating gets none.
fn daemons_placing_at_once_never_overfill_a_daemon_on(db: &TestDb) {
    let stores: Vec<Store> = (0..THREADS)
        .map(|t| seated(db, &format!("maker{t}"), 30_000))
        .collect();
    // Registered through the first thread's store, seated as the target
    // for the while.
    let offer = |round: usize, store: &mut Store| {
        let maker = store.seat().clone();
        store.take_seat(Seat {
            daemon_id: format!("target{round}"),
            lease_ms: 30_000,
        });
        store.register_daemon(&format!("host:/t{round}")).unwrap();
        store
            .declare_offer(&Offer {
                max_agents: Some(2),
                ..Offer::default()
            })
            .unwrap();
        store.declare_runs(&worker_runs(), &[]).unwrap();
        store.take_seat(maker);
    };
    let rounds = contend(stores, offer, |round, thread, store| {
        let plan = crate::placement::Plan {
            daemon_id: format!("target{round}"),
            here: false,
            reason: "placed: test".into(),
            policy_hash: "h".into(),
        };
        let new = agent(&format!("r{round}t{thread}"));
        let start = AgentStart {
            created_by: None,
            persona: None,
            role_args: None,
            first: None,
            placement: Some(&plan),
        };
        store.insert_new_agent(&new, &start).unwrap()
    });
    let store = db.open();
    let why: std::collections::HashMap<String, Option<String>> = store
        .agent_daemons()
        .unwrap()
        .into_iter()
        .map(|row| (row.agent_id, row.why))
        .collect();
    for (round, went) in rounds.iter().enumerate() {
        let target = format!("target{round}");
        let placed = went.iter().filter(|d| **d == target).count();
        assert_eq!(placed, 2, "round {round}: {went:?}");
        for (thread, daemon) in went.iter().enumerate() {
            let reason = why[&format!("id-r{round}t{thread}")].clone();
            let expected = if *daemon == target {
                "placed: test".to_string()
            } else {
                assert_eq!(*daemon, format!("maker{thread}"), "round {round}");
                format!("here: daemon host:/t{round}, chosen, was full by then")
            };
            assert_eq!(reason.as_deref(), Some(expected.as_str()), "round {round}");
        }
    }
    // Silent for longer than the lease: nothing is placed on it.
    let mut maker = seated(db, "maker0", 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let plan = crate::placement::Plan {
        daemon_id: "target0".into(),
        here: false,
        reason: "placed: test".into(),
        policy_hash: "h".into(),
    };
    let start = AgentStart {
        created_by: None,
        persona: None,
        role_args: None,
        first: None,
        placement: Some(&plan),
    };
    let went = maker.insert_new_agent(&agent("late"), &start).unwrap();
    assert_eq!(went, "maker0");
    let row = store
        .agent_daemons()
        .unwrap()
        .into_iter()
        .find(|r| r.agent_id == "id-late");
    assert_eq!(
        row.and_then(|r| r.why).as_deref(),
        Some("here: daemon host:/t0, chosen, stopped answering")
    );
}

#[test]
fn placing_on_a_daemon_as_it_dies_loses_no_agent() {
    TestDb::each(
        "placing_on_a_daemon_as_it_dies_loses_no_agent",
        placing_on_a_daemon_as_it_dies_loses_no_agent_on,
    );
}

/// Each round a daemon beats once with a 20 ms lease; three daemons place
/// on it around the moment its lease runs out while a fourth adopts the
/// agents of silent daemons. Every placement commits (no deadlock, no
/// error), and after one more adoption no agent is left on the dead
/// daemon: each is on exactly one live one.
fn placing_on_a_daemon_as_it_dies_loses_no_agent_on(db: &TestDb) {
    // The makers run the agents' role too: an agent left on one (the
    // placement failed) is adopted with the policy its row declares.
    let mut stores: Vec<Store> = (0..THREADS - 1)
        .map(|t| {
            let store = seated(db, &format!("maker{t}"), 20);
            store.register_daemon(&format!("host:/maker{t}")).unwrap();
            store.declare_runs(&worker_runs(), &[]).unwrap();
            store
        })
        .collect();
    stores.push(seated(db, "adopter", 20));
    let offer = |round: usize, store: &mut Store| {
        let me = store.seat().clone();
        store.take_seat(Seat {
            daemon_id: format!("dying{round}"),
            lease_ms: 20,
        });
        store.register_daemon(&format!("host:/d{round}")).unwrap();
        store
            .declare_offer(&Offer {
                max_agents: Some(8),
                ..Offer::default()
            })
            .unwrap();
        store.declare_runs(&worker_runs(), &[]).unwrap();
        store.take_seat(me);
    };
    contend(stores, offer, |round, thread, store| {
        std::thread::sleep(std::time::Duration::from_millis(15 + 3 * thread as u64));
        if thread == THREADS - 1 {
            store.heartbeat(&[]).unwrap();
            store.adopt_agents(16, true).unwrap();
            return;
        }
        let plan = crate::placement::Plan {
            daemon_id: format!("dying{round}"),
            here: false,
            reason: "placed: test".into(),
            policy_hash: "h".into(),
        };
        let start = AgentStart {
            created_by: None,
            persona: None,
            role_args: None,
            first: None,
            placement: Some(&plan),
        };
        store
            .insert_new_agent(&agent(&format!("r{round}t{thread}")), &start)
            .unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut adopter = seated(db, "adopter", 20);
    // It runs the agents' role (adoption checks it, as placement does).
    adopter.register_daemon("host:/adopter").unwrap();
    adopter.declare_runs(&worker_runs(), &[]).unwrap();
    adopter.heartbeat(&[]).unwrap();
    adopter.adopt_agents(usize::MAX, true).unwrap();
    let rows = adopter.agent_daemons().unwrap();
    assert_eq!(rows.len(), ROUNDS * (THREADS - 1));
    for row in rows {
        assert_eq!(row.daemon_id.as_deref(), Some("adopter"), "{row:?}");
    }
}
