//! Errors for the engine: always to stderr, and to `--log` when given, as
//! text or as runc's JSON lines (`{"level":"error","msg":...,"time":...}`),
//! which conmon and containerd's shim read back to say why a call failed.

use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug)]
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
