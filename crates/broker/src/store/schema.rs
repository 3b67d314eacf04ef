//! The schema as versioned migrations, applied in order at open; each is
//! one transaction and is recorded in `schema_migrations`. A database made
//! before the migrations were versioned (tables, no `schema_migrations`)
//! is brought to version 1 by adding what it lacks; a database of a
//! newer version than this build knows is refused, never written.
//!
//! Each step has a text per engine: SQLite's as it always was, and
//! PostgreSQL's, which starts at the tables' final shape of version 1 (no
//! PostgreSQL database predates the versions). Integers are BIGINT there,
//! so one binding (i64) fits every column on both.

use super::StoreError;
use super::db::{Db, Engine, args};

/// One step of the schema.
pub(super) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

impl Migration {
    fn sql(&self, engine: Engine) -> &'static str {
        match engine {
            Engine::Sqlite => self.sqlite,
            Engine::Postgres => self.postgres,
        }
    }
}

/// Every migration, in order. Append only: a released step is never edited.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "agents, messages, turns, tool pins, server switches, model usage",
        sqlite: V1,
        postgres: V1_POSTGRES,
    },
    Migration {
        version: 2,
        name: "agent certificates (relays over mutual TLS)",
        sqlite: "CREATE TABLE agent_certs (
            fingerprint TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            issued_at INTEGER NOT NULL
        );
        CREATE INDEX agent_certs_agent ON agent_certs(agent_id);",
        postgres: "CREATE TABLE agent_certs (
            fingerprint TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            issued_at BIGINT NOT NULL
        );
        CREATE INDEX agent_certs_agent ON agent_certs(agent_id);",
    },
    Migration {
        version: 3,
        name: "daemons, the agents each runs, leases on running turns",
        sqlite: "CREATE TABLE daemons (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at INTEGER NOT NULL,
            heartbeat_at INTEGER NOT NULL
        );
        ALTER TABLE agents ADD COLUMN daemon_id TEXT;
        ALTER TABLE turns ADD COLUMN daemon_id TEXT;
        ALTER TABLE turns ADD COLUMN lease_until INTEGER;
        CREATE INDEX agents_daemon ON agents(daemon_id);",
        postgres: "CREATE TABLE daemons (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            pid BIGINT NOT NULL,
            started_at BIGINT NOT NULL,
            heartbeat_at BIGINT NOT NULL
        );
        ALTER TABLE agents ADD COLUMN daemon_id TEXT;
        ALTER TABLE turns ADD COLUMN daemon_id TEXT;
        ALTER TABLE turns ADD COLUMN lease_until BIGINT;
        CREATE INDEX agents_daemon ON agents(daemon_id);",
    },
    Migration {
        version: 4,
        name: "the team's model requests per minute, counted across daemons",
        sqlite: "CREATE TABLE team_minutes (
            minute INTEGER PRIMARY KEY,
            requests INTEGER NOT NULL
        );
        CREATE INDEX model_usage_day ON model_usage(day);",
        postgres: "CREATE TABLE team_minutes (
            minute BIGINT PRIMARY KEY,
            requests BIGINT NOT NULL
        );
        CREATE INDEX model_usage_day ON model_usage(day);",
    },
    Migration {
        version: 5,
        name: "the tokens model requests in flight reserve from the team's day, across daemons",
        sqlite: "CREATE TABLE team_reservations (
            id TEXT PRIMARY KEY,
            tokens INTEGER NOT NULL,
            expires_ms INTEGER NOT NULL
        );",
        postgres: "CREATE TABLE team_reservations (
            id TEXT PRIMARY KEY,
            tokens BIGINT NOT NULL,
            expires_ms BIGINT NOT NULL
        );",
    },
    Migration {
        version: 6,
        name: "agents' call rates and turns' tool steps, counted across daemons",
        sqlite: "CREATE TABLE agent_buckets (
            agent_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            units INTEGER NOT NULL,
            last_ms INTEGER NOT NULL,
            PRIMARY KEY (agent_id, tool)
        );
        ALTER TABLE turns ADD COLUMN steps INTEGER NOT NULL DEFAULT 0;",
        postgres: "CREATE TABLE agent_buckets (
            agent_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            units BIGINT NOT NULL,
            last_ms BIGINT NOT NULL,
            PRIMARY KEY (agent_id, tool)
        );
        ALTER TABLE turns ADD COLUMN steps BIGINT NOT NULL DEFAULT 0;",
    },
    Migration {
        version: 7,
        name: "placement: daemons' free slots and shared paths, why an agent runs where it does",
        sqlite: "ALTER TABLE daemons ADD COLUMN max_agents INTEGER;
        ALTER TABLE daemons ADD COLUMN shared_paths TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE daemons ADD COLUMN state_dir TEXT;
        ALTER TABLE agents ADD COLUMN placed TEXT;",
        postgres: "ALTER TABLE daemons ADD COLUMN max_agents BIGINT;
        ALTER TABLE daemons ADD COLUMN shared_paths TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE daemons ADD COLUMN state_dir TEXT;
        ALTER TABLE agents ADD COLUMN placed TEXT;",
    },
    Migration {
        version: 8,
        name: "the team's certificate authorities, their keys sealed; daemons' TLS addresses",
        sqlite: "CREATE TABLE team_authorities (
            generation INTEGER PRIMARY KEY,
            fingerprint TEXT NOT NULL UNIQUE,
            cert TEXT NOT NULL,
            sealed_key TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            retired_at INTEGER
        );
        CREATE UNIQUE INDEX team_authorities_current ON team_authorities(state) WHERE state = 'current';
        ALTER TABLE agent_certs ADD COLUMN authority TEXT;
        ALTER TABLE daemons ADD COLUMN tls_address TEXT;",
        postgres: "CREATE TABLE team_authorities (
            generation BIGINT PRIMARY KEY,
            fingerprint TEXT NOT NULL UNIQUE,
            cert TEXT NOT NULL,
            sealed_key TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            retired_at BIGINT
        );
        CREATE UNIQUE INDEX team_authorities_current ON team_authorities(state) WHERE state = 'current';
        ALTER TABLE agent_certs ADD COLUMN authority TEXT;
        ALTER TABLE daemons ADD COLUMN tls_address TEXT;",
    },
    Migration {
        version: 9,
        name: "placement: the roles (with their policies' hashes) and providers each daemon runs",
        sqlite: "ALTER TABLE daemons ADD COLUMN roles TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE daemons ADD COLUMN providers TEXT NOT NULL DEFAULT '[]';",
        postgres: "ALTER TABLE daemons ADD COLUMN roles TEXT NOT NULL DEFAULT '{}';
        ALTER TABLE daemons ADD COLUMN providers TEXT NOT NULL DEFAULT '[]';",
    },
    Migration {
        version: 10,
        name: "where each daemon's sockets are: its runtime directory (`daemon --runtime-dir`)",
        sqlite: "ALTER TABLE daemons ADD COLUMN runtime_dir TEXT;",
        postgres: "ALTER TABLE daemons ADD COLUMN runtime_dir TEXT;",
    },
    Migration {
        version: 11,
        name: "how each agent came to its daemon, apart from the words saying why",
        sqlite: PLACED_KIND,
        postgres: PLACED_KIND,
    },
];

/// `agents.placed_kind`: `here` (made on the daemon that runs it),
/// `placed` (made by another daemon), `adopted` (taken over from a
/// silent one); rows from before, from the words of `placed`.
const PLACED_KIND: &str = "
ALTER TABLE agents ADD COLUMN placed_kind TEXT;
UPDATE agents SET placed_kind = CASE
    WHEN placed LIKE 'placed:%' THEN 'placed'
    WHEN placed LIKE 'adopted%' THEN 'adopted'
    WHEN placed IS NULL THEN NULL
    ELSE 'here' END;
";

/// The schema version this build writes.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

const V1: &str = "
CREATE TABLE IF NOT EXISTS agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    parent_id TEXT,
    workspace TEXT,
    depth INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agents_parent ON agents(parent_id);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    from_id TEXT NOT NULL,
    from_name TEXT NOT NULL,
    to_id TEXT NOT NULL,
    text TEXT NOT NULL,
    sync INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_inbox ON messages(to_id, status, seq);
CREATE TABLE IF NOT EXISTS turns (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    message_id TEXT,
    prompt TEXT,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    finished_at INTEGER,
    session_id TEXT,
    result TEXT,
    error TEXT,
    tool_calls TEXT,
    notes TEXT
);
CREATE INDEX IF NOT EXISTS turns_queue ON turns(status, seq);
CREATE INDEX IF NOT EXISTS turns_agent ON turns(agent_id, seq);
CREATE INDEX IF NOT EXISTS turns_message ON turns(message_id);
CREATE TABLE IF NOT EXISTS tool_pins (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    approved_hash TEXT,
    seen_hash TEXT NOT NULL,
    seen_definition TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (server, tool)
);
CREATE TABLE IF NOT EXISTS server_switches (
    server TEXT PRIMARY KEY,
    enabled INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS model_usage (
    agent_id TEXT NOT NULL,
    day INTEGER NOT NULL,
    api TEXT NOT NULL,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    PRIMARY KEY (agent_id, day, api)
);
";

/// Version 1 on PostgreSQL: SQLite's tables with the columns they gained
/// before versions (ADDED_COLUMNS) and their unique indexes.
const V1_POSTGRES: &str = "
CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    parent_id TEXT,
    workspace TEXT,
    depth BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    model TEXT,
    provider TEXT,
    state TEXT NOT NULL DEFAULT 'active',
    reason TEXT,
    session_id TEXT,
    created_by TEXT,
    persona TEXT,
    role_args TEXT
);
CREATE INDEX agents_parent ON agents(parent_id);
CREATE UNIQUE INDEX agents_created_by ON agents(created_by) WHERE created_by IS NOT NULL;
CREATE TABLE messages (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    from_id TEXT NOT NULL,
    from_name TEXT NOT NULL,
    to_id TEXT NOT NULL,
    text TEXT NOT NULL,
    sync BIGINT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    thread TEXT,
    dedupe_key TEXT,
    answered BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX messages_inbox ON messages(to_id, status, seq);
CREATE UNIQUE INDEX messages_dedupe ON messages(dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE TABLE turns (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    agent_id TEXT NOT NULL,
    message_id TEXT,
    prompt TEXT,
    status TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    started_at BIGINT,
    finished_at BIGINT,
    session_id TEXT,
    result TEXT,
    error TEXT,
    tool_calls TEXT,
    notes TEXT
);
CREATE INDEX turns_queue ON turns(status, seq);
CREATE INDEX turns_agent ON turns(agent_id, seq);
CREATE INDEX turns_message ON turns(message_id);
CREATE TABLE tool_pins (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    approved_hash TEXT,
    seen_hash TEXT NOT NULL,
    seen_definition TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    updated_at BIGINT NOT NULL,
    position BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (server, tool)
);
CREATE TABLE server_switches (
    server TEXT PRIMARY KEY,
    enabled BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE TABLE model_usage (
    agent_id TEXT NOT NULL,
    day BIGINT NOT NULL,
    api TEXT NOT NULL,
    requests BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    PRIMARY KEY (agent_id, day, api)
);
";

/// Columns the tables gained before the schema was versioned: part of
/// version 1, added where missing. Closed: a new column is a new
/// migration (a database already at version 1 never reads this again).
pub(super) const ADDED_COLUMNS: [(&str, &str, &str); 12] = [
    ("agents", "model", "TEXT"),
    ("agents", "provider", "TEXT"),
    ("agents", "state", "TEXT NOT NULL DEFAULT 'active'"),
    ("agents", "reason", "TEXT"),
    ("agents", "session_id", "TEXT"),
    ("agents", "created_by", "TEXT"),
    ("messages", "thread", "TEXT"),
    ("messages", "dedupe_key", "TEXT"),
    ("messages", "answered", "INTEGER NOT NULL DEFAULT 0"),
    ("tool_pins", "position", "INTEGER NOT NULL DEFAULT 0"),
    ("agents", "persona", "TEXT"),
    ("agents", "role_args", "TEXT"),
];

/// Brings the database to `latest_version`. Each step is one transaction
/// that reads the version again inside it, after taking the lock that
/// serialises migrations (SQLite: IMMEDIATE; PostgreSQL: an advisory lock
/// held to the transaction's end): a second process opening the same
/// database at once (`check --state-dir` beside a starting daemon, a
/// second daemon) waits, then finds the step applied.
pub(super) fn migrate(db: &Db) -> Result<(), StoreError> {
    let integer = match db.engine() {
        Engine::Sqlite => "INTEGER",
        Engine::Postgres => "BIGINT",
    };
    db.transaction(|tx| {
        lock_migrations(tx)?;
        tx.batch(&format!(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version {integer} PRIMARY KEY,
                name TEXT NOT NULL,
                applied_at {integer} NOT NULL
            )"
        ))
    })?;
    let started_at = version(db)?;
    for migration in MIGRATIONS.iter().filter(|m| m.version > started_at) {
        db.transaction(|tx| {
            lock_migrations(tx)?;
            if version(tx)? >= migration.version {
                return Ok(());
            }
            tx.batch(migration.sql(tx.engine()))?;
            // Version 1 is the first tables and the columns they gained
            // before versions: a SQLite database made then has its tables
            // (CREATE ... IF NOT EXISTS leaves them) and gets what it lacks.
            if migration.version == 1 && tx.engine() == Engine::Sqlite {
                add_missing_columns(tx)?;
            }
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                args![migration.version, migration.name, super::now_ms()],
            )?;
            Ok(())
        })?;
    }
    Ok(())
}

/// PostgreSQL: the lock every process migrating this database takes (two
/// CREATE TABLE IF NOT EXISTS at once can both fail there). SQLite's
/// IMMEDIATE transaction is its lock.
fn lock_migrations(tx: &Db) -> Result<(), StoreError> {
    if tx.engine() == Engine::Postgres {
        // Any constant names the lock: the same one in every daemon.
        tx.batch("SELECT pg_advisory_xact_lock(7337002600)")?;
    }
    Ok(())
}

fn version(db: &Db) -> Result<i64, StoreError> {
    let found: i64 = db
        .one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )?
        .get(0)?;
    if found > latest_version() {
        return Err(StoreError::Newer {
            found,
            known: latest_version(),
        });
    }
    Ok(found)
}

/// SQLite only: a database from before the versions.
pub(super) fn add_missing_columns(db: &Db) -> Result<(), StoreError> {
    for (table, column, decl) in ADDED_COLUMNS {
        let found = db.row(
            &format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"),
            args![column],
        )?;
        if found.is_none() {
            db.batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
        }
    }
    db.batch(
        "CREATE UNIQUE INDEX IF NOT EXISTS messages_dedupe ON messages(dedupe_key) WHERE dedupe_key IS NOT NULL;
         CREATE UNIQUE INDEX IF NOT EXISTS agents_created_by ON agents(created_by) WHERE created_by IS NOT NULL;",
    )?;
    Ok(())
}
