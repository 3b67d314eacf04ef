//! Test databases on each engine: a SQLite file in a temporary directory,
//! and, where `SUBSTRAT_TEST_POSTGRES` names a PostgreSQL database (CI
//! starts one), a schema of its own in it, dropped at the end. Without the
//! variable the PostgreSQL run of a test prints that it was skipped.

use super::db::Db;
use super::pg::PgConn;
use super::{Engine, StateDatabase, Store};

/// The variable naming the PostgreSQL database tests may use.
pub const POSTGRES_VARIABLE: &str = "SUBSTRAT_TEST_POSTGRES";

/// A state directory, and the state database for it on one engine.
pub struct TestDb {
    dir: tempfile::TempDir,
    postgres: Option<PgSchema>,
}

struct PgSchema {
    /// The database's URL with this schema first on the search path.
    url: String,
    schema: String,
    admin: Db,
}

impl TestDb {
    /// Runs `test` on every engine available, each with a fresh database;
    /// prints `SKIPPED` for an engine that is not.
    /// A database named but unreachable fails the test: only a database
    /// not named is a skip.
    pub fn each(name: &str, test: impl Fn(&TestDb)) {
        match Self::new(Engine::Sqlite) {
            Ok(db) => test(&db),
            Err(why) => panic!("{name} on SQLite: {why}"),
        }
        if let Some(db) = Self::postgres(&format!("{name} on PostgreSQL")) {
            test(&db);
        }
    }

    /// A PostgreSQL database for a test that needs one: None, with the
    /// test reported skipped, when none is named; a failure when one is
    /// named but cannot be used.
    pub fn postgres(test: &str) -> Option<Self> {
        match Self::new(Engine::Postgres) {
            Ok(db) => Some(db),
            Err(why) if std::env::var_os(POSTGRES_VARIABLE).is_none() => {
                println!("SKIPPED {test}: {why}");
                None
            }
            Err(why) => panic!("{test}: {why}"),
        }
    }

    pub fn new(engine: Engine) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let postgres = match engine {
            Engine::Sqlite => None,
            Engine::Postgres => Some(PgSchema::new()?),
        };
        Ok(Self { dir, postgres })
    }

    /// The state directory (the SQLite database's, and the sockets').
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn location(&self) -> StateDatabase {
        match &self.postgres {
            None => StateDatabase::in_state_dir(self.dir.path()),
            Some(pg) => StateDatabase::Postgres(pg.url.clone()),
        }
    }

    /// The store, opened (again) on this database.
    pub fn open(&self) -> Store {
        match Store::open_at(&self.location()) {
            Ok(store) => store,
            Err(e) => panic!("opening {}: {e}", self.location()),
        }
    }

    /// PostgreSQL: runs `work` while another session holds `table`
    /// locked (a write to it waits until the server's lock timeout).
    pub fn with_table_locked(&self, table: &str, work: impl FnOnce()) {
        let Some(pg) = &self.postgres else {
            return work();
        };
        let locked = pg.admin.transaction(|tx| {
            tx.batch(&format!(
                "LOCK TABLE {}.{table} IN EXCLUSIVE MODE",
                pg.schema
            ))?;
            work();
            Ok(())
        });
        assert!(locked.is_ok(), "{locked:?}");
    }

    /// PostgreSQL: drops the schema, as if the database were gone (every
    /// statement of a store on it fails from then on).
    pub fn drop_postgres_schema(&self) {
        if let Some(pg) = &self.postgres {
            let dropped = pg
                .admin
                .batch(&format!("DROP SCHEMA {} CASCADE", pg.schema));
            assert!(dropped.is_ok(), "{dropped:?}");
        }
    }

    /// A connection of its own to the PostgreSQL database, if this is one.
    pub(super) fn admin(&self) -> Option<&Db> {
        self.postgres.as_ref().map(|pg| &pg.admin)
    }

    pub fn engine(&self) -> Engine {
        match self.postgres {
            None => Engine::Sqlite,
            Some(_) => Engine::Postgres,
        }
    }
}

impl PgSchema {
    fn new() -> Result<Self, String> {
        let base = std::env::var(POSTGRES_VARIABLE)
            .map_err(|_| format!("{POSTGRES_VARIABLE} names no database (scripts/postgres)"))?;
        let admin = PgConn::connect(&base).map_err(|e| e.to_string())?;
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        admin
            .batch(&format!("CREATE SCHEMA {schema}"))
            .map_err(|e| e.to_string())?;
        let join = if base.contains('?') { '&' } else { '?' };
        Ok(Self {
            url: format!("{base}{join}options=-csearch_path%3D{schema}"),
            schema,
            admin: Db::Postgres(Box::new(admin)),
        })
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch(&format!("DROP SCHEMA {} CASCADE", self.schema));
    }
}

/// An agent row for tests: `id-NAME`, role `worker`, no workspace.
pub fn agent(name: &str) -> super::Agent {
    super::Agent {
        id: format!("id-{name}"),
        name: name.into(),
        role: "worker".into(),
        parent_id: None,
        workspace: None,
        depth: 0,
        created_at: super::now_ms(),
        model: None,
        provider: None,
    }
}
