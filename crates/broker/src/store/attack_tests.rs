//! Attacker's reproducers for the team authority (branch teamca). Each
//! asserts what SHOULD hold; each FAILS on 460c8a6.

use super::db::args;
use super::testdb::TestDb;
use super::testdb::agent;
use super::*;
use crate::team_ca::{load_or_create, rotate};
use crate::team_key::TeamKey;

fn key(dir: &std::path::Path) -> TeamKey {
    let path = dir.join("team.key");
    TeamKey::create(&path).unwrap();
    TeamKey::load(&path).unwrap()
}

fn record(store: &mut Store, agent_id: &str, fp: &str, authority: &str, replace: bool) -> bool {
    store
        .insert_agent_cert(NewCert {
            agent_id,
            fingerprint: fp,
            authority,
            replace,
        })
        .unwrap()
}

/// A database-only attacker rolls a retirement back (one UPDATE, one
/// INSERT, both from a dump taken before `retire`): the retired
/// authority is trusted again by every daemon and its certificate speaks
/// for the agent again.
#[test]
fn atk_a_rolled_back_retirement_is_not_trusted_again() {
    TestDb::each("atk_rollback_retire", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = db.open();
        store.insert_agent(&agent("a1"), None).unwrap();
        let first = load_or_create(&store, &k, &dir).unwrap();
        let old = first.issue_agent("id-a1").unwrap();
        assert!(record(
            &mut store,
            "id-a1",
            &old.fingerprint,
            first.issuing_fingerprint(),
            false
        ));
        rotate(&store, &k).unwrap();
        assert_eq!(crate::team_ca::retire(&store, &k, &dir).unwrap(), (1, 1));
        // The attacker: the row's state and the certificate's row back.
        store
            .db
            .execute("UPDATE team_authorities SET state = 'trusted', retired_at = NULL WHERE state = 'retired'", args![])
            .unwrap();
        store
            .db
            .execute(
                "INSERT INTO agent_certs (fingerprint, agent_id, issued_at, authority) VALUES (?1, 'id-a1', 0, ?2)",
                args![old.fingerprint.as_str(), first.issuing_fingerprint()],
            )
            .unwrap();
        let after = load_or_create(&store, &k, &dir).unwrap();
        assert_eq!(
            after.fingerprints().len(),
            1,
            "the retired authority is trusted again: {:?}",
            after.fingerprints()
        );
    });
}

/// A database-only attacker holding any one relay's certificate (agent
/// a1's) rebinds it to agent a2: the row says a2, but the certificate
/// names a1 (its URI SAN), and the listener requires both to agree
/// (tls_listen.rs; the real relay in crates/cli/tests/broker/tls.rs).
#[test]
fn atk_a_certificate_speaks_only_for_the_agent_it_names() {
    TestDb::each("atk_rebind", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = db.open();
        store.insert_agent(&agent("a1"), None).unwrap();
        store.insert_agent(&agent("a2"), None).unwrap();
        let ca = load_or_create(&store, &k, &dir).unwrap();
        let a1 = ca.issue_agent("id-a1").unwrap();
        assert!(record(
            &mut store,
            "id-a1",
            &a1.fingerprint,
            ca.issuing_fingerprint(),
            false
        ));
        store
            .db
            .execute(
                "UPDATE agent_certs SET agent_id = 'id-a2' WHERE fingerprint = ?1",
                args![a1.fingerprint.as_str()],
            )
            .unwrap();
        let recorded = store.agent_of_cert(&a1.fingerprint).unwrap();
        assert_eq!(recorded.as_deref(), Some("id-a2"), "the attack was made");
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(a1.cert.as_bytes()).unwrap();
        let named = crate::tls::agent_named(der.as_ref());
        assert_eq!(named.as_deref(), Some("id-a1"));
        assert_ne!(named, recorded, "a1's certificate speaks for a2");
    });
}

/// Certificates recorded before migration 8 have `authority` NULL: the
/// daemon's own authority is adopted as the team's first, rotated, then
/// retired, yet its certificates are not revoked (the DELETE matches
/// `authority IN (...)`), so an open connection with one is never closed
/// by gate.rs's per-line check, and `retire` reports 0 revoked.
#[test]
fn atk_retire_revokes_certificates_recorded_before_the_migration() {
    TestDb::each("atk_legacy_null", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let store = db.open();
        store.insert_agent(&agent("a1"), None).unwrap();
        // Before the upgrade: the daemon's own authority issued a1's cert.
        let own = crate::tls::Authority::open_or_create(&dir).unwrap();
        let legacy = own.issue_agent("id-a1").unwrap();
        store
            .db
            .execute(
                "INSERT INTO agent_certs (fingerprint, agent_id, issued_at) VALUES (?1, 'id-a1', 0)",
                args![legacy.fingerprint.as_str()],
            )
            .unwrap();
        // Upgraded with --team-key: own adopted as generation 1.
        let team = load_or_create(&store, &k, &dir).unwrap();
        assert_eq!(team.issuing_fingerprint(), own.issuing_fingerprint());
        rotate(&store, &k).unwrap();
        let (retired, revoked) = crate::team_ca::retire(&store, &k, &dir).unwrap();
        assert_eq!(retired, 1);
        assert_eq!(
            (revoked, store.agent_of_cert(&legacy.fingerprint).unwrap()),
            (1, None),
            "the retired authority's certificate still speaks for a1"
        );
    });
}

/// Issuance on daemon 1 racing rotate+retire on daemon 2: daemon 1 loaded
/// the authority (operator.rs:422), signs, and records after daemon 2's
/// retire committed. The record is made (no check of the authority's
/// state in insert_agent_cert), and with `--replace` the agent's good
/// certificate from the current authority is deleted: the operator is
/// handed a certificate no daemon accepts and the working one is gone.
#[test]
fn atk_a_certificate_of_an_authority_retired_meanwhile_is_not_recorded() {
    TestDb::each("atk_issue_vs_retire", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = db.open();
        store.insert_agent(&agent("a1"), None).unwrap();
        // Daemon 1 starts issuing from generation 1.
        let stale = load_or_create(&store, &k, &dir).unwrap();
        let pending = stale.issue_agent("id-a1").unwrap();
        // Meanwhile daemon 2: rotate, a new cert for a1, retire.
        rotate(&store, &k).unwrap();
        let fresh = load_or_create(&store, &k, &dir).unwrap();
        let good = fresh.issue_agent("id-a1").unwrap();
        assert!(record(
            &mut store,
            "id-a1",
            &good.fingerprint,
            fresh.issuing_fingerprint(),
            false
        ));
        crate::team_ca::retire(&store, &k, &dir).unwrap();
        // Daemon 1 records its certificate, replacing.
        let made = record(
            &mut store,
            "id-a1",
            &pending.fingerprint,
            stale.issuing_fingerprint(),
            true,
        );
        assert!(
            !made && store.agent_of_cert(&good.fingerprint).unwrap().is_some(),
            "a certificate of a retired authority recorded (made={made}), the good one revoked"
        );
    });
}

/// A database-only attacker with no dump at all: `DELETE FROM
/// team_authorities`. The next `authority()` on the daemon whose own
/// `STATE_DIR/tls/ca.key` was adopted (and later retired) offers that
/// plaintext file authority again as the team's FIRST and CURRENT one:
/// the retired authority issues again and every daemon trusts it.
#[test]
fn atk_a_retired_file_authority_is_never_current_again() {
    TestDb::each("atk_delete_readopt", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let store = db.open();
        let own = crate::tls::Authority::open_or_create(&dir).unwrap();
        load_or_create(&store, &k, &dir).unwrap();
        rotate(&store, &k).unwrap();
        crate::team_ca::retire(&store, &k, &dir).unwrap();
        store
            .db
            .execute("DELETE FROM team_authorities", args![])
            .unwrap();
        let after = load_or_create(&store, &k, &dir).unwrap();
        assert_ne!(
            after.issuing_fingerprint(),
            own.issuing_fingerprint(),
            "the retired file authority issues again"
        );
    });
}

/// A daemon given another team's key (or another team's daemon on the
/// same database) retires nothing: the current authority must open with
/// its key, and nothing is revoked.
#[test]
fn atk_retire_with_another_teams_key_is_refused() {
    TestDb::each("atk_retire_wrong_key", |db: &TestDb| {
        let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (k, other) = (key(ours.path()), key(theirs.path()));
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = db.open();
        store.insert_agent(&agent("a1"), None).unwrap();
        let first = load_or_create(&store, &k, &dir).unwrap();
        let old = first.issue_agent("id-a1").unwrap();
        assert!(record(
            &mut store,
            "id-a1",
            &old.fingerprint,
            first.issuing_fingerprint(),
            false
        ));
        rotate(&store, &k).unwrap();
        let refused = crate::team_ca::retire(&store, &other, &dir);
        assert!(
            matches!(refused, Err(crate::team_ca::TeamCaError::Current(1.., _))),
            "{refused:?}"
        );
        assert_eq!(
            store.agent_of_cert(&old.fingerprint).unwrap().as_deref(),
            Some("id-a1")
        );
        assert_eq!(
            load_or_create(&store, &k, &dir)
                .unwrap()
                .fingerprints()
                .len(),
            2
        );
    });
}

/// An adopted file authority's key does not stay on disk in the clear.
#[test]
fn atk_an_adopted_file_authority_key_is_removed() {
    TestDb::each("atk_adopted_key_removed", |db: &TestDb| {
        let kd = tempfile::tempdir().unwrap();
        let k = key(kd.path());
        let dir = db.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let store = db.open();
        let own = crate::tls::Authority::open_or_create(&dir).unwrap();
        assert!(dir.join("tls/ca.key").exists());
        let team = load_or_create(&store, &k, &dir).unwrap();
        assert_eq!(team.issuing_fingerprint(), own.issuing_fingerprint());
        assert!(
            !dir.join("tls/ca.key").exists(),
            "the adopted key is still on disk"
        );
    });
}
