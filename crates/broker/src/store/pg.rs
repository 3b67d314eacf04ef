//! The state database on PostgreSQL: one connection, driven by a runtime
//! on a thread of its own (the store is called from the daemon's runtime
//! and from plain threads alike, under the broker's lock). Every call is
//! bounded: a database that does not answer within `CALL_TIMEOUT` is
//! unavailable, the connection is dropped (the server then aborts what it
//! held) and the next call connects again. A connection lost inside a
//! transaction fails every call until the transaction is rolled back, so
//! no statement of it runs outside it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, Config, NoTls, Statement};

use super::StoreError;
use super::pg_address::{PgAddress, pg_address};
use super::values::{Row, Value};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long one call may wait for the database.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

struct Live {
    client: Arc<Client>,
    statements: HashMap<String, Statement>,
    generation: u64,
}

pub(super) struct PgConn {
    config: Config,
    /// None: plain (pg_address).
    tls: Option<MakeRustlsConnect>,
    handle: tokio::runtime::Handle,
    /// Dropped with the connection: the driver thread then ends.
    _stop: tokio::sync::oneshot::Sender<()>,
    live: RefCell<Option<Live>>,
    generations: Cell<u64>,
    /// The connection a transaction began on, while one is open.
    transaction: Cell<Option<u64>>,
    /// The daemon whose lock each connection takes (below), if any.
    daemon: RefCell<Option<String>>,
    /// The backend of this process's last connection.
    last_backend: Cell<Option<i32>>,
}

/// The session lock a daemon holds on its id in its schema of the
/// database, taken again by every new connection: two processes with one
/// daemon id (a copied state directory) would run the same agents' turns
/// twice. Its first key is this program's; the second names the schema
/// and the daemon.
const DAEMON_LOCK: &str =
    "SELECT pg_try_advisory_lock(73370026, hashtext(current_schema() || ':' || $1))";

impl PgConn {
    /// Starts the driver thread and connects once: a database that cannot
    /// be reached at open is an error, not a daemon that starts blind.
    pub(super) fn connect(url: &str) -> Result<Self, StoreError> {
        let PgAddress { config, tls } = pg_address(url)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("state-db".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(runtime.handle().clone()));
                // Runs the connections' drivers and the calls until the
                // store is dropped.
                let _ = runtime.block_on(stopped);
            })
            .map_err(|e| StoreError::Unavailable(format!("a thread for the database: {e}")))?;
        let handle = handle_rx
            .recv()
            .map_err(|_| StoreError::Unavailable("the database thread ended".into()))?
            .map_err(|e| StoreError::Unavailable(format!("a runtime for the database: {e}")))?;
        let conn = Self {
            config,
            tls,
            handle,
            _stop: stop,
            live: RefCell::new(None),
            generations: Cell::new(0),
            transaction: Cell::new(None),
            daemon: RefCell::new(None),
            last_backend: Cell::new(None),
        };
        conn.client()?;
        Ok(conn)
    }

    /// Takes `daemon`'s lock now and on every connection made again;
    /// refused while another session holds it.
    pub(super) fn hold_daemon_lock(&self, daemon: &str) -> Result<(), StoreError> {
        *self.daemon.borrow_mut() = Some(daemon.to_owned());
        self.lose();
        self.client().map(|_| ())
    }

    pub(super) fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, StoreError> {
        let (client, statement) = self.prepared(sql)?;
        let args = args.to_vec();
        let changed = self.run(async move {
            let refs: Vec<&(dyn ToSql + Sync)> =
                args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            client.execute(&statement, &refs).await
        })?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }

    pub(super) fn rows(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, StoreError> {
        let (client, statement) = self.prepared(sql)?;
        let args = args.to_vec();
        let rows = self.run(async move {
            let refs: Vec<&(dyn ToSql + Sync)> =
                args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            client.query(&statement, &refs).await
        })?;
        rows.iter().map(row_values).collect()
    }

    pub(super) fn batch(&self, sql: &str) -> Result<(), StoreError> {
        let ends_transaction = matches!(sql, "COMMIT" | "ROLLBACK");
        if sql == "ROLLBACK" && self.lost_transaction() {
            // The server rolled it back when the connection went.
            self.transaction.set(None);
            return Ok(());
        }
        let client = self.client()?;
        let text = sql.to_owned();
        let result = self.run(async move { client.batch_execute(&text).await });
        if sql == "BEGIN" && result.is_ok() {
            self.transaction.set(self.live_generation());
        } else if ends_transaction {
            self.transaction.set(None);
        }
        result
    }

    fn lost_transaction(&self) -> bool {
        self.transaction.get().is_some() && self.transaction.get() != self.live_generation()
    }

    fn live_generation(&self) -> Option<u64> {
        self.live.borrow().as_ref().map(|live| live.generation)
    }

    /// The connection, made again if it was lost outside a transaction.
    /// Inside one, a lost connection fails every statement until the
    /// rollback: none may run on a new connection, outside it.
    fn client(&self) -> Result<Arc<Client>, StoreError> {
        let lost = StoreError::Unavailable(
            "the connection to the database was lost inside a transaction".into(),
        );
        if self.lost_transaction() {
            return Err(lost);
        }
        if let Some(live) = self.live.borrow().as_ref()
            && !live.client.is_closed()
        {
            return Ok(live.client.clone());
        }
        if self.transaction.get().is_some() {
            self.lose();
            return Err(lost);
        }
        self.lose();
        let client = Arc::new(self.open_connection()?);
        let backend = self.take_daemon_lock(&client)?;
        self.last_backend.set(Some(backend));
        let generation = self.generations.get() + 1;
        self.generations.set(generation);
        *self.live.borrow_mut() = Some(Live {
            client: client.clone(),
            statements: HashMap::new(),
            generation,
        });
        Ok(client)
    }

    fn open_connection(&self) -> Result<Client, StoreError> {
        let (config, tls) = (self.config.clone(), self.tls.clone());
        self.run(async move {
            // The connection runs on this runtime until it ends.
            let ended = |e: tokio_postgres::Error| {
                tracing::warn!("the state database's connection ended: {e}");
            };
            Ok(match tls {
                None => {
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(async move { connection.await.map_err(ended) });
                    client
                }
                Some(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(async move { connection.await.map_err(ended) });
                    client
                }
            })
        })
    }

    /// Takes the daemon's lock on a new connection (when this is a
    /// daemon's); returns the connection's backend pid. A lock still held
    /// by this process's own previous connection (one it gave up on: the
    /// server had not seen it go) is freed by ending that backend; any
    /// other holder is another process.
    fn take_daemon_lock(&self, client: &Arc<Client>) -> Result<i32, StoreError> {
        let daemon = self.daemon.borrow().clone();
        let (locking, id, previous) = (client.clone(), daemon.clone(), self.last_backend.get());
        let (pid, held) = self.run(async move {
            let pid: i32 = locking.query_one("SELECT pg_backend_pid()", &[]).await?.try_get(0)?;
            let Some(id) = id else {
                return Ok((pid, true));
            };
            for attempt in 0..20 {
                let held: bool = locking.query_one(DAEMON_LOCK, &[&id]).await?.try_get(0)?;
                if held {
                    return Ok((pid, true));
                }
                let Some(previous) = previous.filter(|_| attempt == 0) else {
                    if previous.is_none() {
                        return Ok((pid, false));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                // Only that backend, and only if it holds this very lock.
                locking
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks
                         WHERE pid = $1 AND locktype = 'advisory' AND classid = 73370026
                           AND objid::bigint = (hashtext(current_schema() || ':' || $2)::bigint & 4294967295)",
                        &[&previous, &id],
                    )
                    .await?;
            }
            Ok((pid, false))
        })?;
        if held {
            return Ok(pid);
        }
        Err(StoreError::InUse(format!(
            "another process runs daemon {} on it (a copy of this state directory?)",
            daemon.unwrap_or_default()
        )))
    }

    /// The statement for `sql`, prepared once per connection.
    fn prepared(&self, sql: &str) -> Result<(Arc<Client>, Statement), StoreError> {
        let client = self.client()?;
        if let Some(statement) = self
            .live
            .borrow()
            .as_ref()
            .and_then(|live| live.statements.get(sql))
        {
            return Ok((client, statement.clone()));
        }
        let text = dollar_parameters(sql);
        let preparing = client.clone();
        let statement = self.run(async move { preparing.prepare(&text).await })?;
        if let Some(live) = self.live.borrow_mut().as_mut() {
            live.statements.insert(sql.to_owned(), statement.clone());
        }
        Ok((client, statement))
    }

    /// Runs a call on the driver's runtime and waits for it, bounded.
    fn run<T, F>(&self, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, tokio_postgres::Error>> + Send + 'static,
    {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = answer.send(call.await);
        });
        match answered.recv_timeout(CALL_TIMEOUT) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                let error = StoreError::from(e);
                if error.is_retryable() {
                    self.lose();
                }
                Err(error)
            }
            Err(_) => {
                self.lose();
                Err(StoreError::Unavailable(format!(
                    "the database did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Drops the connection, asking the server to cancel what it still
    /// runs for it: the server then ends its session (and rolls back what
    /// it held); the next call connects again.
    fn lose(&self) {
        let Some(live) = self.live.borrow_mut().take() else {
            return;
        };
        let (token, tls) = (live.client.cancel_token(), self.tls.clone());
        self.handle.spawn(async move {
            let _ = match tls {
                None => token.cancel_query(NoTls).await,
                Some(tls) => token.cancel_query(tls).await,
            };
        });
    }
}

/// The channel on which a queued turn is announced (store::sql).
pub const TURNS_CHANNEL: &str = "substrat_turns";

/// Listens for queued turns on a connection of its own and calls `heard`
/// with each notification's payload (the daemon that runs the turn's
/// agent), until the connection ends: the caller listens again.
pub async fn listen_for_turns(url: &str, mut heard: impl FnMut(&str)) -> Result<(), StoreError> {
    let PgAddress { config, tls } = pg_address(url)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (client, driver) = match tls {
        None => {
            let (client, connection) = config.connect(NoTls).await?;
            (client, tokio::spawn(forward_notifications(connection, tx)))
        }
        Some(tls) => {
            let (client, connection) = config.connect(tls).await?;
            (client, tokio::spawn(forward_notifications(connection, tx)))
        }
    };
    client
        .batch_execute(&format!("LISTEN {TURNS_CHANNEL}"))
        .await?;
    while let Some(payload) = rx.recv().await {
        heard(&payload);
    }
    driver.abort();
    Ok(())
}

/// Polls the connection (which delivers notifications to whoever polls
/// it) and sends on each notification's payload, until it ends.
async fn forward_notifications<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                if tx.send(n.payload().to_owned()).is_err() {
                    return;
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!("the turns' notifications stopped: {e}");
                return;
            }
            None => return,
        }
    }
}

/// `?N` (SQLite's numbered parameter, the store's spelling) as `$N`. The
/// store's statements have no `?` inside quoted text.
pub(super) fn dollar_parameters(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

fn row_values(row: &tokio_postgres::Row) -> Result<Row, StoreError> {
    let mut values = Vec::with_capacity(row.len());
    for (index, column) in row.columns().iter().enumerate() {
        let read = |e: tokio_postgres::Error| StoreError::Column {
            index,
            why: e.to_string(),
        };
        let value = match *column.type_() {
            Type::INT8 => row
                .try_get::<_, Option<i64>>(index)
                .map_err(read)?
                .map(Value::Int),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(index)
                .map_err(read)?
                .map(|n| Value::Int(i64::from(n))),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(index)
                .map_err(read)?
                .map(|n| Value::Int(i64::from(n))),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(index)
                .map_err(read)?
                .map(|b| Value::Int(i64::from(b))),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => row
                .try_get::<_, Option<String>>(index)
                .map_err(read)?
                .map(Value::Text),
            ref other => {
                return Err(StoreError::Column {
                    index,
                    why: format!("a column of type {other}, which the store never reads"),
                });
            }
        };
        values.push(value.unwrap_or(Value::Null));
    }
    Ok(Row(values))
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match (self, ty) {
            (Value::Null, _) => Ok(IsNull::Yes),
            (Value::Int(n), &Type::INT8) => n.to_sql(ty, out),
            (Value::Int(n), &Type::INT4) => i32::try_from(*n)?.to_sql(ty, out),
            (Value::Int(n), &Type::INT2) => i16::try_from(*n)?.to_sql(ty, out),
            // PostgreSQL's text holds no NUL (SQLite's does): an agent's
            // NUL is kept as U+FFFD rather than failing its turn's record.
            (Value::Text(text), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME)
                if text.contains('\0') =>
            {
                text.replace('\0', "\u{FFFD}").as_str().to_sql(ty, out)
            }
            (Value::Text(text), &Type::TEXT | &Type::VARCHAR | &Type::BPCHAR | &Type::NAME) => {
                text.as_str().to_sql(ty, out)
            }
            (value, ty) => {
                Err(format!("{value:?} cannot be bound to a parameter of type {ty}").into())
            }
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::INT8
                | Type::INT4
                | Type::INT2
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
        )
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::dollar_parameters;

    #[test]
    fn numbered_parameters_are_spelled_for_postgres() {
        assert_eq!(
            dollar_parameters("UPDATE t SET a = ?2, b = ?10 WHERE id = ?1 AND c = 'x'"),
            "UPDATE t SET a = $2, b = $10 WHERE id = $1 AND c = 'x'"
        );
        assert_eq!(dollar_parameters("SELECT 1"), "SELECT 1");
    }
}
