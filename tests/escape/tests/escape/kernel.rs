//! Namespaces, processes and the kernel: nested user namespaces, ptrace,
//! host processes, capabilities, denied interfaces, foreign ABIs, TIOCSTI.

use super::*;

// ---------------------------------------------------------------- namespaces and processes

attack!(nested_user_namespace, |case| {
    assert_eq!(case.probe(&["unshare-user"]), "errno:EPERM");
    assert_eq!(case.probe(&["clone-newuser"]), "errno:EPERM");
    assert_eq!(case.probe(&["clone3"]), "errno:ENOSYS");
});

attack!(ptrace_and_process_memory, |case| {
    assert_eq!(case.probe(&["ptrace-attach", "1"]), "errno:EPERM");
    assert_eq!(case.probe(&["ptrace-parent"]), "errno:EPERM");
    assert_eq!(case.probe(&["process-vm-writev"]), "errno:EPERM");
});

attack!(host_processes_invisible_and_unsignalable, |case| {
    let marker = unique("substrat-host-marker");
    let mut host = Command::new("sleep");
    std::os::unix::process::CommandExt::arg0(&mut host, &marker);
    let mut host = host.arg("30").spawn().unwrap();
    let host_pid = host.id() as i32;
    wait_until(
        "the marker to be findable on the host",
        Duration::from_secs(5),
        || host_processes_with(&marker) == [host_pid],
    );
    let seen = case.probe(&["proc-scan", &reversed(&marker)]);
    let count: usize = seen.rsplit(':').next().unwrap().parse().unwrap();
    assert!(seen.starts_with("value:absent:") && count <= 3, "{seen}");
    assert_eq!(case.probe(&["kill", &host.id().to_string()]), "errno:ESRCH");
    host.kill().unwrap();
    host.wait().unwrap();
});

attack!(capabilities_and_no_new_privs, |case| {
    // The backend really is the one asked for: pid 1 is bwrap's init, or ours.
    let init = match case.backend {
        Backend::Native => "value:substrat-sandbo",
        Backend::Bwrap => "value:bwrap",
    };
    assert_eq!(case.probe(&["comm", "1"]), init);
    let zero = "0000000000000000";
    let want = format!(
        "value:CapInh={zero},CapPrm={zero},CapEff={zero},CapBnd={zero},CapAmb={zero},NoNewPrivs=1,Seccomp=2"
    );
    assert_eq!(case.probe(&["status"]), want);
});

attack!(kernel_interfaces_denied, |case| {
    for attack in [
        ["io-uring-setup"],
        ["keyctl"],
        ["add-key"],
        ["bpf"],
        ["perf-event-open"],
        ["userfaultfd"],
        ["mount-tmpfs"],
    ] {
        assert_eq!(case.probe(&attack), "errno:EPERM", "{attack:?}");
    }
});

attack!(foreign_syscall_abis_killed, |case| {
    assert_eq!(case.probe(&["int80"]), "signal:SIGSYS");
    assert_eq!(case.probe(&["x32-syscall"]), "signal:SIGSYS");
});

attack!(tiocsti_on_a_real_pty, |case| {
    let pty = nix::pty::openpty(None, None).unwrap();
    for variant in [&["tiocsti"][..], &["tiocsti", "high"]] {
        let mut argv = vec!["./substrat-probe"];
        argv.extend_from_slice(variant);
        let tty = std::fs::File::from(pty.slave.try_clone().unwrap());
        let outcome = outcome_of(case.command("worker", &argv).stdin(Stdio::from(tty)));
        assert_eq!(outcome, "errno:EPERM", "{variant:?}");
    }
    // Nothing was pushed into the terminal's input. (The slave stays open,
    // so an empty read of the master says EAGAIN, not EIO.)
    nix::fcntl::fcntl(
        &pty.master,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        nix::unistd::read(&pty.master, &mut buf),
        Err(nix::errno::Errno::EAGAIN)
    );
});
