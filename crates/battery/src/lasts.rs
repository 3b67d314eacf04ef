//! What lasts from one turn of a warm sandbox to the next: the documented
//! list `check --prove --warm` compares what it finds with, and the text
//! of docs/check.md's table is tested against (one row per kind).
//!
//! Between cold launches nothing lasts: each builds new tmpfs mounts and
//! new namespaces.

/// One kind of state a turn can leave behind.
#[derive(Debug)]
pub struct Lasting {
    /// The kind's id, as the probe reports it.
    pub kind: &'static str,
    /// What the first turn leaves, in words.
    pub left_as: &'static str,
    /// The backends on which it lasts from a warm turn to the next (where
    /// it can be made at all); on every other it is gone.
    pub lasts_warm_on: &'static [&'static str],
}

/// Both backends.
const BOTH: &[&str] = &["native", "bwrap"];

pub const LASTS: &[Lasting] = &[
    Lasting {
        kind: "tmp-file",
        left_as: "a file in /tmp",
        lasts_warm_on: BOTH,
    },
    Lasting {
        kind: "home-file",
        left_as: "a file in the home directory",
        lasts_warm_on: BOTH,
    },
    Lasting {
        kind: "shm-file",
        left_as: "a file in /dev/shm (where writable)",
        lasts_warm_on: BOTH,
    },
    Lasting {
        kind: "sysv-shm",
        left_as: "a System V shared memory segment",
        lasts_warm_on: &[],
    },
    Lasting {
        kind: "sysv-msg",
        left_as: "a System V message queue",
        lasts_warm_on: &[],
    },
    Lasting {
        kind: "sysv-sem",
        left_as: "a System V semaphore set",
        lasts_warm_on: &[],
    },
    Lasting {
        kind: "posix-mqueue",
        left_as: "a POSIX message queue (mq_open fails under Landlock)",
        lasts_warm_on: &["bwrap"],
    },
    Lasting {
        kind: "process",
        left_as: "a process left running in a session of its own",
        lasts_warm_on: &[],
    },
    Lasting {
        kind: "abstract-socket",
        left_as: "an abstract Unix socket that process listens on",
        lasts_warm_on: &[],
    },
];

impl Lasting {
    /// Whether the docs say it lasts from a warm turn to the next on
    /// `backend`.
    pub fn lasts_warm(&self, backend: &str) -> bool {
        self.lasts_warm_on.contains(&backend)
    }

    /// The "between warm turns" column of docs/check.md.
    pub fn warm_text(&self) -> String {
        match self.lasts_warm_on {
            [] => "gone".to_string(),
            on if BOTH.iter().all(|b| on.contains(b)) => "lasts".to_string(),
            on => format!("lasts under {} only", on.join(", ")),
        }
    }

    /// Its row of docs/check.md's table.
    pub fn docs_row(&self) -> String {
        format!(
            "| `{}` | {} | {} | gone |",
            self.kind,
            self.left_as,
            self.warm_text()
        )
    }
}
