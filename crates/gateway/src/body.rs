//! A request's body, taken off the agent's connection into an unlinked
//! file (`O_TMPFILE`), bounded in size and in time, then read from there:
//! once by `request::skim`, once as the stream sent upstream. So however
//! many requests an agent sends, the daemon holds no body in memory.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// The largest request body forwarded (a CLI replays its whole history).
pub const MAX_REQUEST: u64 = 32 << 20;
/// The longest wait for the next part of a body.
pub const BODY_IDLE: Duration = Duration::from_secs(10);
/// The longest a whole body may take to arrive.
pub const BODY_DEADLINE: Duration = Duration::from_secs(60);
/// How much of the spool is read at once when it is sent on.
const CHUNK: usize = 64 << 10;

/// Where bodies are spooled, and their bounds.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub idle: Duration,
    pub deadline: Duration,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            dir: std::env::temp_dir(),
            max_bytes: MAX_REQUEST,
            idle: BODY_IDLE,
            deadline: BODY_DEADLINE,
        }
    }
}

/// Why a body was not taken.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is over {0} bytes")]
    TooLarge(u64),
    #[error("the request body stalled (nothing for {0:?})")]
    Stalled(Duration),
    #[error("the request body took longer than {0:?}")]
    TooSlow(Duration),
    #[error("the request body was cut: {0}")]
    Cut(String),
    #[error("the gateway cannot spool a request body in {dir}: {source}")]
    Spool {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A body in its file.
#[derive(Debug)]
pub struct Spooled {
    file: std::fs::File,
    len: u64,
}

/// Takes `body` into a new unlinked file in `config.dir`.
pub async fn spool(body: Incoming, config: &SpoolConfig) -> Result<Spooled, BodyError> {
    let spool_error = |source| BodyError::Spool {
        dir: config.dir.clone(),
        source,
    };
    let file = tempfile::tempfile_in(&config.dir).map_err(spool_error)?;
    match tokio::time::timeout(config.deadline, fill(body, file, config)).await {
        Ok(result) => result,
        Err(_) => Err(BodyError::TooSlow(config.deadline)),
    }
}

async fn fill(
    mut body: Incoming,
    file: std::fs::File,
    config: &SpoolConfig,
) -> Result<Spooled, BodyError> {
    let mut writer = std::io::BufWriter::with_capacity(CHUNK, file);
    let mut len = 0u64;
    let write_error = |source| BodyError::Spool {
        dir: config.dir.clone(),
        source,
    };
    loop {
        let frame = match tokio::time::timeout(config.idle, body.frame()).await {
            Err(_) => return Err(BodyError::Stalled(config.idle)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Cut(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: not forwarded
        };
        len = len.saturating_add(data.len() as u64);
        if len > config.max_bytes {
            return Err(BodyError::TooLarge(config.max_bytes));
        }
        // Into the page cache: a write of at most a frame, not a wait on
        // the agent.
        writer.write_all(&data).map_err(write_error)?;
    }
    let mut file = writer
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?;
    file.rewind().map_err(write_error)?;
    Ok(Spooled { file, len })
}

impl Spooled {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A reader of the whole body from its start (each call starts over).
    pub fn reader(&self) -> std::io::Result<impl std::io::BufRead + use<>> {
        let mut file = self.file.try_clone()?;
        file.rewind()?;
        Ok(std::io::BufReader::with_capacity(CHUNK, file))
    }

    /// The body as a stream of chunks, read from the file as the upstream
    /// takes them.
    pub fn into_stream(
        self,
    ) -> std::io::Result<impl Stream<Item = std::io::Result<Bytes>> + Send + 'static> {
        let mut file = self.file;
        file.rewind()?;
        let file = Some(tokio::fs::File::from_std(file));
        Ok(futures_util::stream::unfold(file, |file| async move {
            use tokio::io::AsyncReadExt;
            let mut file = file?;
            let mut chunk = vec![0u8; CHUNK];
            match file.read(&mut chunk).await {
                Ok(0) => None,
                Ok(n) => {
                    chunk.truncate(n);
                    Some((Ok(Bytes::from(chunk)), Some(file)))
                }
                Err(e) => Some((Err(e), None)),
            }
        }))
    }
}

/// Whether `dir` can hold spooled bodies (checked when the gateway is made,
/// so a bad directory is an error at the start, not on every request).
pub fn check_dir(dir: &Path) -> std::io::Result<()> {
    let mut probe = tempfile::tempfile_in(dir)?;
    probe.write_all(b"x")?;
    probe.rewind()?;
    probe.read_exact(&mut [0u8; 1])
}
