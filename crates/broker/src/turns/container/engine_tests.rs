//! Each engine's command for the same container, compared whole.

use std::path::{Path, PathBuf};

use substrat_policy::model::NetworkMode;
use substrat_sandbox::plan::{RlimitKind, RlimitSetting};

use super::super::sweep::{list_args, remove_args};
use super::*;

fn mounts() -> Vec<EngineMount> {
    vec![
        EngineMount::Bind {
            source: "/usr".into(),
            target: "/usr".into(),
            read_only: true,
        },
        EngineMount::Bind {
            source: "/srv/ws".into(),
            target: "/srv/ws".into(),
            read_only: false,
        },
        EngineMount::Tmpfs {
            target: "/tmp".into(),
            mode: 0o1777,
            size: Some(1 << 20),
        },
    ]
}

fn env() -> Vec<(String, String)> {
    vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("TOKEN".into(), "not on a command line".into()),
    ]
}

fn argv() -> Vec<String> {
    vec!["agent".into(), "--flag".into(), "a b".into()]
}

fn rlimits() -> Vec<RlimitSetting> {
    vec![RlimitSetting {
        kind: RlimitKind::Nofile,
        value: 512,
    }]
}

/// Runs `check` with a container of the agent `a1`'s turn `t1`.
fn with_container(
    parent: Option<&Path>,
    network: NetworkMode,
    check: impl FnOnce(&TurnContainer<'_>),
) {
    let (mounts, env, argv, rlimits) = (mounts(), env(), argv(), rlimits());
    let run = TurnContainer {
        name: "substrat-t1-0a1b2c3d",
        labels: Labels {
            daemon: "d1",
            agent: "a1",
            turn: "t1",
        },
        runtime_config: Path::new("/state/agents/a1/container/oci.toml"),
        policy: "worker",
        network,
        workspace: Path::new("/srv/ws"),
        root: Path::new("/state/agents/a1/container/root"),
        cgroup_parent: parent,
        dir: Path::new("/state/agents/a1/container"),
        mounts: &mounts,
        cwd: Path::new("/srv/ws"),
        read_only: true,
        env: &env,
        argv: &argv,
        rlimits: &rlimits,
    };
    check(&run);
}

fn containerd() -> EngineKind {
    EngineKind::Containerd {
        address: "/run/containerd/containerd.sock".into(),
        namespace: "substrat".into(),
    }
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

const OCI: &str = "/usr/bin/substrat-oci";

#[test]
fn podman_runs_the_plan_labelled_with_its_values_in_the_environment() {
    with_container(Some(Path::new("agents")), NetworkMode::None, |run| {
        let engine_env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        let got = turn_command(
            &EngineKind::Podman,
            Path::new("/usr/bin/podman"),
            Path::new(OCI),
            run,
            engine_env,
        )
        .unwrap();
        let mut args = words(
            "--runtime /usr/bin/substrat-oci \
             --runtime-flag config=/state/agents/a1/container/oci.toml \
             --cgroup-manager cgroupfs run --rm --http-proxy=false --env-host=false \
             --name substrat-t1-0a1b2c3d \
             --label io.substrat.daemon=d1 --label io.substrat.agent=a1 \
             --label io.substrat.turn=t1 --network none \
             --ulimit nofile=512:512 --ulimit nproc=1024:1024 --no-hosts \
             --annotation io.substrat.policy=worker \
             --annotation io.substrat.workspace=/srv/ws --workdir /srv/ws \
             --read-only --read-only-tmpfs=false --cgroup-parent /agents \
             --mount type=bind,source=/usr,target=/usr,ro=true \
             --mount type=bind,source=/srv/ws,target=/srv/ws \
             --mount type=tmpfs,target=/tmp,tmpfs-mode=1777,tmpfs-size=1048576,notmpcopyup \
             --env PATH --env TOKEN \
             --rootfs /state/agents/a1/container/root agent --flag",
        );
        args.push("a b".into());
        let env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("TOKEN".to_string(), "not on a command line".to_string()),
        ];
        assert_eq!(
            got,
            EngineCommand {
                program: "/usr/bin/podman".into(),
                args,
                env,
                files: Vec::new(),
            }
        );
    });
}

#[test]
fn containerd_runs_the_same_plan_with_the_agents_runtime_script_and_env_file() {
    with_container(Some(Path::new("agents")), NetworkMode::None, |run| {
        let engine_env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        let got = turn_command(
            &containerd(),
            Path::new("/usr/bin/ctr"),
            Path::new(OCI),
            run,
            engine_env.clone(),
        )
        .unwrap();
        let mut args = words(
            "--address /run/containerd/containerd.sock --namespace substrat \
             run --rm --rootfs --runtime io.containerd.runc.v2 \
             --runc-binary /state/agents/a1/container/substrat-oci \
             --label io.substrat.daemon=d1 --label io.substrat.agent=a1 \
             --label io.substrat.turn=t1 \
             --annotation io.substrat.policy=worker \
             --annotation io.substrat.workspace=/srv/ws --cwd /srv/ws --read-only \
             --cgroup /agents/substrat-t1-0a1b2c3d \
             --mount type=bind,src=/usr,dst=/usr,options=rbind:ro \
             --mount type=bind,src=/srv/ws,dst=/srv/ws,options=rbind:rw \
             --mount type=tmpfs,src=tmpfs,dst=/tmp,options=nosuid:nodev:mode=1777:size=1048576 \
             --env-file /state/agents/a1/container/env \
             -- /state/agents/a1/container/root substrat-t1-0a1b2c3d agent --flag",
        );
        args.push("a b".into());
        let files = vec![
            EngineFile {
                path: "/state/agents/a1/container/substrat-oci".into(),
                text: "#!/bin/sh\n# substrat-sandbox daemon: substrat-oci with this agent's \
                       configuration.\nexec '/usr/bin/substrat-oci' --config \
                       '/state/agents/a1/container/oci.toml' \"$@\"\n"
                    .into(),
                mode: 0o700,
            },
            EngineFile {
                path: "/state/agents/a1/container/env".into(),
                text: "PATH=/usr/bin:/bin\nTOKEN=not on a command line\n".into(),
                mode: 0o600,
            },
        ];
        assert_eq!(
            got,
            EngineCommand {
                program: "/usr/bin/ctr".into(),
                args,
                env: engine_env,
                files,
            }
        );
    });
}

#[test]
fn containerd_refuses_what_it_cannot_give_as_the_plan_says() {
    let refused = |run: &TurnContainer<'_>| match turn_command(
        &containerd(),
        Path::new("ctr"),
        Path::new(OCI),
        run,
        vec![],
    ) {
        Err(TurnError::Container(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    // Its only network besides its own loopback would be the host's.
    with_container(None, NetworkMode::Host, |run| {
        assert!(refused(run).contains("network = \"host\""));
    });
    // A value ctr's environment file would cut at the newline.
    with_container(None, NetworkMode::None, |run| {
        let env = vec![("EVIL".to_string(), "a\nLD_PRELOAD=/x".to_string())];
        let run = TurnContainer { env: &env, ..*run };
        assert!(refused(&run).contains("EVIL has a newline"));
    });
    // A quote would end the runtime script's quoting.
    with_container(None, NetworkMode::None, |run| {
        let config = PathBuf::from("/state/it's/oci.toml");
        let run = TurnContainer {
            runtime_config: &config,
            ..*run
        };
        assert!(refused(&run).contains("a quote"));
    });
    // A comma would start another field of the mount.
    with_container(None, NetworkMode::None, |run| {
        let mounts = vec![EngineMount::Bind {
            source: "/srv/a,dst=/etc".into(),
            target: "/srv/a".into(),
            read_only: true,
        }];
        let run = TurnContainer {
            mounts: &mounts,
            ..*run
        };
        assert!(refused(&run).contains("cannot be given to an engine's --mount"));
    });
}

#[test]
fn without_a_cgroup_parent_neither_engine_names_a_group() {
    with_container(None, NetworkMode::None, |run| {
        for kind in [EngineKind::Podman, containerd()] {
            let got = turn_command(&kind, Path::new("e"), Path::new(OCI), run, vec![]).unwrap();
            assert!(
                !got.args
                    .iter()
                    .any(|a| a == "--cgroup" || a == "--cgroup-parent"),
                "{:?}",
                got.args
            );
        }
    });
}

#[test]
fn each_engine_client_gets_only_its_own_variables() {
    let host = vec![
        ("PATH".to_string(), "/bin".to_string()),
        ("CONTAINERS_CONF".to_string(), "/etc/c.conf".to_string()),
        ("ANTHROPIC_API_KEY".to_string(), "secret".to_string()),
    ];
    assert_eq!(engine_env(&EngineKind::Podman, &host), host[..2].to_vec());
    assert_eq!(engine_env(&containerd(), &host), host[..1].to_vec());
}

#[test]
fn the_sweep_lists_by_the_daemons_label_and_removes_task_then_container() {
    assert_eq!(
        list_args(&EngineKind::Podman, "d1"),
        words("ps --all --filter label=io.substrat.daemon=d1 --format {{.Names}}")
    );
    assert_eq!(
        remove_args(&EngineKind::Podman, "substrat-t1-x"),
        vec![words("rm --force --time 0 substrat-t1-x")]
    );
    let ctr = "--address /run/containerd/containerd.sock --namespace substrat";
    assert_eq!(
        list_args(&containerd(), "d1"),
        words(&format!(
            "{ctr} containers list --quiet labels.\"io.substrat.daemon\"==d1"
        ))
    );
    assert_eq!(
        remove_args(&containerd(), "substrat-t1-x"),
        vec![
            words(&format!("{ctr} tasks delete --force substrat-t1-x")),
            words(&format!("{ctr} containers delete substrat-t1-x")),
        ]
    );
}
