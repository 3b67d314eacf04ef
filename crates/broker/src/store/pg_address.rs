//! A PostgreSQL address and how to reach it: the URL's connection
//! settings for tokio-postgres, and TLS in libpq's words.
//!
//! `sslmode=require`, `verify-ca` or `verify-full` with
//! `sslrootcert=FILE` (PEM): the connection is TLS, the server's
//! certificate is verified against FILE's certificates and its name
//! against the URL's host. All three are verified fully: a TLS connection
//! nobody verified protects nothing from whoever sits on the path, so it
//! is not offered. Without `sslrootcert` they are refused. `disable`,
//! `prefer` or none: plain (nothing could be verified without a CA, and
//! `prefer` falls back to plain for whoever refuses TLS).

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::Config;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::StoreError;

/// The most a CA file may hold.
const MAX_CA_FILE: u64 = 1 << 20;

/// How long connecting may take.
pub(super) const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) struct PgAddress {
    pub config: Config,
    /// None: plain.
    pub tls: Option<MakeRustlsConnect>,
}

/// Reads `url` (and the CA file it names). Errors never show the password.
pub(super) fn pg_address(url: &str) -> Result<PgAddress, StoreError> {
    let (rest, sslmode, root) = take_tls_settings(url)?;
    let mut config: Config = rest.parse().map_err(parse_error)?;
    config.connect_timeout(CONNECT_TIMEOUT);
    config.application_name("substrat-sandbox");
    // The server ends what the daemon stopped waiting for: a statement
    // past the daemon's own bound, a transaction left open by a lost
    // daemon; keepalives and the TCP timeout find a peer gone silent
    // (a partition) in seconds, not the kernel's two hours.
    // Below the daemon's own 5 s: the server gives up first, and says so.
    // The server's keepalives end a dead client's session (and free its
    // locks) in seconds too.
    let bounded = "-c statement_timeout=4000 -c lock_timeout=4000 -c idle_in_transaction_session_timeout=15000 \
                   -c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 -c tcp_user_timeout=15000";
    let options = match config.get_options() {
        Some(given) => format!("{given} {bounded}"),
        None => bounded.to_owned(),
    };
    config.options(options);
    config.keepalives(true);
    config.keepalives_idle(std::time::Duration::from_secs(5));
    config.keepalives_interval(std::time::Duration::from_secs(2));
    config.keepalives_retries(3);
    config.tcp_user_timeout(std::time::Duration::from_secs(15));
    let verified = matches!(
        sslmode.as_deref(),
        Some("require" | "verify-ca" | "verify-full")
    );
    let tls = match (verified, root) {
        (false, None) => {
            config.ssl_mode(SslMode::Disable);
            None
        }
        (false, Some(_)) => {
            return Err(StoreError::Address(
                "sslrootcert needs sslmode=verify-full (or require, verify-ca: all are verified fully)".into(),
            ));
        }
        (true, None) => {
            return Err(StoreError::Address(format!(
                "sslmode={}: give the CA that signed the server's certificate as sslrootcert=FILE (PEM)",
                sslmode.unwrap_or_default()
            )));
        }
        (true, Some(file)) => {
            config.ssl_mode(SslMode::Require);
            Some(connector(&file)?)
        }
    };
    Ok(PgAddress { config, tls })
}

/// tokio-postgres's parse error with its reason (its Display alone is
/// "invalid connection string"), but never a character of the URL: the
/// reason "unexpected character at byte N: expected `x` but got `c`"
/// could show one of the password's.
fn parse_error(e: tokio_postgres::Error) -> StoreError {
    use std::error::Error as _;
    let reason = match e.source().map(|s| s.to_string()) {
        Some(why) if why.starts_with("unexpected character") => {
            why.split(':').next().unwrap_or_default().to_owned()
        }
        Some(why) => why,
        None => return StoreError::Address(e.to_string()),
    };
    StoreError::Address(format!("{e}: {reason}"))
}

/// The URL without `sslmode` and `sslrootcert` (tokio-postgres knows
/// neither `verify-*` nor `sslrootcert`), and their values.
fn take_tls_settings(url: &str) -> Result<(String, Option<String>, Option<String>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None, None));
    };
    let (mut sslmode, mut root, mut kept) = (None, None, Vec::new());
    for pair in query.split('&') {
        let (raw_key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // Matched as tokio-postgres reads it (decoded): `ssl%6Dode` is
        // sslmode too, never passed through unchecked.
        let key = percent_encoding::percent_decode_str(raw_key)
            .decode_utf8()
            .map_err(|_| StoreError::Address("a parameter name that is not UTF-8".into()))?;
        let key = key.as_ref();
        let decoded = || {
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| StoreError::Address(format!("{key}: not UTF-8")))
        };
        match key {
            "sslmode" => sslmode = Some(decoded()?),
            "sslrootcert" => root = Some(decoded()?),
            _ => kept.push(pair),
        }
    }
    if let Some(mode) = &sslmode
        && !matches!(
            mode.as_str(),
            "disable" | "prefer" | "require" | "verify-ca" | "verify-full"
        )
    {
        return Err(StoreError::Address(format!(
            "sslmode={mode}: one of disable, prefer, require, verify-ca, verify-full"
        )));
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, sslmode, root))
}

/// rustls trusting the certificates of `file` alone.
fn connector(file: &str) -> Result<MakeRustlsConnect, StoreError> {
    let bad = |why: String| StoreError::Address(format!("sslrootcert {file}: {why}"));
    // A regular file of a sane size: a device or a pipe named here would
    // hang the start.
    let meta = std::fs::metadata(file).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_CA_FILE {
        return Err(bad(format!(
            "not a regular file of at most {MAX_CA_FILE} bytes"
        )));
    }
    let pem = std::fs::read(file).map_err(|e| bad(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_and_checked() {
        let (rest, mode, root) = take_tls_settings(
            "postgres://u@db.example/s?sslmode=verify-full&options=-cx%3Dy&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db.example/s?options=-cx%3Dy");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let plain = pg_address("postgres://u@db.example/s").unwrap();
        assert!(plain.tls.is_none());
        assert_eq!(plain.config.get_ssl_mode(), SslMode::Disable);
        for (url, says) in [
            ("postgres://u@h/s?sslmode=require", "give the CA"),
            ("postgres://u@h/s?sslmode=allow", "one of disable"),
            (
                "postgres://u@h/s?sslrootcert=/etc/hostname",
                "needs sslmode",
            ),
            (
                "postgres://u@h/s?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem",
            ),
            ("postgres://u@h/s?ssl%6Dode=require", "give the CA"),
            (
                "postgres://u@h/s?sslmode=verify-full&sslrootcert=/etc/hostname",
                "no certificate",
            ),
            (
                "postgres://u@h/s?sslmode=verify-full&sslrootcert=/dev/zero",
                "not a regular file",
            ),
            // The parser's reason, never a character of the URL.
            (
                "postgres://u@h/s?port=54x2",
                "invalid connection string: invalid value for option `port`",
            ),
            ("postgres://u@h/s?colour=blue", "unknown option `colour`"),
            (
                "Removed stale pid file.\npostgres://u:p@h/s",
                "invalid connection string: unexpected character at byte 8",
            ),
        ] {
            let error = pg_address(url)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("got"), "{url}: {error}");
        }
    }
}
