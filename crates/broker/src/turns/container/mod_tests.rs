use std::time::{Duration, SystemTime};

use super::*;

#[test]
fn the_runtime_config_replaces_a_link_put_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "original").unwrap();
    let container = dir.path().join("container");
    std::fs::create_dir(&container).unwrap();
    std::os::unix::fs::symlink(&victim, container.join("oci.toml")).unwrap();
    std::os::unix::fs::symlink(&victim, container.join("oci.partial")).unwrap();
    let path =
        write_runtime_config(&container, None, &[], Path::new("/home/a"), vec![], &[]).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file(), "{meta:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("report_dir")
    );
}

#[test]
fn only_the_newest_reports_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let start = SystemTime::now() - Duration::from_secs(1000);
    for i in 0..25u64 {
        let path = dir.path().join(format!("r{i}.json"));
        let file = std::fs::File::create(&path).unwrap();
        file.set_modified(start + Duration::from_secs(i)).unwrap();
    }
    prune_reports(dir.path(), 20);
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want: Vec<String> = (5..25).map(|i| format!("r{i}.json")).collect();
    want.sort();
    assert_eq!(left, want);
}
