//! The planner's whole answers.

use super::*;

fn daemon(id: &str, max: Option<u32>, agents: u32, shared: &[&str]) -> Candidate {
    Candidate {
        id: id.into(),
        name: format!("host-{id}:/var/lib/substrat"),
        max_agents: max,
        agents,
        shared_paths: shared.iter().map(PathBuf::from).collect(),
        roles: Default::default(),
        providers: Vec::new(),
    }
}

fn placed(id: &str, reason: &str) -> Plan {
    Plan {
        daemon_id: id.into(),
        here: false,
        reason: reason.into(),
        policy_hash: String::new(),
    }
}

fn here(reason: &str) -> Plan {
    Plan {
        daemon_id: "a".into(),
        here: true,
        reason: reason.into(),
        policy_hash: String::new(),
    }
}

#[test]
fn a_shared_workspace_goes_to_the_daemon_with_most_free_slots() {
    let daemons = [
        daemon("a", Some(8), 8, &["/srv/team"]),
        daemon("b", Some(8), 5, &["/srv/team"]),
        daemon("c", Some(4), 0, &["/srv/team"]),
    ];
    assert_eq!(
        plan("a", Some(Path::new("/srv/team/p")), &daemons),
        placed(
            "c",
            "placed: most free slots (4 of 4) and workspace under shared path /srv/team"
        )
    );
}

#[test]
fn no_workspace_goes_to_most_free_slots_and_ties_are_broken_by_name() {
    let daemons = [
        daemon("a", None, 0, &[]),
        daemon("c", Some(8), 5, &[]),
        daemon("b", Some(8), 5, &[]),
    ];
    assert_eq!(
        plan("a", None, &daemons),
        placed("b", "placed: most free slots (3 of 8), no workspace")
    );
}

#[test]
fn here_keeps_the_agent_when_it_has_as_many_free_slots() {
    let daemons = [
        daemon("a", Some(8), 5, &["/srv/team"]),
        daemon("b", Some(8), 5, &["/srv/team"]),
    ];
    assert_eq!(
        plan("a", Some(Path::new("/srv/team/p")), &daemons),
        here("here: most free slots (3 of 8)")
    );
}

#[test]
fn a_workspace_not_shared_here_stays_here() {
    let daemons = [
        daemon("a", Some(8), 0, &[]),
        daemon("b", Some(8), 0, &["/"]),
    ];
    assert_eq!(
        plan("a", Some(Path::new("/home/x/p")), &daemons),
        here("here: workspace /home/x/p not shared")
    );
}

#[test]
fn a_text_prefix_is_not_a_shared_path() {
    // `/srv/shared-evil` starts with the text `/srv/shared` but is not
    // below it.
    let daemons = [
        daemon("a", Some(1), 1, &["/srv/shared", "/srv/shared-evil"]),
        daemon("b", Some(8), 0, &["/srv/shared"]),
    ];
    assert_eq!(
        plan("a", Some(Path::new("/srv/shared-evil/p")), &daemons),
        here("here: no other live daemon with a free slot reaches workspace /srv/shared-evil/p")
    );
    assert!(!is_under(
        Path::new("/srv/shared-evil"),
        Path::new("/srv/shared")
    ));
    assert!(is_under(Path::new("/srv/shared"), Path::new("/srv/shared")));
}

#[test]
fn a_path_left_with_dot_dot_is_never_under() {
    assert!(!is_under(
        Path::new("/srv/team/../../etc"),
        Path::new("/srv/team")
    ));
    assert!(!is_under(Path::new("srv/team/p"), Path::new("srv/team")));
    let daemons = [
        daemon("a", Some(1), 1, &["/srv/team"]),
        daemon("b", Some(8), 0, &["/srv/team"]),
    ];
    assert_eq!(
        plan("a", Some(Path::new("/srv/team/../../etc")), &daemons),
        here("here: workspace /srv/team/../../etc not shared")
    );
}

#[test]
fn full_or_undeclared_daemons_take_nothing() {
    let daemons = [
        daemon("a", Some(2), 2, &[]),
        daemon("b", Some(3), 3, &[]),
        daemon("c", None, 0, &[]),
    ];
    assert_eq!(
        plan("a", None, &daemons),
        here("here: no other live daemon has a free slot")
    );
}

#[test]
fn a_daemon_not_registered_yet_places_by_the_others() {
    let daemons = [daemon("b", Some(2), 0, &["/srv/team"])];
    assert_eq!(
        plan("a", Some(Path::new("/srv/team/p")), &daemons),
        here("here: workspace /srv/team/p not shared")
    );
    assert_eq!(
        plan("a", None, &daemons),
        placed("b", "placed: most free slots (2 of 2), no workspace")
    );
}

/// Symlinks and `..` are resolved before the comparison: a link under the
/// shared path to a directory outside it is outside; a path through `..`
/// back into it is inside.
#[test]
fn the_workspace_is_resolved_before_it_is_compared() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let shared = root.join("shared");
    let outside = root.join("outside");
    std::fs::create_dir_all(shared.join("p")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, shared.join("link")).unwrap();
    let shared_text = shared.display().to_string();
    let daemons = [
        daemon("a", Some(1), 1, &[&shared_text]),
        daemon("b", Some(4), 0, &[&shared_text]),
    ];
    let link = resolve_workspace(&shared.join("link").display().to_string()).unwrap();
    assert_eq!(link, outside);
    assert_eq!(
        plan("a", Some(&link), &daemons),
        here(&format!("here: workspace {} not shared", outside.display()))
    );
    let dotted = resolve_workspace(&format!("{}/../shared/p", outside.display())).unwrap();
    assert_eq!(
        plan("a", Some(&dotted), &daemons),
        placed(
            "b",
            &format!(
                "placed: most free slots (4 of 4) and workspace under shared path {shared_text}"
            )
        )
    );
    assert_eq!(
        resolve_workspace(&root.join("gone").display().to_string()),
        None
    );
}

/// Adoption (svcfin b): the policy is the dead daemon's declared one
/// (none declared: not adopted), and a workspace is taken only under a
/// path both declare shared (one the dead daemon did not share: not
/// adopted, whatever host the adopter is on).
#[test]
fn adoption_needs_the_dead_daemons_policy_and_a_path_both_share() {
    let runs = |mut d: Candidate, hash: &str| {
        d.roles.insert("worker".into(), hash.into());
        d
    };
    let adopter = runs(daemon("c", Some(4), 0, &["/srv/team"]), "h");
    let mut agent = crate::store::testdb::agent("w");
    agent.workspace = Some("/srv/team/p".into());
    let from = runs(daemon("b", Some(4), 1, &["/srv/team"]), "h");
    assert!(may_adopt(&adopter, &from, &agent));
    let silent_on_role = daemon("b", Some(4), 1, &["/srv/team"]);
    assert!(!may_adopt(&adopter, &silent_on_role, &agent));
    let other_policy = runs(daemon("b", Some(4), 1, &["/srv/team"]), "other");
    assert!(!may_adopt(&adopter, &other_policy, &agent));
    let mut not_shared = runs(daemon("b", Some(4), 1, &[]), "h");
    not_shared.name = "elsewhere:/var/lib/substrat".into();
    assert!(!may_adopt(&adopter, &not_shared, &agent));
    // On the adopter's host: the same directory.
    not_shared.name = adopter.name.clone();
    assert!(may_adopt(&adopter, &not_shared, &agent));
    assert!(adopted_on_its_host(&not_shared, &agent));
    agent.workspace = None;
    assert!(may_adopt(&adopter, &not_shared, &agent));
}
