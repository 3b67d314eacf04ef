//! Errors for the engine: always to stderr, and to `--log` when given, as
//! text or as runc's JSON lines (`{"level":"error","msg":...,"time":...}`),
//! which conmon and containerd's shim read back to say why a call failed.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use crate::argv::flag;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Clone)]
pub struct Logger {
    file: Option<PathBuf>,
    format: Format,
}

impl Logger {
    pub fn new(file: Option<PathBuf>, format: Format) -> Self {
        Self { file, format }
    }

    /// An error: to stderr, and to the log file.
    pub fn error(&self, message: &str) {
        eprintln!("substrat-oci: {message}");
        self.to_file("error", message);
    }

    /// An error another process wrote (the launcher's sandbox, on the
    /// stderr it was given): the log file only, as it was on stderr.
    pub fn relay(&self, message: &str) {
        self.to_file("error", message);
    }

    /// The same log for a launcher this program starts (`--log=PATH`,
    /// `--log-format=F`): what goes wrong after `create` or `exec`
    /// returned reaches the engine's log too.
    pub fn forward(&self) -> Vec<OsString> {
        let format = match self.format {
            Format::Text => "text",
            Format::Json => "json",
        };
        let mut args: Vec<OsString> = self.file.iter().map(|f| flag("--log", f)).collect();
        args.push(flag("--log-format", format));
        args
    }

    /// A panic also goes to the log file (the default hook still prints
    /// it): a launcher's stderr may lead nowhere.
    pub fn log_panics(&self) {
        let logger = self.clone();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            logger.to_file("error", &format!("panic: {info}"));
        }));
    }

    /// A note for the operator (where the runtime differs from what was asked): the log file only,
    /// since an engine may take anything on stderr for a failure.
    pub fn info(&self, message: &str) {
        self.to_file("info", message);
    }

    fn to_file(&self, level: &str, message: &str) {
        let Some(path) = &self.file else {
            return;
        };
        let line = match self.format {
            Format::Text => format!("substrat-oci: {level}: {message}\n"),
            Format::Json => {
                let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
                let object = serde_json::json!({"level": level, "msg": message, "time": time});
                format!("{object}\n")
            }
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Ok(mut file) = file {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
