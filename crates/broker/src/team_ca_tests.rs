//! The team authority on both engines: made once under contention, opened
//! only with the team key, rotated with an overlap, retired for good.

use crate::store::testdb::agent;
use std::sync::Barrier;

use super::*;
use crate::store::NewCert;
use crate::store::testdb::TestDb;

fn team_key(dir: &Path, name: &str) -> TeamKey {
    let path = dir.join(name);
    TeamKey::create(&path).unwrap();
    TeamKey::load(&path).unwrap()
}

fn state_dir(db: &TestDb, name: &str) -> std::path::PathBuf {
    let dir = db.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn daemons_starting_at_once_make_one_team_authority() {
    TestDb::each(
        "daemons_starting_at_once_make_one_team_authority",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let key = team_key(key_dir.path(), "team.key");
            const DAEMONS: usize = 4;
            let barrier = Barrier::new(DAEMONS);
            let issuing: Vec<String> = std::thread::scope(|scope| {
                let threads: Vec<_> = (0..DAEMONS)
                    .map(|i| {
                        let (store, dir) = (db.open(), state_dir(db, &format!("d{i}")));
                        let (barrier, key) = (&barrier, &key);
                        scope.spawn(move || {
                            barrier.wait();
                            load_or_create(&store, key, &dir)
                                .unwrap()
                                .issuing_fingerprint()
                                .to_string()
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let rows = db.open().team_authorities().unwrap();
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert!(
                issuing.iter().all(|f| *f == rows[0].fingerprint),
                "{issuing:?}"
            );
        },
    );
}

#[test]
fn a_dump_of_the_database_holds_no_usable_key() {
    TestDb::each(
        "a_dump_of_the_database_holds_no_usable_key",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let (ours, theirs) = (
                team_key(key_dir.path(), "ours"),
                team_key(key_dir.path(), "theirs"),
            );
            let store = db.open();
            let authority = load_or_create(&store, &ours, &state_dir(db, "a")).unwrap();
            let rows = store.team_authorities().unwrap();
            // The dump: the certificate in the clear, no private key.
            assert!(rows[0].cert.contains("BEGIN CERTIFICATE"));
            assert!(!rows[0].sealed_key.contains("PRIVATE KEY"));
            assert_eq!(rows[0].fingerprint, authority.issuing_fingerprint());
            // Another team's daemon on this database, with an authority of
            // its own: refused, and nothing of its added.
            let b = state_dir(db, "b");
            crate::tls::Authority::open_or_create(&b).unwrap();
            let refused = load_or_create(&store, &theirs, &b).unwrap_err();
            assert!(
                refused.to_string().contains("another team's key"),
                "{refused}"
            );
            assert!(rotate(&store, &theirs).is_err());
            assert_eq!(store.team_authorities().unwrap(), rows);
        },
    );
}

#[test]
fn an_authority_written_without_the_team_key_is_not_trusted() {
    TestDb::each(
        "an_authority_written_without_the_team_key_is_not_trusted",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let (ours, theirs) = (
                team_key(key_dir.path(), "ours"),
                team_key(key_dir.path(), "theirs"),
            );
            let store = db.open();
            let dir = state_dir(db, "a");
            load_or_create(&store, &ours, &dir).unwrap();
            // An attacker with write access to the database adds their CA.
            let planted = Ca::generate().unwrap();
            let sealed_key = sealed(&theirs, &planted, AuthorityState::Trusted).unwrap();
            let added = store
                .add_trusted_authority(NewAuthority {
                    fingerprint: planted.fingerprint(),
                    cert: planted.cert_pem(),
                    sealed_key: &sealed_key,
                })
                .unwrap();
            assert!(added);
            let authority = load_or_create(&store, &ours, &dir).unwrap();
            assert_eq!(authority.fingerprints().len(), 1);
            assert!(!authority.bundle().contains(planted.cert_pem().trim()));
        },
    );
}

#[test]
fn rotation_overlaps_then_retirement_revokes_the_old_certificates() {
    TestDb::each(
        "rotation_overlaps_then_retirement_revokes_the_old_certificates",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let key = team_key(key_dir.path(), "team.key");
            let mut store = db.open();
            let dir = state_dir(db, "a");
            store.insert_agent(&agent("a1"), None).unwrap();
            let first = load_or_create(&store, &key, &dir).unwrap();
            let old = first.issue_agent("id-a1").unwrap();
            record(&mut store, &old, first.issuing_fingerprint());
            assert_eq!(rotate(&store, &key).unwrap(), 2);
            // A rotation from a stale view is refused, not stacked.
            let stale = store.rotate_team_authority(
                1,
                "x",
                NewAuthority {
                    fingerprint: "x",
                    cert: "x",
                    sealed_key: "x",
                },
            );
            assert!(matches!(stale, Err(crate::store::RotateError::Changed)));
            let both = load_or_create(&store, &key, &dir).unwrap();
            assert_eq!(both.fingerprints().len(), 2);
            assert_ne!(both.issuing_fingerprint(), first.issuing_fingerprint());
            let new = both.issue_agent("id-a1").unwrap();
            record(&mut store, &new, both.issuing_fingerprint());
            // The overlap: both certificates speak for the agent; the new
            // one's bundle holds both authorities.
            assert_eq!(new.ca.matches("BEGIN CERTIFICATE").count(), 2);
            for cert in [&old, &new] {
                assert_eq!(
                    store.agent_of_cert(&cert.fingerprint).unwrap().as_deref(),
                    Some("id-a1")
                );
            }
            assert_eq!(crate::team_ca::retire(&store, &key, &dir).unwrap(), (1, 1));
            assert_eq!(store.agent_of_cert(&old.fingerprint).unwrap(), None);
            assert_eq!(
                store.agent_of_cert(&new.fingerprint).unwrap().as_deref(),
                Some("id-a1")
            );
            let after = load_or_create(&store, &key, &dir).unwrap();
            assert_eq!(
                after.fingerprints(),
                vec![both.issuing_fingerprint().to_string()]
            );
            // Retired stays retired: nothing to retire again.
            assert_eq!(crate::team_ca::retire(&store, &key, &dir).unwrap(), (0, 0));
        },
    );
}

/// The log lines written while `work` runs on this thread.
fn logged(work: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, work);
    let bytes = sink.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// A database writer marks the team's current authority retired (and
/// would have every daemon that restarts note it retired for good): no
/// daemon notes it, the log names it, and once the row is put back the
/// authority serves again. A retirement by the team is noted.
#[test]
fn a_forged_retirement_is_not_noted_and_is_named_in_the_log() {
    TestDb::each(
        "a_forged_retirement_is_not_noted_and_is_named_in_the_log",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let key = team_key(key_dir.path(), "team.key");
            let store = db.open();
            let dir = state_dir(db, "a");
            let current = load_or_create(&store, &key, &dir)
                .unwrap()
                .issuing_fingerprint()
                .to_string();
            // The attack, as the database's writer can make it.
            let flipped = store
                .write_as_attacker(
                    "UPDATE team_authorities SET state = 'retired' WHERE state = 'current'",
                )
                .unwrap();
            assert_eq!(flipped, 1);
            let log = logged(|| {
                let _ = load_or_create(&store, &key, &dir);
            });
            assert!(
                log.contains("not retired with the team key")
                    && log.contains(&format!("fingerprint={current}")),
                "{log}"
            );
            assert!(
                !local::retired(&dir).unwrap().contains(&current),
                "a forged retirement is not noted"
            );
            // Put back, it serves again (a noted retirement would refuse
            // it for good: "retired by this team before").
            store
                .write_as_attacker(&format!(
                    "DELETE FROM team_authorities WHERE fingerprint <> '{current}'"
                ))
                .unwrap();
            store
                .write_as_attacker(&format!(
                    "UPDATE team_authorities SET state = 'current' WHERE fingerprint = '{current}'"
                ))
                .unwrap();
            let back = load_or_create(&store, &key, &dir).unwrap();
            assert_eq!(back.issuing_fingerprint(), current);
            // A retirement by the team is sealed, and noted.
            rotate(&store, &key).unwrap();
            assert_eq!(retire(&store, &key, &dir).unwrap().0, 1);
            let other = state_dir(db, "b");
            let log = logged(|| {
                load_or_create(&store, &key, &other).unwrap();
            });
            assert!(!log.contains("not retired with the team key"), "{log}");
            assert!(local::retired(&other).unwrap().contains(&current));
        },
    );
}

#[test]
fn rotations_at_once_make_one_new_authority() {
    TestDb::each("rotations_at_once_make_one_new_authority", |db: &TestDb| {
        let key_dir = tempfile::tempdir().unwrap();
        let key = team_key(key_dir.path(), "team.key");
        load_or_create(&db.open(), &key, &state_dir(db, "a")).unwrap();
        const DAEMONS: usize = 4;
        let barrier = Barrier::new(DAEMONS);
        let results: Vec<Result<i64, String>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..DAEMONS)
                .map(|_| {
                    let store = db.open();
                    let (barrier, key) = (&barrier, &key);
                    scope.spawn(move || {
                        barrier.wait();
                        rotate(&store, key).map_err(|e| e.to_string())
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // Each rotation from the generation it saw: one made from each,
        // the others refused (a later one may start from the new one).
        let mut made: Vec<i64> = results.iter().filter_map(|r| r.clone().ok()).collect();
        made.sort_unstable();
        let expected: Vec<i64> = (2..).take(made.len()).collect();
        assert!(!made.is_empty() && made == expected, "{results:?}");
        assert!(
            results.iter().filter(|r| r.is_err()).all(|r| {
                r.as_ref()
                    .is_err_and(|e| e.contains("changed meanwhile") || e.contains("unique"))
            }),
            "{results:?}"
        );
        let rows = db.open().team_authorities().unwrap();
        let current = rows
            .iter()
            .filter(|r| r.state == AuthorityState::Current)
            .count();
        assert_eq!((rows.len(), current), (1 + made.len(), 1), "{rows:?}");
    });
}

#[test]
fn a_daemons_own_authority_is_adopted_then_trusted_beside_the_teams() {
    TestDb::each(
        "a_daemons_own_authority_is_adopted_then_trusted_beside_the_teams",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let key = team_key(key_dir.path(), "team.key");
            let store = db.open();
            let (a, b) = (state_dir(db, "a"), state_dir(db, "b"));
            let own_a = crate::tls::Authority::open_or_create(&a).unwrap();
            let own_b = crate::tls::Authority::open_or_create(&b).unwrap();
            // The first daemon's own becomes the team's first.
            let team_a = load_or_create(&store, &key, &a).unwrap();
            assert_eq!(team_a.issuing_fingerprint(), own_a.issuing_fingerprint());
            // The second's is trusted beside it, not issuing.
            let team_b = load_or_create(&store, &key, &b).unwrap();
            assert_eq!(team_b.issuing_fingerprint(), own_a.issuing_fingerprint());
            assert!(
                team_b
                    .fingerprints()
                    .contains(&own_b.issuing_fingerprint().to_string())
            );
            // Retired, it is not offered again at the next start.
            crate::team_ca::retire(&store, &key, &a).unwrap();
            let again = load_or_create(&store, &key, &b).unwrap();
            assert_eq!(
                again.fingerprints(),
                vec![own_a.issuing_fingerprint().to_string()]
            );
        },
    );
}

fn record(store: &mut Store, cert: &crate::tls::AgentCredentials, authority: &str) {
    let made = store
        .insert_agent_cert(NewCert {
            agent_id: "id-a1",
            fingerprint: &cert.fingerprint,
            authority,
            replace: false,
        })
        .unwrap();
    assert!(made);
}

/// A database writer plants trusted rows whose fingerprint is the current
/// one's plus a space, and a line before it (issue 42/43, svcfin a): a
/// routine `team ca retire` seals no retirement for them (they do not
/// open), names them in the log, and every daemon keeps the current
/// authority.
#[test]
fn a_planted_fingerprint_gets_no_retirement_of_the_current_authority() {
    TestDb::each(
        "a_planted_fingerprint_gets_no_retirement_of_the_current_authority",
        |db: &TestDb| {
            let key_dir = tempfile::tempdir().unwrap();
            let key = team_key(key_dir.path(), "team.key");
            let store = db.open();
            let a = state_dir(db, "a");
            let b = state_dir(db, "b");
            let current = load_or_create(&store, &key, &a)
                .unwrap()
                .issuing_fingerprint()
                .to_string();
            load_or_create(&store, &key, &b).unwrap();
            // The attack, as the database's writer can make it.
            for (generation, planted) in
                [(98, format!("{current} ")), (99, format!("x\n{current}"))]
            {
                let sql = format!(
                    "INSERT INTO team_authorities (generation, fingerprint, cert, sealed_key, state, created_at)
                     VALUES ({generation}, '{planted}', 'x', 'x', 'trusted', 0)"
                );
                assert_eq!(store.write_as_attacker(&sql).unwrap(), 1);
            }
            let log = logged(|| {
                assert_eq!(retire(&store, &key, &a).unwrap(), (0, 0));
            });
            assert!(
                log.contains("does not open with the team key: not retired"),
                "{log}"
            );
            assert!(local::retired(&a).unwrap().is_empty());
            let trusted = store
                .team_authorities()
                .unwrap()
                .into_iter()
                .filter(|r| r.state == AuthorityState::Trusted)
                .count();
            assert_eq!(trusted, 2, "the planted rows are left as they are");
            for dir in [&a, &b] {
                let again = load_or_create(&store, &key, dir).unwrap();
                assert_eq!(again.issuing_fingerprint(), current);
            }
        },
    );
}

/// STATE_DIR/tls/retired counts only lines that are exactly a
/// fingerprint (no trimming), and nothing else is ever noted.
#[test]
fn only_exact_fingerprints_are_noted_retired() {
    let dir = tempfile::tempdir().unwrap();
    let f = crate::tls::fingerprint(b"an authority");
    let upper = f.to_uppercase();
    std::fs::create_dir_all(dir.path().join("tls")).unwrap();
    let lines = format!("{f} \n {f}\n{upper}\n{f}\r\n\n");
    std::fs::write(dir.path().join("tls/retired"), lines).unwrap();
    assert!(local::retired(dir.path()).unwrap().is_empty());
    for bad in [
        format!("{f} "),
        format!("x\n{f}"),
        upper,
        f[1..].to_string(),
    ] {
        assert!(matches!(
            local::add_retired(dir.path(), &[bad]),
            Err(TeamCaError::NotAFingerprint(_))
        ));
    }
    local::add_retired(dir.path(), std::slice::from_ref(&f)).unwrap();
    assert_eq!(local::retired(dir.path()).unwrap().len(), 1);
    assert!(local::retired(dir.path()).unwrap().contains(&f));
}
